"""DiffusionNFT (Zheng et al., arXiv 2509.16117): online diffusion RL on the forward process.

No log-probs and no SDE: rollouts may use any solver (the recipe uses deterministic ODE steps) and
no guidance, and training sees only the clean samples ``x0``. For a sample with advantage ``A``:

- optimality probability ``r = 1/2 + 1/2 * clamp(A / adv_clip_max, -1, 1)`` in ``[0, 1]``;
- a fresh forward-process point ``x_t = (1 - t) x0 + t eps``, ``t`` in ``(0, 1)``;
- the implicit positive and negative policies around the sampling ("old") policy's velocity
  ``v_old`` (no gradient): ``v+ = (1 - beta) v_old + beta v_theta``, ``v- = (1 + beta) v_old - beta v_theta``;
- their clean-sample predictions ``x0± = x_t - t v±``, each error normalised by its own detached
  mean absolute error per sample (adaptive weighting, floored at ``1e-5``):
  ``L± = mean((x0± - x0)^2 / mean|x0± - x0|)``;
- ``loss = mean_B(adv_clip_max * (r L+ + (1 - r) L-) / beta) + kl_beta * mean((v_theta - v_ref)^2)``.

Good samples (``r -> 1``) pull ``v+`` towards them, bad ones (``r -> 0``) pull ``v-`` towards them,
i.e. push ``v_theta`` away. The constants follow the authors' code (``adv_clip_max`` scale, ``1 / beta``).
"""

from __future__ import annotations

import attrs
import torch

MIN_WEIGHT = 1e-5
"""Floor of the adaptive weights (the authors' value)."""


@attrs.frozen
class DiffusionNFTOutput:
    """``loss`` (scalar, with gradient) and detached metrics: ``policy_loss``, ``positive_loss``,
    ``negative_loss``, ``kl`` (0 without a reference), ``optimality_mean`` (mean ``r``)."""

    loss: torch.Tensor
    policy_loss: torch.Tensor
    positive_loss: torch.Tensor
    negative_loss: torch.Tensor
    kl: torch.Tensor
    optimality_mean: torch.Tensor


def optimality_probability(advantages: torch.Tensor, adv_clip_max: float) -> torch.Tensor:
    """``r = 1/2 + 1/2 clamp(A / adv_clip_max, -1, 1)``: ``[B] -> [B]`` float32 in ``[0, 1]``."""
    if adv_clip_max <= 0:
        raise ValueError(f"[wfm] adv_clip_max must be > 0 for DiffusionNFT, got {adv_clip_max}")
    return 0.5 + 0.5 * (advantages.float() / adv_clip_max).clamp(-1.0, 1.0)


def _per_sample_mean(x: torch.Tensor) -> torch.Tensor:
    return x.mean(dim=tuple(range(1, x.ndim)))


def diffusion_nft_loss(v_theta: torch.Tensor, v_old: torch.Tensor, x_t: torch.Tensor, x0: torch.Tensor,
                       t: torch.Tensor, advantages: torch.Tensor, *, beta: float, adv_clip_max: float,
                       v_ref: torch.Tensor | None = None, kl_beta: float = 0.0) -> DiffusionNFTOutput:
    """The DiffusionNFT loss of a batch (module docstring).

    Args:
        v_theta: ``[B, C, T, H, W]`` the trained model's velocity at ``(x_t, t)`` (with gradient).
        v_old: same shape, the sampling policy's velocity (detached here).
        x_t, x0: same shape; ``t``: ``[B]`` the noise levels of ``x_t`` in ``(0, 1)``.
        advantages: ``[B]``; beta: the implicit-policy step (> 0); v_ref, kl_beta: optional
            velocity-space KL to a reference (detached ``v_ref``).
    """
    if beta <= 0:
        raise ValueError(f"[wfm] nft_beta must be > 0, got {beta}")
    v_theta, v_old, x_t, x0 = v_theta.float(), v_old.detach().float(), x_t.float(), x0.float()
    t = t.float().view(-1, *([1] * (x0.ndim - 1)))
    r = optimality_probability(advantages, adv_clip_max).to(x0.device)
    x0_pos = x_t - t * ((1.0 - beta) * v_old + beta * v_theta)
    x0_neg = x_t - t * ((1.0 + beta) * v_old - beta * v_theta)
    losses = []
    for pred in (x0_pos, x0_neg):
        err = pred - x0
        weight = err.detach().abs().double().mean(dim=tuple(range(1, x0.ndim)), keepdim=True).clamp(min=MIN_WEIGHT)
        losses.append(_per_sample_mean(err.pow(2) / weight.to(err.dtype)))
    positive, negative = losses
    policy_loss = (adv_clip_max * (r * positive + (1.0 - r) * negative) / beta).mean()
    kl = torch.zeros((), device=x0.device)
    if v_ref is not None and kl_beta > 0:
        kl = _per_sample_mean((v_theta - v_ref.detach().float()).pow(2)).mean()
    loss = policy_loss + kl_beta * kl
    return DiffusionNFTOutput(loss=loss, policy_loss=policy_loss.detach(), positive_loss=positive.mean().detach(),
                              negative_loss=negative.mean().detach(), kl=kl.detach(),
                              optimality_mean=r.mean().detach())
