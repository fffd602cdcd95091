"""Independent trainer and rollout jobs (``examples/grpo_trainer_job.py``, ``examples/grpo_rollout_job.py``):
the ``--run`` / ``--redis`` command line, the job plan, records built from scored groups with fixed ids and
a producer, the per-producer step summary, and the one launch that starts both (``run_jobs_local.sh``).

The end-to-end check (a trainer job and rollout jobs as separate process trees, one SIGKILLed and
replaced mid-run, against a real redis-server) is in ``test_grpo_learning.py``: it trains from the
quickstart's SFT model and must reach the same learning bar as the colocated run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

import cosmos_primitives as cp
from cosmos_primitives.checkpoint import PREEMPTED_EXIT_CODE, find_latest_checkpoint
from cosmos_primitives.config import GRPOConfig, run_stream
from cosmos_primitives.data.records import Completion, Prompt, RolloutGroup
from cosmos_primitives.queue import RedisRolloutQueue, decode_record, encode_record, records_from_scores
from cosmos_primitives.queue.disaggregated_plan import plan_jobs
from cosmos_primitives.queue.record_metrics import (
    ProducerShare,
    format_shares,
    producer_shares,
    provenance,
    record_metrics,
    share_metrics,
)
from cosmos_primitives.sync.run_auth import RunSecret
from cosmos_primitives.testing.forked_script import run_script
from cosmos_primitives.testing.recipe_runs import finish, kill_tree, kill_when, launch_recipe, only_run_dir

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "configs" / "grpo_tiny_jobs.toml"


@pytest.fixture(autouse=True)
def _run_secret(monkeypatch):
    """The jobs read the run secret from the environment (the launched processes inherit it)."""
    monkeypatch.setenv("COSMOS_RUN_SECRET", "jobs-test-run-secret-" + "0" * 32)


def test_run_names_give_the_runs_stream_and_bad_names_are_refused() -> None:
    assert run_stream("grpo_7b-a.1") == "cosmos:grpo_7b-a.1"
    for bad in ("", "two words", "a:b", "tab\there"):
        with pytest.raises(ValueError, match="run name"):
            run_stream(bad)


def test_job_command_line_sets_the_stream_and_url() -> None:
    cfg, path = cp.config.load_recipe_config(None, jobs=True, argv=[
        "--config", str(CONFIG), "--run", "r1", "--redis", "redis://10.0.0.5:6379/2", "grpo.kl_beta=0.01"])
    assert (cfg.redis.stream, cfg.redis.url, cfg.grpo.kl_beta, path) == (
        "cosmos:r1", "redis://10.0.0.5:6379/2", 0.01, str(CONFIG))
    with pytest.raises(SystemExit):  # --run is required: two runs must never share keys by accident
        cp.config.load_recipe_config(None, jobs=True, argv=["--config", str(CONFIG)])


def test_job_plan_splits_records_over_the_trainer_ranks_without_a_capacity_check() -> None:
    cfg = cp.load_config(CONFIG, ["redis.max_pending=1"])  # far too small for the one-job recipe's check
    assert plan_jobs(cfg, 2) == (16, 8, 8)
    cfg = cp.load_config(CONFIG, ["disaggregated.records_per_step=12", "disaggregated.prompts_per_rollout=4"])
    assert plan_jobs(cfg, 3) == (12, 4, 4)
    with pytest.raises(ValueError, match=r"records_per_step = 12 must be a multiple of the 5 trainer ranks"):
        plan_jobs(cfg, 5)


def groups_of(answers: list[list[str]], version: int = 3) -> list[RolloutGroup]:
    groups = []
    for i, texts in enumerate(answers):
        prompt = Prompt(conversation=[{"role": "user", "content": f"question {i}"}], prompt_id=f"q{i}", reference="B")
        completions = [Completion(t, [7 + j], [-0.5], "stop") for j, t in enumerate(texts)]
        groups.append(RolloutGroup(prompt=prompt, prompt_token_ids=[1, 2, 3], completions=completions,
                                   weight_version=version))
    return groups


def test_records_from_scores_keep_ids_producer_and_reward_means_and_skip_dropped_groups() -> None:
    grpo = GRPOConfig(num_samples_per_prompt=2, reward_function={"single_choice": 1.0}, dynamic_sampling=True)
    groups = groups_of([["<answer>B</answer>", "<answer>C</answer>"],   # mixed rewards: kept
                        ["<answer>C</answer>", "<answer>D</answer>"],   # all wrong: dynamic sampling drops it
                        ["<answer>B</answer>", "<answer>B</answer>"]])  # all right: dropped
    scored = cp.rewards.score_groups(groups, cp.rewards.RewardSet.from_config(grpo), grpo, max_response_length=8)
    records = records_from_scores(groups, scored, ["single_choice"], record_ids=["e0-i4", "e0-i9", "e0-i2"],
                                  meta={"producer": "rollout-x"})
    assert [r.record_id for r in records] == ["e0-i4"]
    (record,) = records
    assert record.rewards == [1.0, 0.0] and record.weight_version == 3
    assert record.meta == {"reward/single_choice": 0.5, "producer": "rollout-x", "reference": "B"}
    assert decode_record(encode_record(record)) == record
    with pytest.raises(ValueError, match="2 record ids for 3 groups"):
        records_from_scores(groups, scored, ["single_choice"], record_ids=["a", "b"])
    # without dynamic sampling every group is put, each with a fresh id
    plain = GRPOConfig(num_samples_per_prompt=2, reward_function={"single_choice": 1.0})
    scored = cp.rewards.score_groups(groups, cp.rewards.RewardSet.from_config(plain), plain, max_response_length=8)
    records = records_from_scores(groups, scored, ["single_choice"])
    assert len({r.record_id for r in records}) == 3 and [r.meta["reward/single_choice"] for r in records] == [0.5, 0, 1]


def test_step_summary_per_producer_with_versions_and_lag() -> None:
    grpo = GRPOConfig(num_samples_per_prompt=2, reward_function={"single_choice": 1.0})
    records = []
    for producer, version, texts in [("rollout-b", 4, ["<answer>B</answer>"] * 2), ("rollout-a", 3, ["x", "y"]),
                                     ("rollout-b", 5, ["<answer>B</answer>", "z"])]:
        groups = groups_of([texts], version=version)
        scored = cp.rewards.score_groups(groups, cp.rewards.RewardSet.from_config(grpo), grpo, max_response_length=8)
        records += records_from_scores(groups, scored, ["single_choice"], meta={"producer": producer})
    shares = producer_shares([provenance(r) for r in records], trainer_step=5)
    assert shares == [ProducerShare("rollout-a", 1, 3, 3, 2), ProducerShare("rollout-b", 2, 4, 5, 1)]
    assert format_shares(shares) == "rollout-a 1 (v3, lag <= 2), rollout-b 2 (v4-5, lag <= 1)"
    assert share_metrics(shares) == {"rollout/producers": 2.0, "rollout/max_lag": 2.0}
    metrics = record_metrics(records, ["single_choice"])
    assert metrics["reward/mean"] == pytest.approx(3 / 6) and metrics["reward/single_choice"] == pytest.approx(0.5)
    assert metrics["rollout/weight_version"] == pytest.approx(4.0)
    unknown = records[0].meta.pop("producer")
    assert unknown == "rollout-b" and provenance(records[0])[1] == "unknown"


def test_trainer_job_refuses_a_private_redis_server(tmp_path: Path) -> None:
    proc = run_script(["examples/grpo_trainer_job.py", "--config", CONFIG, "--run", "x",
                       "disaggregated.start_local_redis=true", f"train.output_dir={tmp_path}"], tmp_path / "run.log",
                      cwd=REPO, timeout_s=120)
    assert proc.returncode != 0
    assert "independent jobs need a Redis every job can reach" in proc.stdout, proc.stdout[-2000:]


@pytest.mark.parametrize("script", ["grpo_trainer_job.py", "grpo_rollout_job.py"])
def test_jobs_refuse_to_start_without_the_run_secret(script: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSMOS_RUN_SECRET")}
    proc = run_script([f"examples/{script}", "--config", CONFIG, "--run", "x", "--redis", "redis://127.0.0.1:1/0",
                       f"train.output_dir={tmp_path}"], tmp_path / "run.log", cwd=REPO, env=env, timeout_s=120)
    assert proc.returncode != 0
    assert "no run secret: set $COSMOS_RUN_SECRET" in proc.stdout, proc.stdout[-2000:]


def test_launch_scripts_keep_redis_private_and_secrets_off_command_lines() -> None:
    """The Slurm Redis has a password (read from stdin) and listens on its node's address, not on every
    interface without protection; no script passes the Redis URL (with its password) or a secret as an
    argument."""
    redis_job = (REPO / "examples" / "slurm" / "redis.sbatch").read_text()
    assert "0.0.0.0" not in redis_job and "--protected-mode no" not in redis_job
    assert "requirepass" in redis_job and "redis-server -" in redis_job and "--protected-mode yes" in redis_job
    for script in ["run_jobs_local.sh", "slurm/trainer.sbatch", "slurm/rollout.sbatch", "slurm/redis.sbatch"]:
        text = (REPO / "examples" / script).read_text()
        assert "--redis" not in text.replace("# ", "#"), script
        assert "--requirepass" not in text and "SECRET=" not in text.replace("COSMOS_RUN_SECRET=${", ""), script


FAKE_PYTHON = """#!/usr/bin/env bash
# the launcher's own one-liners (-c) and the status command run for real; a job prints what it was given
if [ "$1" = "-c" ] || [ "$2" = "cosmos_primitives.queue.status" ]; then exec {python} "$@"; fi
echo "CUDA_VISIBLE_DEVICES=${{CUDA_VISIBLE_DEVICES:-}} ARGS=$*"
"""


def _launch(tmp_path: Path, args: list[str], **env: str) -> subprocess.CompletedProcess:
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON.format(python=sys.executable))
    fake.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake), "LOGS": str(tmp_path / "logs"), "RUN": "launch", **env}
    return subprocess.run(["bash", "examples/run_jobs_local.sh", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


def test_one_launch_gives_each_job_its_gpus(tmp_path: Path) -> None:
    """The single-allocation case: one launch, one config; TRAINER_GPUS go to one torchrun of the trainer job,
    each ROLLOUT_GPUS entry to one rollout job (a redis-server is started and stopped for real)."""
    proc = _launch(tmp_path, ["train.max_steps=3"], TRAINER_GPUS="0,1", ROLLOUT_GPUS="2 3,4")
    assert proc.returncode == 0, proc.stderr
    trainer = (tmp_path / "logs" / "trainer.log").read_text()
    assert "CUDA_VISIBLE_DEVICES=0,1 ARGS=-m torch.distributed.run --standalone --nproc_per_node 2 " \
           "examples/grpo_trainer_job.py --config examples/configs/grpo_tiny_jobs.toml --run-name launch " \
           "train.max_steps=3" in trainer, trainer
    rollouts = sorted((tmp_path / "logs").glob("rollout_*.log"))
    assert [p.name for p in rollouts] == ["rollout_1.log", "rollout_2.log"]
    assert "CUDA_VISIBLE_DEVICES=2 ARGS=-m torch.distributed.run --standalone --nproc_per_node 1 " \
           "examples/grpo_rollout_job.py" in rollouts[0].read_text()
    assert "CUDA_VISIBLE_DEVICES=3,4 ARGS=-m torch.distributed.run --standalone --nproc_per_node 2 " \
           "examples/grpo_rollout_job.py" in rollouts[1].read_text()
    # without GPUs: N rollout jobs on whatever they see, plain python, the same run name and overrides
    proc = _launch(tmp_path, ["3", "train.max_steps=3"], LOGS=str(tmp_path / "cpu"))
    assert proc.returncode == 0, proc.stderr
    assert len(list((tmp_path / "cpu").glob("rollout_*.log"))) == 3
    assert "ARGS=examples/grpo_trainer_job.py --config examples/configs/grpo_tiny_jobs.toml --run launch " \
           "train.max_steps=3" in (tmp_path / "cpu" / "trainer.log").read_text()
    # a count that disagrees with the GPU list is refused, naming both
    proc = _launch(tmp_path, ["3"], LOGS=str(tmp_path / "bad"), ROLLOUT_GPUS="1 2")
    assert proc.returncode == 2 and "N=3 but ROLLOUT_GPUS=\"1 2\" names 2 rollout jobs" in proc.stderr


@pytest.mark.slow
def test_one_launch_runs_both_jobs_to_the_end(grpo_assets, tmp_path: Path) -> None:
    """``run_jobs_local.sh 1`` for real (private redis-server, trainer job, one rollout job): 3 steps trained
    from the rollout job's records, the rollout job stopped by the trainer, the launch exits 0."""
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "LOGS": str(tmp_path / "logs"), "RUN": "one_launch",
           "COSMOS_REDIS_URL": ""}
    overrides = [*grpo_assets(CONFIG), "grpo.rollout_batch_size=2", "grpo.num_samples_per_prompt=4",
                 "rollout.max_response_length=8", "train.max_steps=3", "train.ckpt.export_safetensors=false",
                 f"train.output_dir={out}"]
    proc = subprocess.run(["bash", "examples/run_jobs_local.sh", "1", *overrides], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = only_run_dir(out)
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == [1, 2, 3]
    rollout_log = (tmp_path / "logs" / "rollout_1.log").read_text(errors="replace")
    producer = job_id_in(tmp_path / "logs" / "rollout_1.log")
    assert {r["producer"] for r in read_jsonl(run_dir / "records.jsonl")} == {producer}
    assert "stopping (trainer finished at step 3)" in rollout_log


@pytest.mark.slow
def test_a_fresh_trainer_job_refuses_a_run_held_by_a_live_trainer_and_force_clears_it(
        grpo_assets, redis_url: str, tmp_path: Path) -> None:
    """Issue 30 item 5: a second trainer job with the same run name used to clear the keys of the live run."""
    import redis

    from cosmos_primitives.queue import JobRegistry

    stream = run_stream("held")
    client = redis.Redis.from_url(redis_url)
    client.set(f"{stream}:weight_version", 7)  # the live run's state, which a fresh start would delete
    registry = JobRegistry(redis_url, stream, ttl_s=60)
    live = registry.join("trainer", job_id="trainer-live", ranks=1)
    args = ["--run-name", "held", "--redis", redis_url, *grpo_assets(CONFIG), f"train.output_dir={tmp_path}"]

    def launch(extra: list[str], log: Path) -> subprocess.Popen:
        return launch_recipe(REPO / "examples" / "grpo_trainer_job.py", CONFIG, [*extra, *args], log, cwd=REPO,
                             new_session=True)

    def wait_for(proc: subprocess.Popen, done, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None and not done() and time.monotonic() < deadline:
            time.sleep(0.2)

    refused = launch([], tmp_path / "refused.log")
    try:
        wait_for(refused, lambda: client.get(f"{stream}:weight_version") is None)
        assert client.get(f"{stream}:weight_version") == b"7"  # nothing was cleared
        refused.wait(timeout=60)
        text = (tmp_path / "refused.log").read_text(errors="replace")
        assert refused.returncode != 0, text[-3000:]
        assert f"run '{stream}' is held by the live trainer job {live}" in text and "--force" in text, text[-3000:]
    finally:
        kill_tree(refused)
    forced = launch(["--force"], tmp_path / "forced.log")
    try:
        wait_for(forced, lambda: client.get(f"{stream}:weight_version") in (None, b"0"))
        assert client.get(f"{stream}:weight_version") in (None, b"0"), (tmp_path / "forced.log").read_text()[-3000:]
        assert "--force: taking run" in (tmp_path / "forced.log").read_text(errors="replace")
    finally:
        kill_tree(forced)
        registry.close()
        client.close()


@pytest.mark.parametrize("script", ["run_jobs_local.sh", "slurm/submit.sh", "slurm/common.sh", "slurm/redis.sbatch",
                                    "slurm/trainer.sbatch", "slurm/rollout.sbatch"])
def test_launch_scripts_parse_and_name_the_job_entry_points(script: str) -> None:
    # bash -n is all that can run here (no Slurm); it catches a broken script, and the entry points it names must exist
    path = REPO / "examples" / script
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    for entry in ("grpo_trainer_job.py", "grpo_rollout_job.py"):
        if entry in path.read_text():
            assert (REPO / "examples" / entry).is_file()


# -- the end-to-end scenario (run by test_grpo_learning.py from the quickstart's SFT model) ----------


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def job_id_in(log: Path) -> str | None:
    """The job id a rollout job logged once it had loaded weights (None before that)."""
    match = re.search(r"\[rollout\] (\S+): loaded weight version", log.read_text(errors="replace")) \
        if log.is_file() else None
    return match.group(1) if match else None


@pytest.mark.slow
def test_a_preempted_trainer_job_saves_and_its_restart_finishes_the_run(grpo_assets, redis_url: str,
                                                                         tmp_path: Path) -> None:
    """A real SIGTERM to the trainer job once step 1 is logged: it saves the step in progress (no
    scheduled save) with the prompt claims' position and exits 75 without stopping the run; the
    rollout job waits, and the trainer restarted with ``train.resume=true`` goes on from that
    checkpoint to the last step, which stops the rollout job."""
    small = ["grpo.rollout_batch_size=2", "grpo.num_samples_per_prompt=4", "rollout.max_response_length=8",
             "train.max_steps=3", "train.optm_warmup_steps=0", "train.ckpt.enable_checkpoint=true",
             "train.ckpt.save_freq=100", "train.ckpt.export_safetensors=false"]
    common = ["--run", "preempted", "--redis", redis_url, *grpo_assets(CONFIG), *small]
    trainer_args = [*common, f"train.output_dir={tmp_path / 'trainer'}"]
    logs = tmp_path / "logs"
    logs.mkdir()
    rollout = launch_recipe(REPO / "examples" / "grpo_rollout_job.py", CONFIG, common, logs / "rollout.log", cwd=REPO,
                            new_session=True)
    procs = [rollout]
    try:
        trainer = launch_recipe(REPO / "examples" / "grpo_trainer_job.py", CONFIG, trainer_args, logs / "trainer.log",
                                cwd=REPO, new_session=True)
        procs.append(trainer)
        kill_when(trainer, lambda: any(read_jsonl(p) for p in (tmp_path / "trainer").glob("*/metrics.jsonl")),
                  logs / "trainer.log", "step 1 was logged", sig=signal.SIGTERM)
        assert trainer.returncode == PREEMPTED_EXIT_CODE, (logs / "trainer.log").read_text()[-3000:]
        run_dir = only_run_dir(tmp_path / "trainer")
        stopped = len(read_jsonl(run_dir / "metrics.jsonl"))
        assert find_latest_checkpoint(run_dir) == run_dir / "checkpoints" / f"step_{stopped}"
        assert rollout.poll() is None  # the run goes on: no stop flag was set

        restarted = launch_recipe(REPO / "examples" / "grpo_trainer_job.py", CONFIG,
                                  [*trainer_args, "train.resume=true"], logs / "restarted.log", cwd=REPO,
                                  new_session=True)
        procs.append(restarted)
        text = finish(restarted, logs / "restarted.log", timeout_s=600)
        assert f"Resumed from {run_dir / 'checkpoints' / f'step_{stopped}'} (step {stopped}," in text
        assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == [*range(1, stopped + 1),
                                                                              *range(stopped + 1, 4)]
        finish(rollout, logs / "rollout.log", timeout_s=120)
        assert "stopping (trainer finished at step 3)" in (logs / "rollout.log").read_text(errors="replace")
    finally:
        for proc in procs:
            if proc.poll() is None:
                kill_tree(proc)


@pytest.mark.slow
def test_every_prompt_of_the_epoch_is_trained_once_across_trainer_rollout_and_redis_kills(grpo_assets,
                                                                                            tmp_path: Path) -> None:
    """Issue 30 item 6, end to end: independent jobs against a redis-server with AOF (``appendfsync
    always``). Once the trainer has trained a step after its last checkpoint, the trainer and the rollout
    job are SIGKILLed and so is the redis-server (restarted on the same port and data); a new rollout
    job starts and the trainer resumes from its checkpoint. Every prompt of epoch 0 (16 prompts, 8 steps
    of 2) must be trained exactly once in the final records.jsonl, or be dead-lettered with a reason; no
    record id is trained twice. Before the fix the records trained after the checkpoint stayed marked
    trained, and the records made by the lost weights were dropped as "future": their prompts never came
    back."""
    import redis

    from cosmos_primitives.queue import RedisServer

    server = RedisServer(data_dir=tmp_path / "redis").start()  # the shipped settings: AOF, fsync always
    small = ["grpo.rollout_batch_size=2", "grpo.num_samples_per_prompt=2", "rollout.max_response_length=4",
             "train.max_steps=12", "train.optm_warmup_steps=0", "train.ckpt.enable_checkpoint=true",
             "train.ckpt.save_freq=2", "train.ckpt.export_safetensors=false", "disaggregated.claim_ttl_s=6",
             "redis.claim_idle_s=4", "grpo.allowed_outdated_steps=1",
             "disaggregated.heartbeat_ttl_s=4"]  # the resumed trainer waits for the killed one's key to expire
    common = ["--run-name", "chaos", "--redis", server.url, *grpo_assets(CONFIG), *small]
    trainer_args = [*common, f"train.output_dir={tmp_path / 'trainer'}"]
    logs = tmp_path / "logs"
    logs.mkdir()
    rollout_script = REPO / "examples" / "grpo_rollout_job.py"
    trainer_script = REPO / "examples" / "grpo_trainer_job.py"
    a = launch_recipe(rollout_script, CONFIG, common, logs / "rollout_a.log", cwd=REPO, new_session=True)
    trainer = launch_recipe(trainer_script, CONFIG, trainer_args, logs / "trainer.log", cwd=REPO, new_session=True)
    procs = [a, trainer]
    client = redis.Redis.from_url(server.url, retry_on_error=[redis.exceptions.ConnectionError])
    try:
        def trained_rows() -> list[dict]:
            return [row for path in (tmp_path / "trainer").glob("*/records.jsonl") for row in read_jsonl(path)]

        def saved_steps() -> list[int]:  # complete checkpoints only (an async save lands a little later)
            names = [p.parent.name.removeprefix("step_")  # not step_<n>.tmp: a save being written
                     for p in (tmp_path / "trainer").glob("*/checkpoints/step_*/COMPLETE")]
            return [int(name) for name in names if name.isdigit()]

        def past_a_checkpoint() -> bool:  # a step trained after the last complete save: its training is lost
            steps = {row["step"] for row in trained_rows()}
            saved = saved_steps()
            return bool(steps) and bool(saved) and max(steps) > max(saved) >= 2

        deadline = time.monotonic() + 300
        while not past_a_checkpoint():
            assert trainer.poll() is None and a.poll() is None, (logs / "trainer.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the trainer never trained 3 steps"
            time.sleep(0.05)
        kill_tree(trainer)
        killed_at = max(row["step"] for row in trained_rows())
        kill_tree(a)
        os.kill(server.pid, signal.SIGKILL)
        time.sleep(0.3)
        server.restart()
        c = launch_recipe(rollout_script, CONFIG, common, logs / "rollout_c.log", cwd=REPO, new_session=True)
        resumed = launch_recipe(trainer_script, CONFIG, [*trainer_args, "train.resume=true"], logs / "resumed.log",
                                cwd=REPO, new_session=True)
        procs += [c, resumed]
        text = finish(resumed, logs / "resumed.log", timeout_s=600)
        checkpoint = int(re.search(r"Resumed from \S+ \(step (\d+),", text).group(1))
        assert checkpoint < killed_at  # steps were lost with the trainer
        finish(c, logs / "rollout_c.log", timeout_s=120)

        rows = trained_rows()
        assert sorted({row["step"] for row in rows}) == list(range(1, 13))
        ids = [row["record_id"] for row in rows]
        assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)  # none trained twice
        dead = {fields.get(b"record_id", b"").decode(): fields[b"reason"].decode()
                for _, fields in client.xrange(f"{run_stream('chaos')}:dead")}
        assert all(dead.values())
        epoch0 = {f"e0-i{i}" for i in range(16)}
        lost = epoch0 - set(ids) - set(dead)
        assert not lost, f"prompts of epoch 0 neither trained nor dead-lettered: {sorted(lost)}"
        assert not (set(ids) & set(dead))
        assert re.search(rf"rolled back \d+ records trained after checkpoint step {checkpoint}", text), text[-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                kill_tree(proc)
        client.close()
        server.close()


@pytest.mark.slow
def test_a_lora_trainer_of_two_ranks_checkpoints_and_resumes_with_the_queue_kept(grpo_assets, redis_url: str,
                                                                                tmp_path: Path) -> None:
    """Ported from the one-job recipe's tests: a trainer job of two ranks with a LoRA policy saves a
    checkpoint every step among its ranks and finishes at step 2 (its rollout job stops); restarted with
    ``train.resume=true`` and ``max_steps=3`` it keeps the queue and the prompt claims, and a new rollout
    job, started first with the same overrides as one launch starts it, waits out the finished run's stop flag
    and starts from the resumed (merged) weights, version 2, not from the SFT model's 0."""
    small = ["grpo.rollout_batch_size=2", "grpo.num_samples_per_prompt=4", "rollout.max_response_length=8",
             "train.optm_warmup_steps=0", "train.ckpt.enable_checkpoint=true", "train.ckpt.save_freq=1",
             "train.ckpt.export_safetensors=false", "policy.lora={r = 4, lora_alpha = 8.0}",
             "disaggregated.heartbeat_ttl_s=4", "disaggregated.get_timeout_s=120"]
    common = ["--run-name", "lora_resume", "--redis", redis_url, *grpo_assets(CONFIG), *small]
    trainer_args = [*common, f"train.output_dir={tmp_path / 'trainer'}"]
    logs = tmp_path / "logs"
    logs.mkdir()
    trainer_script = REPO / "examples" / "grpo_trainer_job.py"
    rollout_script = REPO / "examples" / "grpo_rollout_job.py"
    first = launch_recipe(trainer_script, CONFIG, [*trainer_args, "train.max_steps=2"], logs / "first.log", cwd=REPO,
                          nproc=2, new_session=True)
    rollout = launch_recipe(rollout_script, CONFIG, common, logs / "rollout_1.log", cwd=REPO, new_session=True)
    procs = [first, rollout]
    try:
        finish(first, logs / "first.log", timeout_s=600)
        finish(rollout, logs / "rollout_1.log", timeout_s=120)
        run_dir = only_run_dir(tmp_path / "trainer")
        assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_1", "step_2"]
        first_ids = {r["record_id"] for r in read_jsonl(run_dir / "records.jsonl")}

        resume = ["train.max_steps=3", "train.resume=true"]
        second = launch_recipe(rollout_script, CONFIG, [*common, *resume], logs / "rollout_2.log", cwd=REPO,
                               new_session=True)
        procs.append(second)
        deadline = time.monotonic() + 300
        while "waiting for the resumed trainer" not in (logs / "rollout_2.log").read_text(errors="replace"):
            assert second.poll() is None, (logs / "rollout_2.log").read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "the rollout job never reached the stop flag"
            time.sleep(0.2)
        restarted = launch_recipe(trainer_script, CONFIG, [*trainer_args, *resume], logs / "restarted.log", cwd=REPO,
                                  nproc=2, new_session=True)
        procs.append(restarted)
        text = finish(restarted, logs / "restarted.log", timeout_s=600)
        assert f"Resumed from {run_dir / 'checkpoints' / 'step_2'} (step 2," in text, text[-3000:]
        assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == [1, 2, 3]
        assert (run_dir / "checkpoints" / "step_3").is_dir()
        finish(second, logs / "rollout_2.log", timeout_s=120)
        rollout_log = (logs / "rollout_2.log").read_text(errors="replace")
        # the queue and the claims were kept: step 3 trained prompts the first run had not
        step3 = [r for r in read_jsonl(run_dir / "records.jsonl") if r["step"] == 3]
        assert step3 and not {r["record_id"] for r in step3} & first_ids
        loaded = re.search(r"loaded weight version (\d+)", rollout_log)
        if loaded is None:
            # A race the run may take (seen on a loaded machine): the first job's queued records were
            # enough for step 3, and the trainer finished before this job fetched any weights.
            assert "finished before this job had weights" in rollout_log, rollout_log[-3000:]
            assert {r["producer"] for r in step3} == {job_id_in(logs / "rollout_1.log")}
        else:
            assert int(loaded.group(1)) >= 2, rollout_log[-3000:]
            assert "stopping (trainer finished at step 3)" in rollout_log
    finally:
        for proc in procs:
            if proc.poll() is None:
                kill_tree(proc)


def run_job_pair_reading_records(common: list[str], tmp_path: Path, redis_url: str, run: str, secret: str, *,
                                 until_rollout_exits: bool = False) -> tuple[dict, Path]:
    """A rollout job and a trainer job of ``CONFIG`` with the arguments ``common`` (the trainer writes under
    ``tmp_path / "trainer"``), each record read off run ``run``'s stream while it waits to be trained
    (verified with ``secret``), until the trainer exits (or both jobs do, ``until_rollout_exits``: the
    last records outlive the trainer). Returns ``({entry id: RolloutRecord}, logs folder)``; an
    AssertionError with the rollout job's log when that job fails."""
    logs = tmp_path / "logs"
    logs.mkdir()
    rollout = launch_recipe(REPO / "examples" / "grpo_rollout_job.py", CONFIG, common, logs / "rollout.log",
                            cwd=REPO, new_session=True)
    trainer = launch_recipe(REPO / "examples" / "grpo_trainer_job.py", CONFIG,
                            [*common, f"train.output_dir={tmp_path / 'trainer'}"], logs / "trainer.log", cwd=REPO,
                            new_session=True)
    client = redis.Redis.from_url(redis_url)
    cfg, _ = cp.config.load_recipe_config(None, jobs=True, argv=["--config", str(CONFIG), *common])
    queue = RedisRolloutQueue(cfg.redis, url=redis_url, secret=RunSecret(secret))
    seen = {}
    try:
        deadline = time.monotonic() + 600
        alive = True
        while alive and time.monotonic() < deadline:  # records live until they are trained
            alive = trainer.poll() is None or (until_rollout_exits and rollout.poll() is None)
            if rollout.poll() not in (None, 0):  # a failed rollout job would leave the trainer waiting
                raise AssertionError((logs / "rollout.log").read_text(errors="replace")[-4000:])
            for entry_id, fields in client.xrange(run_stream(run)):
                if entry_id not in seen and b"record" in fields:
                    seen[entry_id] = decode_record(queue._verified(fields[b"record"], entry_id.decode()))
            time.sleep(0.05)
        finish(trainer, logs / "trainer.log", timeout_s=60)
        finish(rollout, logs / "rollout.log", timeout_s=120)
    finally:
        for proc in (rollout, trainer):
            if proc.poll() is None:
                kill_tree(proc)
        client.close()
        queue.close()
    return seen, logs
