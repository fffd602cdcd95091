"""DDRL (arXiv 2512.04332): data-regularised diffusion RL (REFERENCE.md section 4).

``L = L_FlowGRPO(rollouts) + data_beta * L_data(real clips)``, where the data term is the ordinary
flow-matching loss on real clips of the same prompts: ``x_sigma = (1 - sigma) x0 + sigma eps``,
target velocity ``v = eps - x0``, mean squared error of the predicted velocity. This is a forward
KL to the data distribution and replaces the reverse KL to the reference (``kl_beta = 0``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import attrs
import torch

# (x_t [B, C, T, H, W], timestep [B], text [B, L, D], [num_condition_frames=K]) -> velocity; cp.algo.VelocityFn
VelocityFn = Callable[..., torch.Tensor]


def neg_exp_advantages(advantages: torch.Tensor, clip: float = 5.0) -> torch.Tensor:
    """DDRL's advantage transform ``A -> clamp(-exp(-A), -clip, clip)``. ``[B] -> [B]`` float32.

    Every transformed advantage is negative; better samples are pushed down less.
    """
    return (-torch.exp(-advantages.float())).clamp(-clip, clip)


def noisy_latents(x0: torch.Tensor, noise: torch.Tensor, sigma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rectified-flow interpolation and its velocity target.

    Args:
        x0: ``[B, C, T, H, W]`` clean latents; noise: same shape; sigma: ``[B]`` in ``[0, 1]``.

    Returns: ``(x_sigma, v_target)``, both float32 ``[B, C, T, H, W]``:
    ``x_sigma = (1 - sigma) x0 + sigma noise``, ``v_target = noise - x0``.
    """
    if noise.shape != x0.shape:
        raise ValueError(f"noise {tuple(noise.shape)} must have the clip latents' shape {tuple(x0.shape)}")
    if sigma.shape != x0.shape[:1]:
        raise ValueError(f"sigma must be [B] = [{x0.shape[0]}]; got {tuple(sigma.shape)}")
    s = sigma.float().reshape(-1, *([1] * (x0.ndim - 1)))
    x0, noise = x0.float(), noise.float()
    return (1.0 - s) * x0 + s * noise, noise - x0


@attrs.define
class DataLoss:
    """``loss``: scalar (differentiable), the mean over samples of ``per_sample``;
    ``per_sample``: ``[B]`` velocity MSE averaged over elements; ``sigma``: ``[B]`` the noise levels used."""

    loss: torch.Tensor
    per_sample: torch.Tensor
    sigma: torch.Tensor


def ddrl_data_loss(velocity_fn: VelocityFn, x0: torch.Tensor, text: torch.Tensor, *,
                   noise: torch.Tensor | None = None, sigma: torch.Tensor | None = None,
                   generator: torch.Generator | None = None, num_train_timesteps: float = 1000.0,
                   weighting: Literal["velocity", "x0"] = "velocity", num_condition_frames: int = 0) -> DataLoss:
    """The flow-matching loss of the current network on real clips.

    Args:
        velocity_fn: the policy's velocity (conditional, no guidance).
        x0: ``[B, C, T, H, W]`` normalised latents of real clips; text: ``[B, L, D]`` their prompts' embeddings.
        noise: ``[B, C, T, H, W]``, e.g. the rollout's own initial noise; ``None``: fresh Gaussian noise.
        sigma: ``[B]``, e.g. the trained RL step's sigma; ``None``: uniform in ``[0, 1)``.
        num_train_timesteps: the model's timestep is ``sigma * num_train_timesteps``.
        weighting: ``"velocity"``: MSE of the velocity (REFERENCE's form); ``"x0"``: MSE of the implied
            clean-latent prediction ``x_sigma - sigma v``, i.e. the velocity error weighted by ``sigma^2``
            (tolerates large velocity changes near ``sigma = 0``, which barely move samples).
        num_condition_frames: image- / video-to-world: the clip's first ``K`` latent frames stay clean in
            ``x_sigma`` (the model's condition) and are left out of the loss.
    """
    if weighting not in ("velocity", "x0"):
        raise ValueError(
            f"data loss weighting must be 'velocity' or 'x0' ([wfm] ddrl_loss_weighting); got {weighting!r}"
        )
    if noise is None:
        noise = torch.randn(x0.shape, generator=generator, device=x0.device, dtype=torch.float32)
    if sigma is None:
        sigma = torch.rand(x0.shape[0], generator=generator, device=x0.device)
    sigma = sigma.to(x0.device).float()
    x_sigma, target = noisy_latents(x0, noise.to(x0.device), sigma)
    k = num_condition_frames
    if k:
        x_sigma = torch.cat([x0[:, :, :k].float(), x_sigma[:, :, k:]], dim=2)
        v = velocity_fn(x_sigma, sigma * num_train_timesteps, text, num_condition_frames=k).float()
    else:
        v = velocity_fn(x_sigma, sigma * num_train_timesteps, text).float()
    per_sample = ((v - target)[:, :, k:] ** 2).flatten(1).mean(dim=1)
    if weighting == "x0":
        per_sample = per_sample * sigma**2
    return DataLoss(loss=per_sample.mean(), per_sample=per_sample.detach(), sigma=sigma)
