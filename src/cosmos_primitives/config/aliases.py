"""Other spellings of config keys that users already write, mapped onto one canonical field.

Each entry maps a dotted alias path to its canonical dotted path, optionally with a function that
translates the alias's value. Paths are relative to the root of the file. An alias may name a
whole table (``wfm.lora``); a key inside it then maps to the same key inside the canonical table.

Aliases in :data:`DEPRECATED` are spellings this library used before and no longer documents: they
still load, with a ``FutureWarning`` naming the key to write instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cosmos_primitives.config.compat.rules import _bool_as, cosmos_rl_aliases
from cosmos_primitives.config.policy import DIFFUSERS_LORA_TARGETS

_PARALLEL_SHORT = {
    "dp_shard": "dp_shard_size",
    "dp_replicate": "dp_replicate_size",
    "tp": "tp_size",
    "cp": "cp_size",
    "pp": "pp_size",
}

# This library's own older spellings of the GRPO knobs under [train.train_policy] (cosmos-rl's own keys
# there are aliases generated from its rule list). ``mini_batch`` stays there: it is [train.train_policy]
# mini_batch for SFT and GRPO alike.
_GRPO_UNDER_TRAIN_POLICY = (
    "policy_loss",
    "advantage_estimator",
    "advantage_std",
    "advantage_epsilon",
    "dual_clip_c",
    "kl_estimator",
    "dynamic_sampling",
    "overlong_reward",
    "old_logprobs",
    "reward_fallback_score",
    "rollout_batch_size",
)

# GRPO knobs that older configs spell differently under [grpo]: old name -> field of [grpo], value transform
_GRPO_RENAMED = {
    # cosmos-rl's ``unbiased_advantage = true`` (do not divide by the std) is the Dr.GRPO estimator
    "unbiased_advantage": ("advantage_estimator", _bool_as("drgrpo", "grpo")),
    "lower_bound_ratio": ("dual_clip_c", None),
    "kl_penalty": ("kl_beta", None),
}

# the world-model guide's spellings of the parallel sizes (cosmos-rl's WFM recipe for Cosmos-Predict2.5:
# [model] fsdp_shard_size / dp_replicate_size and [model_parallel] context_parallel_size); the world-model
# recipe (examples/wfm_rl.py) builds its mesh from [policy.parallelism]
WFM_GUIDE_ALIASES = {
    "model.fsdp_shard_size": ("policy.parallelism.dp_shard_size", None),
    "model.dp_replicate_size": ("policy.parallelism.dp_replicate_size", None),
    "model_parallel.context_parallel_size": ("policy.parallelism.cp_size", None),
}

COSMOS_RL_ALIASES = cosmos_rl_aliases()
"""cosmos-rl's spellings of keys that exist here under another name, generated from the rule list
(``config/compat/rules.py``)."""

ALIASES: dict[str, tuple[str, Callable[[Any], Any] | None]] = {
    **COSMOS_RL_ALIASES,
    **WFM_GUIDE_ALIASES,
    **{f"grpo.{old}": (f"grpo.{field}", transform) for old, (field, transform) in _GRPO_RENAMED.items()},
    "train.train_policy.kl_penalty": ("grpo.kl_beta", None),
    **{f"train.train_policy.{key}": (f"grpo.{key}", None) for key in _GRPO_UNDER_TRAIN_POLICY},
    **{
        f"{section}.parallelism.{short}": (f"{section}.parallelism.{full}", None)
        for section in ("policy", "rollout")
        for short, full in _PARALLEL_SHORT.items()
    },
}


def _wfm_lora_as_policy_lora(table: object) -> object:
    """``[wfm.lora]`` without ``target_modules`` adapted the diffusers attention projections."""
    if isinstance(table, dict) and "target_modules" not in table:
        return {**table, "target_modules": list(DIFFUSERS_LORA_TARGETS)}
    return table  # left for the type check to reject with the key's name


# The world-model recipe's own spellings of [policy] keys, from before one config per component.
WFM_POLICY_DEPRECATED: dict[str, tuple[str, Callable[[Any], Any] | None]] = {
    "wfm.model": ("policy.model_name_or_path", None),
    "wfm.dtype": ("policy.dtype", None),
    "wfm.gradient_checkpointing": ("policy.model_gradient_checkpointing", None),
    "wfm.lora": ("policy.lora", _wfm_lora_as_policy_lora),
}

RENAMED: dict[str, tuple[str, Callable[[Any], Any] | None]] = {
    # prompts per rank and step: one name, [grpo] rollout_batch_size's, in [grpo] and [wfm] alike
    "wfm.data.prompts_per_step": ("wfm.rollout_batch_size", None),
    # new tokens per completion: [rollout] / [validation] max_response_length's name, in [eval] too
    "eval.max_tokens": ("eval.max_response_length", None),
}
"""This library's own older names of a quantity that now has one name everywhere (issue 33): each
still loads, with a ``FutureWarning`` naming the key to write instead."""

DEPRECATED: dict[str, tuple[str, Callable[[Any], Any] | None]] = {**WFM_POLICY_DEPRECATED, **RENAMED}

DEPRECATED_DEFAULTS: dict[str, Any] = {
    "policy.model_name_or_path": "tiny",
    "policy.dtype": "float32",
    "policy.lora": {"target_modules": list(DIFFUSERS_LORA_TARGETS)},
}
"""What the :data:`WFM_POLICY_DEPRECATED` ``[wfm]`` keys defaulted to. A file that still spells any of them gets
these values for the ones it sets in neither spelling, so that it trains as it did (the ``[policy]``
defaults differ: no model, ``bfloat16``, no LoRA)."""

ALIASES.update(DEPRECATED)


def register_alias(alias: str, canonical: str, transform: Callable[[Any], Any] | None = None) -> None:
    """Add an alias (e.g. from a recipe that keeps an older spelling alive)."""
    ALIASES[alias] = (canonical, transform)
