"""Every vendored cosmos-rl LLM / VLM config means here what it means to cosmos-rl itself: the value
this library trains with, for every key it maps, equals the effective value under cosmos-rl's own
``Config`` class (``tests/data/cosmos_rl_effective_config.json``, written from cosmos-rl 0.4.7 by
``scripts/fixtures_cosmos_rl_config.py``), up to the meanings this library spells otherwise
(:data:`TRANSLATED`) and the deliberate differences (:data:`DELIBERATE`, each also stated in
``docs/from_cosmos_rl.md``). A file that sets nothing trains with the default column of the rule table."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

import cosmos_primitives as cp
from cosmos_primitives.config.compat.cosmos_rl import RULES
from cosmos_primitives.config.loader import canonical_key

DATA = Path(__file__).parent / "data"
CONFIGS = DATA / "cosmos_rl_configs"
FIXTURE = json.loads((DATA / "cosmos_rl_effective_config.json").read_text())
DOC = Path(__file__).parents[1] / "docs" / "from_cosmos_rl.md"


def _dp(cfg: cp.Config) -> int:
    return cfg.policy.parallelism.dp_shard_size * cfg.policy.parallelism.dp_replicate_size


def _train_batch(theirs: int, cfg: cp.Config) -> Any:
    """SFT: per rank in both. GRPO: a replica's rollouts per step there, per rank here (x dp ranks),
    and what a rank trains per optimizer step (rollouts_per_step, or a whole generation)."""
    if cfg.train.train_policy.type == "sft":
        return cfg.train.train_batch_per_replica
    grpo = cfg.grpo
    per_step = grpo.rollouts_per_step or grpo.rollout_batch_size * grpo.num_samples_per_prompt
    assert per_step == cfg.train.train_batch_per_replica
    return per_step * _dp(cfg)


# cosmos-rl key -> the value it has there, computed from this library's config (same meaning, other spelling)
TRANSLATED: dict[str, Callable[[cp.Config], Any]] = {
    "rollout.batch_size": lambda c: c.rollout.batch_size // c.grpo.num_samples_per_prompt,  # prompts there
    "train.train_policy.unbiased_advantage": lambda c: c.grpo.advantage_estimator == "drgrpo",
    "train.train_policy.use_rollout_logprobs_for_loss": lambda c: c.grpo.old_logprobs == "rollout",
    "train.optm_decay_type": lambda c: None if c.train.optm_decay_type == "constant" else c.train.optm_decay_type,
}
# unset: spelled None there, "" / [] here
UNSET = (None, "", [])

DELIBERATE: dict[str, tuple[Callable[[Any, Any], bool], str]] = {
    "train.train_policy.min_filter_prefix_tokens": (
        lambda theirs, ours: ours is None,
        "with [distillation] enable it is unset: cosmos-rl bypasses the rewards then, all 0, so its filter "
        "takes nothing out (qwen3-8b-distill.toml)"),
    "rollout.backend": (
        lambda theirs, ours: theirs == "vllm" or theirs not in ("vllm", "hf"),
        "unset: vLLM where it is installed and a GPU is present, else the HF engine (cosmos-rl: always vLLM); "
        "engines other than vLLM / HF are refused"),
    "train.train_policy.dataset.split": (
        lambda theirs, ours: theirs == [""] and ours == ["train"],
        "unset: \"train\" (cosmos-rl's \"\" names no split: its readers fail on it)"),
    "validation.dataset.split": (
        lambda theirs, ours: theirs == [""] and ours == ["train"],
        "unset: \"train\" (cosmos-rl's \"\" names no split: its readers fail on it)"),
    "train.train_policy.dataset.name": (
        lambda theirs, ours: theirs == "" and ours.lstrip("./") != "",
        "a Cosmos-Reason example's [custom.dataset] path, read as the example script that consumes it reads it "
        "(config/compat/cosmos_rl_custom.py; cosmos-rl's class leaves the name empty)"),
    "train.ckpt.hf_repo_name": (
        lambda theirs, ours: theirs == "Comos-Reason1" and ours == "",
        "unset: no repository (an upload then stops, naming the key) instead of cosmos-rl's placeholder "
        "\"Comos-Reason1\""),
    "train.signal_to_handle": (
        lambda theirs, ours: theirs == ["SIGUSR1"] and ours == ["SIGUSR1", "SIGTERM"],
        "unset: SIGUSR1 and SIGTERM (cosmos-rl: SIGUSR1, which its launcher sends its workers; here "
        "SIGTERM is what a scheduler sends the training processes themselves)"),
}


def _ours(cfg: cp.Config, key: str, theirs: Any) -> Any:
    if key == "train.train_batch_per_replica":
        return _train_batch(theirs, cfg)
    if key in TRANSLATED:
        return TRANSLATED[key](cfg)
    node: Any = cfg
    for part in canonical_key(key).split("."):
        node = getattr(node, part)
    value = msgspec.to_builtins(node)
    if key.endswith("dataset.split") and isinstance(theirs, list):
        return [value] if "+" not in value else value.split("+")
    return value


def _same(theirs: Any, ours: Any) -> bool:
    if any(theirs is u or theirs == u for u in UNSET if not isinstance(theirs, bool)):
        return any(ours is u or ours == u for u in UNSET if not isinstance(ours, bool))
    return theirs == ours


def _load(name: str) -> cp.Config:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return cp.load_config(CONFIGS / name)


def test_the_fixture_covers_every_vendored_llm_vlm_config_and_every_mapped_key() -> None:
    assert FIXTURE["cosmos_rl_version"] == "0.4.7"
    vendored = {str(p.relative_to(CONFIGS)) for p in CONFIGS.rglob("*.toml") if "cosmos-predict2-5" not in p.parts}
    assert set(FIXTURE["configs"]) == vendored and len(vendored) == 54
    keys = {key for values in FIXTURE["configs"].values() for key in values}
    mapped = {key for key, rule in RULES.items() if rule.how == "mapped"}
    assert keys <= mapped and len(keys) >= 100  # the rest are keys of no LLM / VLM file's class (custom / lora ones)


def test_every_mapped_value_equals_cosmos_rl_s_own_config() -> None:
    unexpected, deliberate_seen = [], set()
    for name, values in FIXTURE["configs"].items():
        cfg = _load(name)
        for key, theirs in values.items():
            if key in cfg.unsupported:
                continue  # refused: the recipes stop on it, naming what to do
            ours = _ours(cfg, key, theirs)
            if _same(theirs, ours):
                continue
            if key in DELIBERATE and DELIBERATE[key][0](theirs, ours):
                deliberate_seen.add(key)
                continue
            unexpected.append(f"{name}: {key}: cosmos-rl {theirs!r}, here {ours!r}")
    assert not unexpected, "\n".join(unexpected)
    assert deliberate_seen == set(DELIBERATE)  # every listed difference still occurs (none listed in vain)


def test_a_file_that_sets_nothing_gets_the_default_column_of_the_rule_table(tmp_path: Path) -> None:
    """The table's cosmos-rl defaults (docs/from_cosmos_rl.md) and the values a cosmos-rl file that leaves
    every key unset trains with (``COSMOS_RL_DEFAULTS``, our own defaults elsewhere) cannot drift apart."""
    path = tmp_path / "bare.toml"
    path.write_text('redis = "12800"\n[train.train_policy]\ntype = "grpo"\n'
                    '[policy.lora]\ntarget_modules = ["q_proj"]\n')  # a LoRA table, so its keys are read too
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        cfg = cp.load_config(path)
    drifted, checked = [], 0
    for key, rule in RULES.items():
        if rule.how != "mapped" or rule.default is None:
            continue
        theirs = rule.default
        if key.endswith("reward_function") and isinstance(theirs, list):
            theirs = dict.fromkeys(theirs, 1.0)  # a list of names: weight 1 each, as the loader reads it
        if key.endswith("dataset.split"):
            theirs = [theirs]  # cosmos-rl's class holds a list (the fixture's spelling)
        ours = _ours(cfg, key, theirs)
        checked += 1
        if not (_same(theirs, ours) or (key in DELIBERATE and DELIBERATE[key][0](theirs, ours))):
            drifted.append(f"{key}: the table says {rule.default!r}, a file without it trains with {ours!r}")
    assert not drifted, "\n".join(drifted)
    assert checked >= 90 and cfg.unsupported == {}  # the loop went through the table


def test_every_deliberate_difference_is_stated_in_the_docs() -> None:
    doc = DOC.read_text()
    section = doc[doc.index("### Deliberate differences from cosmos-rl's effective values"):]
    for key, (_, reason) in DELIBERATE.items():
        assert f"`{key}`" in section, f"state `{key}` ({reason}) in docs/from_cosmos_rl.md"


@pytest.mark.parametrize(("name", "per_rank", "prompts", "per_step"), [
    # Reason2's own file: 8 rollouts per step of groups of 16 (one replica of one dp rank)
    ("cosmos-reason2/configs/cosmos_rl_config.toml", 8, 1, 8),
    # Reason1 RL: 128 per replica of dp_shard 2 = 64 per rank, n_generation 8: 8 prompts in one step
    ("cosmos-reason1/examples/post_training/configs/rl.toml", 64, 8, None),
])
def test_grpo_batches_are_cosmos_rl_s(name: str, per_rank: int, prompts: int, per_step: int | None) -> None:
    cfg = _load(name)
    assert cfg.train.train_batch_per_replica == per_rank
    assert (cfg.grpo.rollout_batch_size, cfg.grpo.rollouts_per_step) == (prompts, per_step)
    assert cfg.unsupported == {}


def test_sft_batch_is_per_rank_as_in_cosmos_rl() -> None:
    # Reason1's sft.toml: 32 per data-parallel rank of 4, 128 samples per step in all (was 8 per rank)
    cfg = _load("cosmos-reason1/examples/post_training/configs/sft.toml")
    assert cfg.train.train_batch_per_replica == 32 and _dp(cfg) == 4
