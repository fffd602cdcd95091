"""A tensor-parallel rollout job: ``examples/grpo_rollout_job.py`` with ``[rollout] backend = "vllm"`` and
``[rollout.parallelism] tp_size = 2`` in a 2-rank torchrun job (one engine over both ranks), against the
vLLM stand-in's TP semantics (``tests/standins/vllm``: each rank holds its shard; the ranks of a TP group
must submit the same requests), a trainer job of two FSDP ranks and a real redis-server: the Cosmos-Reason1
guide's 4-GPU RL snippet (rollout ``tp_size = 2``, policy ``dp_shard_size = 2``; tests/test_seed_parallelism.py)
merged in as it is written. Real vLLM cannot run
here: this checks the job's lockstep (one decision per step for the group, every rank fetching the same
weights), not vLLM's kernels.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from cosmos_primitives.testing.recipe_runs import finish, kill_tree, launch_recipe, only_run_dir
from test_grpo_jobs import CONFIG, REPO, read_jsonl
from test_seed_parallelism import REASON1_SNIPPETS, snippet_overrides

STANDINS = Path(__file__).parent / "standins"
STEPS = 3


@pytest.fixture(autouse=True)
def _run_secret(monkeypatch):
    """The jobs read the run secret from the environment (the launched processes inherit it)."""
    monkeypatch.setenv("COSMOS_RUN_SECRET", "jobs-test-run-secret-" + "0" * 32)


def test_torchrun_takes_the_run_name_as_run_name_but_not_as_run() -> None:
    """torchrun's parser refuses ``--run`` anywhere on its line (an ambiguous prefix of its ``--run-path``), so
    the job scripts also take ``--run-name``, and the docs and Slurm scripts write that after torchrun."""
    from torch.distributed.run import get_args_parser

    import cosmos_primitives as cp

    line = ["--nproc_per_node", "2", "examples/grpo_rollout_job.py", "--config", str(CONFIG)]
    with pytest.raises(SystemExit):
        get_args_parser().parse_args([*line, "--run", "r1"])
    args = get_args_parser().parse_args([*line, "--run-name", "r1", "--redis", "redis://h:1/0"])
    cfg, _ = cp.config.load_recipe_config(None, jobs=True, argv=args.training_script_args)
    assert (cfg.redis.stream, cfg.redis.url) == ("cosmos:r1", "redis://h:1/0")
    for script in ("slurm/rollout.sbatch", "slurm/trainer.sbatch"):
        assert "--run-name \"$RUN\"" in (REPO / "examples" / script).read_text()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_tp2_rollout_job_feeds_the_trainer_with_weights_that_follow_it(tmp_path: Path, redis_url: str) -> None:
    """The trainer finishes; its records all come from the TP job's one engine (its first rank's job id), with
    weights that followed the trainer (versions rise; lag within the bound); both TP ranks loaded every
    tensor of their shard on the first transfer and fetched each later version together."""
    logs = tmp_path / "logs"
    logs.mkdir()
    common = ["--run-name", "tp", "--redis", redis_url,
              f"policy.model_name_or_path=demo:{tmp_path / 'model'}",
              f"train.train_policy.dataset.name=demo:{tmp_path / 'data' / 'train.jsonl'}", "custom.demo_items=32",
              # text only: the stand-in counts prompt tokens without a processor's image expansion
              "custom.demo_model=tiny_qwen2", "custom.demo_data=arithmetic",
              "train.train_policy.prompt_column_name=prompt", "train.train_policy.response_column_name=answer",
              "grpo.reward_function={exact_match = 1.0}",
              "rollout.backend=vllm", *snippet_overrides(REASON1_SNIPPETS[("rl", 4)]), "rollout.max_response_length=6",
              "grpo.num_samples_per_prompt=2", "grpo.rollout_batch_size=4", "grpo.allowed_outdated_steps=1",
              f"train.max_steps={STEPS}", "train.optm_warmup_steps=0", "train.train_policy.mini_batch=8"]
    env = {"PYTHONPATH": os.pathsep.join([str(STANDINS), str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    trainer = launch_recipe(REPO / "examples" / "grpo_trainer_job.py", CONFIG,
                            [*common, f"train.output_dir={tmp_path / 'trainer'}"], logs / "trainer.log", cwd=REPO,
                            nproc=2, new_session=True)
    rollout = launch_recipe(REPO / "examples" / "grpo_rollout_job.py", CONFIG, common, logs / "rollout.log", cwd=REPO,
                            nproc=2, env=env, new_session=True)
    try:
        finish(trainer, logs / "trainer.log", timeout_s=400)
        rollout_log = finish(rollout, logs / "rollout.log", timeout_s=120)
    finally:
        for proc in (trainer, rollout):
            if proc.poll() is None:
                kill_tree(proc)

    # one engine, listed once: the first rank's job id; the second rank is a weight member of it
    loaded = re.findall(r"\[rollout\] (\S+): loaded weight version (\d+) .*; TP rank (\d) of 2, every tensor of "
                        r"its shard loaded", rollout_log)
    assert sorted(rank for _, _, rank in loaded) == ["0", "1"], rollout_log[-3000:]
    job_id = next(name for name, _, rank in loaded if rank == "0")
    assert next(name for name, _, rank in loaded if rank == "1") == f"{job_id}-tp1"
    assert len({version for _, version, _ in loaded}) == 1, loaded  # both ranks started from one version

    trainer_log = (logs / "trainer.log").read_text()
    assert "ParallelMesh(pp=1, dp_replicate=1, dp_shard=2, cp=1, tp=1, world_size=2" in trainer_log, trainer_log[-3000:]
    run_dir = only_run_dir(tmp_path / "trainer")
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    trained = read_jsonl(run_dir / "records.jsonl")
    assert trained and {r["producer"] for r in trained} == {job_id}
    lags = [r["step"] - 1 - r["weight_version"] for r in trained]
    assert min(lags) >= 0 and max(lags) <= 1, lags
    # the weights followed the trainer: the last step trained on records generated after an update
    assert max(r["weight_version"] for r in trained) >= STEPS - 2 >= 1
    ranges = re.findall(rf"\[rollout\] {re.escape(job_id)}: epoch \d+ range \d+: (\d+) records with weight "
                        r"version (\d+)", rollout_log)
    assert len(ranges) >= STEPS and len({v for _, v in ranges}) >= 2, ranges
    assert f"[rollout] {job_id}: stopping (trainer finished at step {STEPS})" in rollout_log
    assert f"[rollout] {job_id}-tp1: stopping with its engine's first rank (trainer finished at step {STEPS})" \
        in rollout_log
