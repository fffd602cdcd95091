"""``[train]``: the optimisation loop (optimizer, schedule, steps)."""

from __future__ import annotations

from typing import Literal

import msgspec

from cosmos_primitives.config.base import AtLeastOne, Fraction, NonNegative, NonNegativeInt, Section
from cosmos_primitives.config.checkpoint import CheckpointConfig
from cosmos_primitives.config.dataset import TrainPolicyConfig


class TrainConfig(Section, dict=True):
    """``[train]``.

    ``train_batch_per_replica``: the samples of one optimizer step on each data-parallel rank (the
    SFT recipe's batch; cosmos-rl's SFT meaning, whose worker gives every data-parallel rank a loader
    of that batch size). A GRPO step is sized by ``[grpo]`` (``rollout_batch_size`` prompts x
    ``num_samples_per_prompt``, or ``rollouts_per_step``); for a cosmos-rl GRPO file, whose value is the
    rollouts of a replica's step shared by its ranks, the loader sets it to the rollouts per rank and
    step and translates it into those keys (``docs/from_cosmos_rl.md``).

    ``seed``: None (cosmos-rl's default, given to its files) draws a seed at start-up, the same on
    every rank, logged (``cp.config.check_runnable``); set it to repeat a run.

    ``enable_validation`` (read-only): ``[validation] enable``, where cosmos-rl's older configs (and the
    dataset scripts of Cosmos-Reason1 that read ``config.train.enable_validation``) have it.

    Optimizer (``cp.policy.build_optimizer`` / ``build_lr_scheduler``): ``optm_name`` ``"AdamW"``
    (decoupled weight decay) or ``"Adam"`` (``torch.optim.Adam``: the weight decay is added to the
    gradient, L2, as cosmos-rl builds it; its distillation files ask for it) with ``optm_lr``
    (peak), ``optm_betas``, ``optm_eps``, ``optm_weight_decay`` (not on biases / norm scales);
    ``optm_warmup_steps`` of linear warmup from 0 (a float <= 1.0: that fraction of all steps;
    clamped to the run's steps), then ``optm_decay_type`` ``"cosine"`` / ``"linear"`` / ``"sqrt"``
    towards ``optm_lr * optm_min_lr_factor``, or ``"constant"`` (cosmos-rl's ``"none"`` / unset):
    cosmos-rl's schedule, formulas in ``cp.policy.lr_factor``;
    ``optm_grad_norm_clip`` clips the total gradient norm (``<= 0`` disables).

    ``nonfinite``: what ``cp.policy.check_finite`` does when a step's loss or gradient norm is
    NaN / inf: ``"stop"`` raises before the optimizer step (nothing damaged is saved), ``"skip"``
    drops that step's update (the loop zeroes the gradients and goes on) and logs it.

    Preemption (cosmos-rl's keys; ``cp.checkpoint.Preemption``): with ``save_ckpt_at_exit``, one of
    the ``signal_to_handle`` signals saves a checkpoint at the next step boundary (with ``[train.ckpt]
    enable_checkpoint``) and stops the run with exit status 75; ``train.resume=true`` goes on from
    it exactly. cosmos-rl handles SIGUSR1 alone by default (its launcher sends it); here SIGTERM too,
    which a scheduler sends a process it takes the nodes from.

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

    Speed options (cosmos-rl's key names; none changes what is trained beyond float rounding):

    - ``optm_impl``: the AdamW kernels. ``"fused"`` (default, as cosmos-rl's): one fused kernel per
      parameter group and device (``torch.optim.AdamW(fused=True)``; CUDA and CPU, DTensors
      included), no float32 temporaries, falling back to ``"foreach"`` (logged) where torch has no
      fused kernel for a parameter's device; ``"foreach"``: torch's multi-tensor kernels (torch's
      own default on CUDA, what this library used before); ``"for-loop"``: one tensor at a time.
      With ``master_dtype = "bfloat16"``, ``"for-loop"`` updates one tensor slice at a time and the
      others a bucket of slices per multi-tensor kernel (``BFloat16AdamW``).
    - ``compile``: ``torch.compile`` of every decoder layer (``fullgraph=True``, inductor;
      ``cp.parallel.apply_compile``) when the policy runs on a CUDA device; on the CPU it is not
      applied (logged): inductor's C++ code generation takes tens of seconds per graph there and
      CPU runs are tests and small demos. Off by default (cosmos-rl's default, true, applies to its
      files): the first steps pay the compilation.
    - ``fsdp_reshard_after_forward``: whether FSDP2 frees each decoder layer's gathered
      (compute-dtype) weights after its forward and gathers them again for its backward.
      ``"default"``: not when the shard group has one rank and nothing is offloaded (one
      data-parallel rank with mixed precision: nothing to save but the second cast and copy of
      every layer per step; the gathered copy, ``N x`` compute-dtype bytes, lives from the forward
      to the end of the backward), else every layer but the last (cosmos-rl's default: the last
      layer's backward comes first); ``"always"``: every layer (the least memory, what this library
      did before); ``"never"``: no layer. The root unit (embeddings, final norm, LM head) stays
      gathered from its forward through the backward except with ``"always"``; a frozen model
      (the KL reference) always reshards. A no-grad forward leaves kept units gathered until the
      next backward or optimizer step (``build_optimizer``'s reshards them before stepping; with an
      optimizer of your own, call ``reshard()`` on every ``FSDPModule`` before its step).
    """

    epoch: AtLeastOne = 1
    max_steps: AtLeastOne | None = None
    output_dir: str = "./outputs"
    resume: bool | str = False
    seed: int | None = 42
    train_batch_per_replica: AtLeastOne = 8
    optm_name: Literal["AdamW", "Adam"] = "AdamW"
    optm_lr: NonNegative = 1e-5
    optm_weight_decay: NonNegative = 0.01
    optm_betas: list[float] = msgspec.field(default_factory=lambda: [0.9, 0.999])
    optm_eps: NonNegative = 1e-8
    # a float up to 1.0 is a fraction of the total steps (cosmos-rl's meaning)
    optm_warmup_steps: NonNegativeInt | NonNegative = 0
    optm_decay_type: Literal["cosine", "linear", "sqrt", "constant"] = "constant"
    optm_min_lr_factor: Fraction = 0.0
    optm_grad_norm_clip: float = 1.0
    nonfinite: Literal["stop", "skip"] = "stop"
    save_ckpt_at_exit: bool = True
    signal_to_handle: list[Literal["SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"]] = msgspec.field(
        default_factory=lambda: ["SIGUSR1", "SIGTERM"])
    fsdp_offload: bool = False
    master_dtype: Literal["float32", "bfloat16"] = "float32"
    optm_impl: Literal["fused", "foreach", "for-loop"] = "fused"
    compile: bool = False
    fsdp_reshard_after_forward: Literal["default", "always", "never"] = "default"
    sync_weight_interval: AtLeastOne = 1
    ckpt: CheckpointConfig = msgspec.field(default_factory=CheckpointConfig)
    train_policy: TrainPolicyConfig = msgspec.field(default_factory=TrainPolicyConfig)

    @property
    def enable_validation(self) -> bool:
        validation = getattr(self, "_validation", None)  # set by the Config that holds this section
        if validation is None:
            raise AttributeError("enable_validation is [validation] enable: read it on a whole Config's train section")
        return validation.enable
