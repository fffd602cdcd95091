"""``[distillation]``: on-policy distillation from a frozen teacher (cosmos-rl's ``[distillation]``,
the same key names; ``cosmos_primitives.algo.distillation`` holds the math)."""

from __future__ import annotations

from typing import Literal

from cosmos_primitives.config.base import AtLeastOne, Fraction, NonNegative, Section


class DistillationConfig(Section):
    """``[distillation]``. With ``enable`` the GRPO recipe loads ``model_name_or_path`` as a frozen
    teacher (the policy's loader, sharded as the policy), scores every rollout token with it, and
    trains on the per-token advantage ``-kl_penalty_coef * d_t`` summed forward with
    ``kl_discount_factor`` (``d_t``: the sampled reverse KL, ``top_k = 0``). As in cosmos-rl, which sets
    ``train_policy.bypass_reward`` when distillation is on, the rewards do not enter the advantage
    (``reward_advantages = "bypass"``); ``"add"`` adds the group reward advantages to it instead."""

    enable: bool = False
    model_name_or_path: str = ""
    model_revision: str | None = None
    kl_penalty_coef: NonNegative = 1.0
    kl_discount_factor: Fraction = 0.0
    # teacher rows per forward (cosmos-rl's distillation.mini_batch)
    mini_batch: AtLeastOne = 1
    # new beside the cosmos-rl keys: cosmos-rl always bypasses the rewards when distilling
    reward_advantages: Literal["bypass", "add"] = "bypass"

    def __post_init__(self) -> None:
        if self.enable and not self.model_name_or_path:
            raise ValueError("distillation.enable = true needs distillation.model_name_or_path (the teacher: "
                             "a Hub id or a local folder with the student's tokenizer)")
