"""``[grpo]``: GRPO-family knobs for language / vision-language policies (REFERENCE.md section 2)."""

from __future__ import annotations

from typing import Literal

import msgspec

from cosmos_primitives.config.base import Section


class GRPOConfig(Section):
    """``[grpo]``. Older configs spell most of these under ``[train.train_policy]`` (aliases)."""

    num_samples_per_prompt: int = 8
    rollout_batch_size: int = 8
    variant: Literal["grpo", "gspo"] = "grpo"
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    kl_beta: float = 0.0
    loss_type: str = "token-mean"
    allowed_outdated_steps: int = 4
    on_policy: bool = False
    reward_function: dict[str, float] = msgspec.field(
        default_factory=lambda: {"single_choice": 1.0, "format": 1.0}
    )
