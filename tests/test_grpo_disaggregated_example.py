"""``examples/grpo_vlm_disaggregated.py`` run as users run it: ``torchrun`` with one trainer rank
and one rollout rank on CPU, records through a real redis-server, weights broadcast back each step.

Small sizes (2 prompts x 4 samples of 8 tokens, 3 steps) keep a run near 20 s on two cores."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import redis

import cosmos_primitives as cp

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "configs" / "grpo_tiny_disaggregated.toml"
STEPS = 3
RUN_TIMEOUT_S = 300
SMALL = ["grpo.rollout_batch_size=2", "grpo.num_samples_per_prompt=4", "rollout.max_response_length=8",
         f"train.max_steps={STEPS}"]


@pytest.fixture(scope="module")
def assets(grpo_assets) -> list[str]:
    """Overrides pointing the tiny config at a tiny random Qwen2.5-VL and 16 colour-MCQ items."""
    return grpo_assets(CONFIG)


def run(overrides: list[str], out: Path, env: dict[str, str] | None = None) -> tuple[str, Path]:
    """Run the recipe under torchrun with 2 ranks; assert exit 0; return its log and run directory."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "examples/grpo_vlm_disaggregated.py", "--config", str(CONFIG),
           f"train.output_dir={out}", *overrides]
    proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S)
    log = proc.stdout.decode(errors="replace")
    assert proc.returncode == 0, f"the disaggregated run exited with {proc.returncode}:\n{log[-5000:]}"
    run_dir = cp.utils.latest_run_dir(out)
    assert run_dir is not None
    return log, run_dir


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_trains_from_the_queue_with_fresh_weights_on_the_rollout_rank(assets, redis_url: str, tmp_path: Path) -> None:
    stream = "cp:test:grpo_dis"
    log, run_dir = run([*assets, *SMALL, "disaggregated.start_local_redis=false", f"redis.stream={stream}"],
                       tmp_path / "out", env={"COSMOS_REDIS_URL": redis_url})

    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert [r["weight_version"] for r in rows] == [1, 2, 3]
    assert [r["sync/version"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert {"staleness/p50", "staleness/max", "staleness/dropped_total"} <= set(r)
        assert 0 <= r["staleness/p50"] <= r["staleness/max"] <= 1  # [grpo] allowed_outdated_steps = 1
        assert r["staleness/kept"] == 2  # records per step: rollout_batch_size x 1 trainer rank
        # the records trained at step s were sampled with weights of version s - 1 - staleness
        assert r["step"] - 1 - r["staleness/max"] <= r["rollout/weight_version"] <= r["step"] - 1
        assert {"clip_fraction", "entropy", "loss"} <= set(r)
        assert "kl" not in r  # kl_beta = 0: no reference model, so no KL is computed or logged
    # the rollout rank received every broadcast: its batches were sampled with ever newer weights
    versions = [int(v) for v in re.findall(r"\[rollout\] batch \d+: \d+ records with weight version (\d+)", log)]
    assert versions == sorted(versions) and versions[-1] >= STEPS - 1, log[-3000:]
    assert "[rollout] stopping (trainer finished at step 3)" in log

    client = redis.Redis.from_url(redis_url)
    try:
        assert client.get(f"{stream}:weight_version") == str(STEPS).encode()
        assert client.get(f"{stream}:stop") == f"trainer finished at step {STEPS}".encode()
    finally:
        client.close()
    final = run_dir / "safetensors" / "final"
    assert (final / "config.json").is_file() and list(final.glob("*.safetensors"))
    assert (run_dir / "curves.png").stat().st_size > 0


def test_local_redis_server_is_started_and_stopped(assets, tmp_path: Path) -> None:
    log, run_dir = run([*assets, *SMALL, "train.max_steps=2", "train.ckpt.export_safetensors=false"],
                       tmp_path / "out", env={"COSMOS_REDIS_URL": ""})
    assert [r["weight_version"] for r in metrics(run_dir)] == [1, 2]
    match = re.search(r"started a local redis-server at redis://127\.0\.0\.1:(\d+)/0", log)
    assert match, log[-3000:]
    with pytest.raises(OSError):  # nothing listens there once the job is over
        socket.create_connection(("127.0.0.1", int(match.group(1))), timeout=1).close()
    # it ran with an append-only file in the run dir, kept for a resume of that run
    assert any((run_dir / "redis" / "appendonlydir").glob("*.aof")), sorted((run_dir / "redis").rglob("*"))



def test_lora_policy_broadcasts_merged_weights(assets, tmp_path: Path) -> None:
    # the trainer holds base weights + adapters; the rollout rank's plain model receives them merged
    # (the first broadcast is verified with checksums against the merged values)
    log, run_dir = run([*assets, *SMALL, "train.max_steps=2", "train.ckpt.export_safetensors=false",
                        "policy.lora={r = 4, lora_alpha = 8.0}", "disaggregated.start_local_redis=true"],
                       tmp_path / "out", env={"COSMOS_REDIS_URL": ""})
    rows = metrics(run_dir)
    assert [r["weight_version"] for r in rows] == [1, 2]
    assert all(r["sync/bytes"] > 0 for r in rows)
    versions = [int(v) for v in re.findall(r"\[rollout\] batch \d+: \d+ records with weight version (\d+)", log)]
    assert versions and versions[-1] >= 1, log[-3000:]


def test_trainer_checkpoints_among_its_ranks_and_resumes_with_the_queue_kept(assets, redis_url: str,
                                                                            tmp_path: Path) -> None:
    stream, out = "cp:test:grpo_dis_resume", tmp_path / "out"
    shared = [*assets, *SMALL, "disaggregated.start_local_redis=false", f"redis.stream={stream}",
              "train.ckpt.enable_checkpoint=true", "train.ckpt.save_freq=1", "train.ckpt.save_mode=async",
              "train.ckpt.export_safetensors=false"]
    first_log, run_dir = run([*shared, "train.max_steps=2"], out, env={"COSMOS_REDIS_URL": redis_url})
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_1", "step_2"]
    first_batches = len(re.findall(r"\[rollout\] batch \d+:", first_log))

    log, resumed_dir = run([*shared, "train.max_steps=3", "train.resume=true"], out,
                           env={"COSMOS_REDIS_URL": redis_url})
    assert resumed_dir == run_dir  # the same run goes on
    assert re.search(r"Resumed from .*step_2 \(step 2", log), log[-3000:]
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[-1]["weight_version"] == 3
    # the rollout rank started from the resumed weights (version 2), not from the SFT model (0)
    versions = [int(v) for v in re.findall(r"\[rollout\] batch \d+: \d+ records with weight version (\d+)", log)]
    assert versions and min(versions) >= 2, log[-3000:]
    assert (run_dir / "checkpoints" / "step_3").is_dir()
    # the rollout rank went on after the prompts it had queued instead of starting the order again
    resumed = re.search(r"\[rollout\] resuming prompt order at epoch \d+, position (\d+) after (\d+) batches", log)
    assert resumed, log[-3000:]
    assert int(resumed.group(2)) == first_batches > 0 and int(resumed.group(1)) > 0
    assert re.search(rf"\[rollout\] batch {first_batches + 1}: ", log), log[-3000:]
