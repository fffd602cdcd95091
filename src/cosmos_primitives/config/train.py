"""``[train]``: the optimisation loop (optimizer, schedule, steps)."""

from __future__ import annotations

from typing import Literal

import msgspec

from cosmos_primitives.config.base import AtLeastOne, Fraction, NonNegative, NonNegativeInt, Section
from cosmos_primitives.config.checkpoint import CheckpointConfig
from cosmos_primitives.config.dataset import TrainPolicyConfig


class TrainConfig(Section):
    """``[train]``.

    Optimizer (``cp.policy.build_optimizer`` / ``build_lr_scheduler``): AdamW with ``optm_lr``
    (peak), ``optm_betas``, ``optm_eps``, ``optm_weight_decay`` (not on biases / norm scales);
    ``optm_warmup_steps`` of linear warmup (a float <= 1.0: that fraction of all steps), then
    ``optm_decay_type`` ``"cosine"`` / ``"linear"`` down to ``optm_lr * optm_min_lr_factor``
    (reached at the last step), or ``"constant"``;
    ``optm_grad_norm_clip`` clips the total gradient norm (``<= 0`` disables).

    ``nonfinite``: what ``cp.checkpoint.check_finite`` does when a step's loss or gradient norm is
    NaN / inf: ``"stop"`` raises before the optimizer step (nothing damaged is saved), ``"skip"``
    drops that step's update (the loop zeroes the gradients and goes on) and logs it.

    Memory options (cosmos-rl's key names; they compose with each other and with ``[policy]
    model_gradient_checkpointing``):

    - ``fsdp_offload``: FSDP2 CPU offload (torch ``CPUOffloadPolicy``): the sharded parameters,
      gradients and AdamW state live in host memory, each unit is copied to the GPU for its
      forward / backward, and the optimizer steps on the CPU. Saves ~16 bytes per parameter /
      ``dp_shard`` of GPU memory (float32 master weights) for host-device copies every step.
    - ``master_dtype``: dtype of the sharded master weights (and their gradients). ``"float32"``
      (default) or ``"bfloat16"`` (half the weight and gradient memory; needs ``[policy] dtype =
      "bfloat16"``). The AdamW moments and the update stay float32 either way, and the update is
      rounded stochastically into the bfloat16 weights, so updates smaller than a bfloat16 step
      are not lost (``cp.policy.build_optimizer``).
    """

    epoch: AtLeastOne = 1
    max_steps: AtLeastOne | None = None
    output_dir: str = "./outputs"
    resume: bool | str = False
    seed: int = 42
    train_batch_per_replica: AtLeastOne = 8
    optm_name: Literal["AdamW"] = "AdamW"
    optm_lr: NonNegative = 1e-5
    optm_weight_decay: NonNegative = 0.01
    optm_betas: list[float] = msgspec.field(default_factory=lambda: [0.9, 0.999])
    optm_eps: NonNegative = 1e-8
    # a float up to 1.0 is a fraction of the total steps (cosmos-rl's meaning)
    optm_warmup_steps: NonNegativeInt | NonNegative = 0
    optm_decay_type: Literal["cosine", "linear", "constant"] = "constant"
    optm_min_lr_factor: Fraction = 0.0
    optm_grad_norm_clip: float = 1.0
    nonfinite: Literal["stop", "skip"] = "stop"
    fsdp_offload: bool = False
    master_dtype: Literal["float32", "bfloat16"] = "float32"
    sync_weight_interval: AtLeastOne = 1
    ckpt: CheckpointConfig = msgspec.field(default_factory=CheckpointConfig)
    train_policy: TrainPolicyConfig = msgspec.field(default_factory=TrainPolicyConfig)
