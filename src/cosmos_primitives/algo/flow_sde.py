"""One step of a rectified-flow sampler: ODE (Euler) or SDE with the Gaussian transition's mean, std
and log-probability (REFERENCE.md section 3).

Conventions: ``x_t = (1 - t) x0 + t eps``, the model predicts ``v = eps - x0``; a step goes from
``sigma`` to ``sigma_next < sigma`` with ``dt = sigma_next - sigma < 0``. All arithmetic is float32
(bf16 overflows in ``sigma / (1 - sigma)`` near ``sigma = 1``). ``sigma`` / ``sigma_next`` may be
Python floats or ``[B]`` tensors (one value per sample).

The transition of a stochastic step is ``x_next ~ N(mean, step_std^2 I)``; ``step_std`` is the
total standard deviation of the step (``std_t * sqrt(-dt)`` for the Flow-GRPO SDE).
"""

from __future__ import annotations

import math
from typing import Literal

import attrs
import torch

SDEType = Literal["flow_grpo", "linear", "cps"]
SDE_TYPES: tuple[str, ...] = ("flow_grpo", "linear", "cps")

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


@attrs.define(frozen=True)
class SDEParams:
    """How stochastic an SDE step is (``[wfm.sampler]``).

    ``noise_level`` is Flow-GRPO's ``a`` (``"flow_grpo"``, ``"cps"``); ``noise_min`` / ``noise_max``
    are the ends of the ``"linear"`` schedule ``std_t = noise_min + (noise_max - noise_min) * sigma``.
    """

    sde_type: str = "flow_grpo"
    noise_level: float = 0.7
    noise_min: float = 0.0
    noise_max: float = 0.7

    def __attrs_post_init__(self) -> None:
        if self.sde_type not in SDE_TYPES:
            raise ValueError(f"unknown sde_type {self.sde_type!r} ([wfm.sampler] sde_type); use one of {SDE_TYPES}")


@attrs.define
class StepStats:
    """Mean and std of one step's Gaussian transition.

    ``mean``: ``[B, ...]`` float32; ``std``: ``[B, 1, ...]`` float32 broadcastable to ``mean`` (zero
    for a deterministic step).
    """

    mean: torch.Tensor
    std: torch.Tensor


def _per_sample(value: float | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A scalar or ``[B]`` tensor as float32 ``[B, 1, ..., 1]`` broadcastable to ``like`` ``[B, ...]``."""
    t = torch.as_tensor(value, dtype=torch.float32, device=like.device)
    if t.ndim == 0:
        t = t.expand(like.shape[0])
    if t.shape != (like.shape[0],):
        raise ValueError(f"sigma must be a float or a [B] tensor with B = {like.shape[0]}; got shape {tuple(t.shape)}")
    return t.reshape(-1, *([1] * (like.ndim - 1)))


def sde_std_t(sigma: torch.Tensor, sigma_1: torch.Tensor | float, params: SDEParams) -> torch.Tensor:
    """The SDE's diffusion coefficient ``std_t`` at ``sigma`` (``"flow_grpo"`` / ``"linear"``).

    Args:
        sigma: float32 tensor of any shape, in ``(0, 1]``.
        sigma_1: the grid's second sigma; at ``sigma = 1`` Flow-GRPO divides by ``1 - sigma_1``
            instead of 0.

    Returns: float32, the shape of ``sigma``.
    """
    if params.sde_type == "linear":
        return params.noise_min + (params.noise_max - params.noise_min) * sigma
    if params.sde_type == "flow_grpo":
        sigma_1 = torch.as_tensor(sigma_1, dtype=torch.float32, device=sigma.device)
        denominator = 1.0 - torch.where(sigma >= 1.0, sigma_1, sigma)
        return params.noise_level * torch.sqrt(sigma / denominator)
    raise ValueError(f"sde_std_t is not defined for sde_type {params.sde_type!r}")


def ode_step(x: torch.Tensor, v: torch.Tensor, sigma: float | torch.Tensor,
             sigma_next: float | torch.Tensor) -> torch.Tensor:
    """Deterministic Euler step ``x + v dt``. ``x``, ``v``: ``[B, ...]``; returns float32 ``[B, ...]``."""
    x, v = x.float(), v.float()
    dt = _per_sample(sigma_next, x) - _per_sample(sigma, x)
    return x + v * dt


def sde_step_stats(x: torch.Tensor, v: torch.Tensor, sigma: float | torch.Tensor, sigma_next: float | torch.Tensor,
                   sigma_1: float | torch.Tensor, params: SDEParams) -> StepStats:
    """Mean and std of the stochastic step from ``sigma`` to ``sigma_next``.

    Flow-GRPO / linear: ``mean = x (1 + std_t^2 dt / (2 sigma)) + v (1 + std_t^2 (1 - sigma) / (2 sigma)) dt``,
    ``std = std_t sqrt(-dt)``. CPS: ``std = sigma_next sin(a pi / 2)``,
    ``mean = x0_hat (1 - sigma_next) + x1_hat sqrt(sigma_next^2 - std^2)`` with ``x0_hat = x - sigma v``,
    ``x1_hat = x + (1 - sigma) v``.

    Args:
        x: ``[B, ...]`` latents at ``sigma``; v: ``[B, ...]`` predicted velocity (any float dtype).
        sigma, sigma_next: floats or ``[B]``; sigma_1: the grid's second sigma (``"flow_grpo"`` at sigma = 1).
    """
    x, v = x.float(), v.float()
    s = _per_sample(sigma, x)
    s_next = _per_sample(sigma_next, x)
    dt = s_next - s
    if params.sde_type == "cps":
        std = s_next * math.sin(params.noise_level * math.pi / 2.0)
        x0_hat = x - s * v
        x1_hat = x + (1.0 - s) * v
        mean = x0_hat * (1.0 - s_next) + x1_hat * torch.sqrt((s_next**2 - std**2).clamp(min=0.0))
        return StepStats(mean=mean, std=std)
    std_t = sde_std_t(s, sigma_1, params)
    mean = x * (1.0 + std_t**2 * dt / (2.0 * s)) + v * (1.0 + std_t**2 * (1.0 - s) / (2.0 * s)) * dt
    return StepStats(mean=mean, std=std_t * torch.sqrt(-dt))


def gaussian_log_prob(x_next: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Log-density of ``x_next`` under ``N(mean, std^2)``, averaged over all non-batch elements.

    The average (not the sum) over elements is Flow-GRPO's: it keeps per-step log-prob differences
    small enough for clip ranges of 1e-4.

    Args:
        x_next, mean: ``[B, ...]``; std: broadcastable to them, strictly positive.

    Returns: ``[B]`` float32 (nats per element).

    Raises:
        ValueError: some ``std`` is 0 (a deterministic step has no density).
    """
    std = std.float()
    if bool((std <= 0).any()):
        raise ValueError("a deterministic step (std 0) has no log-prob; only stochastic steps carry one")
    z = (x_next.float().detach() - mean.float()) / std
    log_prob = -0.5 * z**2 - torch.log(std) - _LOG_SQRT_2PI
    return log_prob.flatten(1).mean(dim=1)


def gaussian_mean_kl(mean: torch.Tensor, ref_mean: torch.Tensor, std: torch.Tensor,
                     reduction: Literal["mean", "sum"] = "mean") -> torch.Tensor:
    """Closed-form KL between two Gaussians of the same covariance ``std^2 I``:
    ``||mean - ref_mean||^2 / (2 std^2)`` (``std = std_t sqrt(|dt|)``, so this is REFERENCE's
    ``||mean_theta - mean_ref||^2 / (2 std_t^2 |dt|)``).

    Args:
        mean, ref_mean: ``[B, ...]``; std: broadcastable, positive.
        reduction: ``"sum"`` over the non-batch elements (the exact KL of the whole step) or
            ``"mean"`` (per element, matching the averaged log-probs; Flow-GRPO's code).

    Returns: ``[B]`` float32.
    """
    per_element = (mean.float() - ref_mean.float()) ** 2 / (2.0 * std.float() ** 2)
    per_element = per_element.expand_as(mean).flatten(1)
    if reduction == "mean":
        return per_element.mean(dim=1)
    if reduction == "sum":
        return per_element.sum(dim=1)
    raise ValueError(f"kl reduction must be 'mean' or 'sum' ([wfm] kl_reduction); got {reduction!r}")
