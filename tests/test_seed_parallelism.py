"""The parallelism snippets of the Cosmos-Reason1 post-training guide, as written there, on CPU with gloo.

The guide ("Parallelism variants" under SFT and RL) gives one TOML snippet per GPU count. Each is merged
into a tiny recipe the way a user merges it into theirs (its keys become overrides). All four load and
fit their GPU count; the two 4-GPU ones also run here: SFT with ``dp_shard_size = 4`` on 4 gloo processes,
and (in ``tests/test_grpo_jobs_tp.py``) RL with ``dp_shard_size = 2`` for the trainer job and rollout
``tp_size = 2`` for a rollout job, 4 processes. The 8-GPU ones would need 8 processes on this 2-core
machine and are only loaded. The world-model guide's snippet (``[model_parallel] context_parallel_size``)
is covered in ``tests/test_wfm_recipes.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib

import cosmos_primitives as cp
from cosmos_primitives.parallel.mesh import resolve_sizes
from cosmos_primitives.testing.recipe_runs import finish, launch_recipe, only_run_dir
from test_sft_example import CONFIG as SFT_CONFIG
from test_sft_example import REPO

# (guide section, GPU count) -> the snippet, verbatim
REASON1_SNIPPETS = {
    ("sft", 4): "[policy.parallelism]\ndp_shard_size = 4\n",
    ("sft", 8): "[policy.parallelism]\ndp_shard_size = 8\n",
    ("rl", 4): "[rollout.parallelism]\ntp_size = 2\n\n[policy.parallelism]\ndp_shard_size = 2\n",
    ("rl", 8): "[rollout.parallelism]\ntp_size = 4\n\n[policy.parallelism]\ndp_shard_size = 4\n",
}
RL_CONFIG = REPO / "examples" / "configs" / "grpo_tiny_jobs.toml"


def snippet_overrides(snippet: str) -> list[str]:
    """A TOML snippet as ``dotted.key=value`` overrides (how its tables merge into a recipe's)."""
    def flatten(table: dict, prefix: str) -> list[str]:
        return [item for key, value in table.items()
                for item in (flatten(value, f"{prefix}{key}.") if isinstance(value, dict)
                             else [f"{prefix}{key}={value}"])]
    return flatten(tomllib.loads(snippet), "")


@pytest.mark.parametrize(("section", "gpus"), list(REASON1_SNIPPETS), ids=[f"{s}-{g}gpu" for s, g in REASON1_SNIPPETS])
def test_reason1_snippet_fits_its_gpu_count(section: str, gpus: int) -> None:
    """SFT: the policy shards over every GPU. RL: the guide's GPUs are the trainer's policy ranks plus one
    rollout engine's TP ranks (cosmos-rl's replicas; here a trainer job and a rollout job)."""
    cfg = cp.load_config(SFT_CONFIG if section == "sft" else RL_CONFIG,
                         snippet_overrides(REASON1_SNIPPETS[(section, gpus)]))
    policy_gpus = gpus if section == "sft" else gpus - cfg.rollout.parallelism.tp_size
    assert resolve_sizes(cfg.policy.parallelism, policy_gpus)["dp_shard"] == policy_gpus
    if section == "rl":
        assert cfg.rollout.parallelism.tp_size == policy_gpus  # half the GPUs each, as the guide splits them


@pytest.mark.slow
def test_reason1_sft_4gpu_snippet_runs_on_4_gloo_ranks(tmp_path: Path) -> None:
    """The 4-GPU SFT snippet on 4 processes: the model sharded 4 ways, each rank its quarter of the data."""
    assets = [f"policy.model_name_or_path=demo:{tmp_path / 'model'}",
              f"train.train_policy.dataset.name=demo:{tmp_path / 'video_qa'}", "custom.demo_items=16"]
    overrides = [*assets, *snippet_overrides(REASON1_SNIPPETS[("sft", 4)]), f"train.output_dir={tmp_path / 'runs'}",
                 "train.max_steps=3", "train.ckpt.enable_checkpoint=false", "train.ckpt.export_safetensors=false"]
    log = tmp_path / "sft.log"
    text = finish(launch_recipe("examples/sft.py", SFT_CONFIG, overrides, log, cwd=REPO, nproc=4), log)
    assert re.search(r"ParallelMesh\(pp=1, dp_replicate=1, dp_shard=4, cp=1, tp=1, world_size=4", text), text[-3000:]
    records = cp.logging.read_metrics(only_run_dir(tmp_path / "runs"))
    assert [r["step"] for r in records] == [1, 2, 3]
    # One process taking the same 16 samples per step (4 per rank x 4; 16 items, so every step is a
    # whole epoch): the 4-way run must average its ranks' losses and gradients into exactly these.
    # A rank-local loss, a summed gradient or a skipped all-reduce differs far beyond reduction order.
    # Step 1 trains at lr 0 (warmup from 0), so step 3 is the one that shows the update of step 2.
    single = [*assets, "policy.parallelism.dp_shard_size=1", "train.train_batch_per_replica=16",
              f"train.output_dir={tmp_path / 'runs1'}", "train.max_steps=3", "train.ckpt.enable_checkpoint=false",
              "train.ckpt.export_safetensors=false"]
    log1 = tmp_path / "sft1.log"
    finish(launch_recipe("examples/sft.py", SFT_CONFIG, single, log1, cwd=REPO, nproc=1), log1)
    alone = cp.logging.read_metrics(only_run_dir(tmp_path / "runs1"))
    assert [r["step"] for r in alone] == [1, 2, 3]
    for four, one in zip(records, alone, strict=True):
        assert four["tokens"] == one["tokens"]
        assert four["loss"] == pytest.approx(one["loss"], rel=1e-5), (four, one)
        assert four["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4), (four, one)
    assert abs(records[2]["loss"] - records[1]["loss"]) > 1e-3  # the update of step 2 moved the loss
