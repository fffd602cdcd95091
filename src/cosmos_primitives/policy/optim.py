"""AdamW and the warmup + cosine / linear / constant learning-rate schedule (``[train] optm_*``)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler

from cosmos_primitives.config.train import TrainConfig

DECAY_TYPES = ("cosine", "linear", "constant")


def lr_factor(step: int, *, warmup_steps: int, total_steps: int | None, decay_type: str,
              min_lr_factor: float) -> float:
    """Multiplier of the peak learning rate for optimizer step ``step`` (0-based).

    Warmup: ``(step + 1) / warmup_steps`` for ``step < warmup_steps`` (the first step already
    moves the weights). Then over steps ``warmup_steps .. total_steps - 1``, with
    ``progress = (step - warmup_steps) / (total_steps - 1 - warmup_steps)`` clamped to [0, 1]:
    cosine ``m + (1 - m) * (1 + cos(pi * progress)) / 2``, linear ``m + (1 - m) * (1 - progress)``,
    constant ``1``; ``m = min_lr_factor``, reached at the last step ``total_steps - 1`` and kept after.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if decay_type == "constant":
        return 1.0
    if total_steps is None:
        raise ValueError(f"optm_decay_type = {decay_type!r} needs the total number of steps (total_steps)")
    progress = min(max((step - warmup_steps) / max(total_steps - 1 - warmup_steps, 1), 0.0), 1.0)
    if decay_type == "cosine":
        return min_lr_factor + (1.0 - min_lr_factor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if decay_type == "linear":
        return min_lr_factor + (1.0 - min_lr_factor) * (1.0 - progress)
    raise ValueError(f"unknown [train] optm_decay_type {decay_type!r}; use one of {', '.join(DECAY_TYPES)}")


class WarmupDecayLR(LRScheduler):
    """``lr = base_lr * lr_factor(step)``; call ``step()`` once after every ``optimizer.step()``.

    ``state_dict()`` / ``load_state_dict()`` carry the step and the schedule's settings, so a
    resumed run continues the exact learning-rate sequence (restore the optimizer first).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, warmup_steps: int = 0, total_steps: int | None = None,
                 decay_type: str = "constant", min_lr_factor: float = 0.0, last_epoch: int = -1) -> None:
        if decay_type not in DECAY_TYPES:
            raise ValueError(f"unknown [train] optm_decay_type {decay_type!r}; use one of {', '.join(DECAY_TYPES)}")
        if decay_type != "constant" and total_steps is None:
            raise ValueError(
                f"optm_decay_type = {decay_type!r} needs total_steps "
                "(e.g. [train] max_steps, or epochs x steps per epoch)"
            )
        if warmup_steps < 0 or not 0.0 <= min_lr_factor <= 1.0:
            raise ValueError(
                f"optm_warmup_steps must be >= 0 (got {warmup_steps}) and optm_min_lr_factor in [0, 1] "
                f"(got {min_lr_factor})"
            )
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.decay_type = decay_type
        self.min_lr_factor = min_lr_factor
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int | None = None) -> float:
        return lr_factor(self.last_epoch if step is None else step, warmup_steps=self.warmup_steps,
                         total_steps=self.total_steps, decay_type=self.decay_type, min_lr_factor=self.min_lr_factor)

    def get_lr(self) -> list[float]:  # type: ignore[override]
        f = self.factor()
        return [base * f for base in self.base_lrs]


def optimizer_param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Trainable parameters split into decayed (matrices) and not decayed (biases, norm scales)."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    if not decay and not no_decay:
        raise ValueError(
            f"{type(model).__name__} has no trainable parameters: check [policy] freeze_patterns / trainable_patterns"
        )
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def build_optimizer(model: torch.nn.Module, train: TrainConfig) -> torch.optim.AdamW:
    """AdamW over the trainable parameters from ``[train]``: ``optm_lr``, ``optm_betas``,
    ``optm_weight_decay`` (not applied to 1-D tensors), ``optm_eps``.

    Build it after ``apply_fsdp`` so that it holds the sharded parameters.
    """
    if train.optm_name != "AdamW":
        raise ValueError(f"[train] optm_name = {train.optm_name!r} is not supported; use 'AdamW'")
    if len(train.optm_betas) != 2:
        raise ValueError(f"[train] optm_betas must hold two numbers, got {train.optm_betas}")
    return torch.optim.AdamW(
        optimizer_param_groups(model, train.optm_weight_decay),
        lr=train.optm_lr,
        betas=(float(train.optm_betas[0]), float(train.optm_betas[1])),
        eps=train.optm_eps,
        weight_decay=train.optm_weight_decay,
    )


def build_lr_scheduler(optimizer: torch.optim.Optimizer, train: TrainConfig,
                       total_steps: int | None = None) -> WarmupDecayLR:
    """:class:`WarmupDecayLR` from ``[train]``: ``optm_warmup_steps``, ``optm_decay_type``,
    ``optm_min_lr_factor``; ``total_steps`` defaults to ``[train] max_steps``.

    ``optm_warmup_steps`` written as a float up to 1.0 (``0.03``) is a fraction of the total steps
    (cosmos-rl's meaning): ``int(fraction * total_steps)`` warmup steps."""
    total = total_steps if total_steps is not None else train.max_steps
    warmup = train.optm_warmup_steps
    if isinstance(warmup, float) and warmup <= 1.0:
        if total is None:
            raise ValueError(f"[train] optm_warmup_steps = {warmup} is a fraction of the total steps, which are "
                             "unknown here: pass total_steps or set [train] max_steps")
        warmup = int(warmup * total)
    return WarmupDecayLR(
        optimizer,
        warmup_steps=int(warmup),
        total_steps=total,
        decay_type=train.optm_decay_type,
        min_lr_factor=train.optm_min_lr_factor,
    )
