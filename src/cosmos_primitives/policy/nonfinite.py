"""The non-finite guard: a NaN / inf loss or gradient norm stops the run (or skips the step) before
the optimizer applies it (a non-finite update never reaches the weights; weights that are already
non-finite, e.g. after a huge learning rate, are not detected here)."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from cosmos_primitives.logging.console import get_logger
from cosmos_primitives.parallel.distributed import all_reduce_sum

_MODES = ("stop", "skip")


class NonFiniteError(RuntimeError):
    """A step's loss or gradient norm was NaN or infinite under ``[train] nonfinite = "stop"``."""


def check_finite(loss: torch.Tensor | float, grad_norm: torch.Tensor | float | None, *, step: int,
                 mode: str = "stop", group: dist.ProcessGroup | None = None) -> bool:
    """Decide whether step ``step`` may apply its update: call it after backward (and gradient
    clipping, which returns the norm), before ``optimizer.step()``.

    Every rank of ``group`` gets the same answer: one rank's non-finite value counts for all (one
    all-reduce of a scalar; pass tensors on the training device under NCCL).

    Args:
        loss: this rank's loss, a scalar tensor or float.
        grad_norm: the total gradient norm (``clip_grad_norm_``'s return value), or None.
        step: the optimizer step, for the message.
        mode: ``[train] nonfinite``: ``"stop"`` raises :class:`NonFiniteError`, ``"skip"`` returns False
            (the caller zeroes the gradients and leaves the optimizer, scheduler and checkpoint alone).
        group: the ranks that train together (default: the whole job).

    Returns:
        True when every value is finite.
    """
    if mode not in _MODES:
        raise ValueError(f"[train] nonfinite must be one of {_MODES}, got {mode!r}")
    values = [v for v in (loss, grad_norm) if v is not None]
    device = next((v.device for v in values if isinstance(v, torch.Tensor)), torch.device("cpu"))
    bad = torch.zeros((), dtype=torch.float32, device=device)
    for value in values:
        finite = torch.isfinite(value).all() if isinstance(value, torch.Tensor) else math.isfinite(float(value))
        bad += 0.0 if bool(finite) else 1.0
    if float(all_reduce_sum(bad, group=group)) == 0.0:
        return True
    what = (f"step {step}: non-finite loss or gradient norm "
            f"(loss {_show(loss)}, grad_norm {_show(grad_norm)} on this rank)")
    if mode == "stop":
        raise NonFiniteError(f"{what}; stopped before this step's update. A non-finite loss may also mean "
                             f"the weights already are (e.g. after a huge learning rate), and then the checkpoints "
                             f"saved since hold them too. Lower the learning rate and resume from a checkpoint "
                             f"saved before the problem; "
                             f"[train] nonfinite = \"skip\" drops such steps instead")
    get_logger("cosmos.checkpoint").warning("%s: skipping this update ([train] nonfinite = \"skip\")", what)
    return False


def _show(value: torch.Tensor | float | None) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.detach().float().item():g}" if value.numel() == 1 else f"tensor of {value.numel()}"
    return "n/a" if value is None else f"{float(value):g}"
