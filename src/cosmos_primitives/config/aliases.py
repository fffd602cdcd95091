"""Other spellings of config keys that users already write, mapped onto one canonical field.

Each entry maps a dotted alias path to its canonical dotted path, optionally with a function that
translates the alias's value. Paths are relative to the root of the file.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_PARALLEL_SHORT = {
    "dp_shard": "dp_shard_size",
    "dp_replicate": "dp_replicate_size",
    "tp": "tp_size",
    "cp": "cp_size",
    "pp": "pp_size",
}

# The older reference system spells the GRPO knobs under [train.train_policy].
_GRPO_UNDER_TRAIN_POLICY = (
    "epsilon_low",
    "epsilon_high",
    "kl_beta",
    "loss_type",
    "variant",
    "allowed_outdated_steps",
    "on_policy",
    "reward_function",
    "rollout_batch_size",
)

ALIASES: dict[str, tuple[str, Callable[[Any], Any] | None]] = {
    "rollout.n_generation": ("grpo.num_samples_per_prompt", None),
    "grpo.kl_penalty": ("grpo.kl_beta", None),
    "train.param_dtype": ("policy.dtype", None),
    **{
        f"train.train_policy.{key}": (f"grpo.{key}", None)
        for key in _GRPO_UNDER_TRAIN_POLICY
    },
    **{
        f"{section}.parallelism.{short}": (f"{section}.parallelism.{full}", None)
        for section in ("policy", "rollout")
        for short, full in _PARALLEL_SHORT.items()
    },
}


def register_alias(alias: str, canonical: str, transform: Callable[[Any], Any] | None = None) -> None:
    """Add an alias (e.g. from a recipe that keeps an older spelling alive)."""
    ALIASES[alias] = (canonical, transform)
