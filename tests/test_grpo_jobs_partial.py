"""Partial rollouts in the independent jobs: with ``[rollout] partial_rollout_chunk_tokens`` the rollout
job generates in chunks and takes a newer weight version between them, continuing the cut completions
under it (``cp.rollout.partial``) instead of finishing them under stale weights."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import cosmos_primitives as cp
from cosmos_primitives.testing.recipe_runs import only_run_dir
from test_grpo_jobs import run_job_pair_reading_records

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "configs" / "grpo_tiny_jobs.toml"
SECRET = "jobs-test-run-secret-" + "0" * 32


def test_partial_rollouts_and_episodes_are_refused_together() -> None:
    from cosmos_primitives.rollout.episodes import generate_rollouts

    cfg = cp.load_config(None, ["rollout.partial_rollout_chunk_tokens=4", "rollout.multi_turn_config.enable=true"])
    with pytest.raises(ValueError, match="partial_rollout_chunk_tokens = 4 with"):
        generate_rollouts(None, None, [], cp.data.SamplingParams(), lambda e: None,
                          multi=cfg.rollout.multi_turn_config, max_response_length=8,
                          chunk_tokens=cfg.rollout.partial_rollout_chunk_tokens)


@pytest.mark.slow
def test_a_rollout_job_takes_new_weights_mid_generation_and_continues_the_cut_completions(
        grpo_assets, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trainer job and a rollout job on a real redis-server; the rollout job's 48-token completions come
    in chunks of 4 and the trainer publishes while they are generated: the job loads a newer version
    between chunks (its log says so), and the records it puts after that hold completions longer than
    a chunk stamped with the oldest version that sampled them (older than the one the job held when it
    put them), each token with its own log-prob; the trainer trains every step on them."""
    monkeypatch.setenv("COSMOS_RUN_SECRET", SECRET)
    small = ["grpo.rollout_batch_size=2", "grpo.num_samples_per_prompt=2", "rollout.max_response_length=48",
             "rollout.partial_rollout_chunk_tokens=4", "train.max_steps=4", "train.optm_warmup_steps=0",
             "train.ckpt.export_safetensors=false"]
    common = ["--run-name", "partial", "--redis", redis_url, *grpo_assets(CONFIG), *small]
    seen, logs = run_job_pair_reading_records(common, tmp_path, redis_url, "partial", SECRET,
                                              until_rollout_exits=True)
    text = (logs / "rollout.log").read_text(errors="replace")
    taken = [int(v) for v in re.findall(r"took weight version (\d+) between chunks", text)]
    assert taken, text[-3000:]
    # each range's log line names the version held at its put; its records follow in stream order
    puts = [int(v) for _, n, v in re.findall(r"range (\d+): (\d+) records with weight version (\d+)", text)
            for _ in range(int(n))]
    records = [seen[k] for k in sorted(seen, key=lambda e: tuple(int(x) for x in e.split(b"-")))]
    assert len(records) == len(puts), (len(records), puts)
    assert all(r.weight_version <= v for r, v in zip(records, puts))
    assert any(r.weight_version < v for r, v in zip(records, puts)), (puts, [r.weight_version for r in records])
    assert seen, "no record was read off the queue"
    for record in seen.values():
        for ids, lps in zip(record.completion_token_ids, record.logprobs):
            assert len(ids) == len(lps) and len(ids) <= 48 and all(lp <= 0.0 for lp in lps)
    assert any(len(ids) > 4 for r in seen.values() for ids in r.completion_token_ids)
    metrics = only_run_dir(tmp_path / "trainer") / "metrics.jsonl"
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [1, 2, 3, 4]
    print("versions taken mid-generation:", taken, "record versions:", [r.weight_version for r in records],
          "held at put:", puts)
