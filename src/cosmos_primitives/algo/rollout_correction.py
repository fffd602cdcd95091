"""Rollout correction: importance weights between the trainer and the rollout engine, and the mismatch metrics.

The engine's log-probs ``logp_rollout`` (the behaviour policy) and the trainer's ``logp_old`` (its
weights at the start of the update, :func:`cp.policy.grpo_update` recomputes them) differ by the
engines' numerics (bf16 kernels, another attention, quantisation) and by staleness. With the
per-token ratio ``r_t = exp(logp_old - logp_rollout)`` the loss of each token is multiplied by a
detached weight (``[grpo] rollout_correction``):

- ``"tis"``, truncated importance sampling: ``w_t = min(r_t, C)`` with ``C = rollout_is_cap``;
- ``"mis"``, masked importance sampling: ``w_t = r_t`` where ``lo <= r_t <= C``, else 0
  (``lo = rollout_is_lower``, default ``1 / C``). cosmos-rl's and AReaL's
  ``behav_imp_weight_cap = C`` is ``"mis"`` with ``lo = 0``.

and optionally whole sequences are rejected (``[grpo] rollout_rejection``) when a sequence ratio
leaves ``[rollout_rejection_lower, rollout_rejection_upper]`` (lower default ``1 / upper``):

- ``"geometric"``: ``exp(mean_t log r_t)``, length-independent;
- ``"sequence"``: ``exp(sum_t log r_t)``, the sequence's own likelihood ratio.

These are the forms of verl's rollout correction (``rollout_is`` / ``rollout_rs``) and TRL's vLLM
importance-sampling correction (``token_truncate`` / ``token_mask``). Each mode is a registered pure
function (:func:`register_rollout_correction`), so another weight is one decorated function.

Shapes: ``[B, T]`` log-probs and mask (1 on completion tokens); weights ``[B, T]`` detached, 0 off
the mask.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from cosmos_primitives.algo.registry import get_rollout_correction, register_rollout_correction
from cosmos_primitives.config.grpo import GRPOConfig

LOG_RATIO_CLAMP = 20.0  # exp(20) ~ 5e8: a finite ratio for tokens the other side all but excluded


class RolloutCorrection(NamedTuple):
    """The weights of one micro-batch and what they did.

    weights: ``[B, T]`` float32 detached token weights (1 where no mode is set), 0 off the mask and on
        masked tokens / rejected sequences.
    truncated: ``[B, T]`` bool tokens whose weight TIS capped.
    masked: ``[B, T]`` bool tokens given weight 0 (MIS bounds or a rejected sequence).
    rejected: ``[B]`` bool sequences dropped by the sequence-level rejection.
    """

    weights: torch.Tensor
    truncated: torch.Tensor
    masked: torch.Tensor
    rejected: torch.Tensor


def log_ratio(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` ``log r_t = logp_old - logp_rollout`` clamped to +-20, 0 off the mask; detached."""
    if old_logprobs.shape != rollout_logprobs.shape or old_logprobs.shape != mask.shape:
        raise ValueError(f"old_logprobs {tuple(old_logprobs.shape)}, rollout_logprobs "
                         f"{tuple(rollout_logprobs.shape)} and mask {tuple(mask.shape)} must share one [B, T] shape")
    diff = (old_logprobs.detach().float() - rollout_logprobs.detach().float()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.where(mask.bool(), diff, torch.zeros_like(diff))


@register_rollout_correction("tis")
def truncated_importance_weights(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor,
                                 cfg: GRPOConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """TIS: ``(weights = min(r, C), truncated = r > C, masked = none)``, each ``[B, T]``, 0 / False off the mask."""
    on = mask.bool()
    ratio = log_ratio(old_logprobs, rollout_logprobs, mask).exp()
    cap = cfg.rollout_is_cap
    weights = torch.where(on, ratio.clamp(max=cap), torch.zeros_like(ratio))
    return weights, on & (ratio > cap), torch.zeros_like(on)


@register_rollout_correction("mis")
def masked_importance_weights(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor,
                              cfg: GRPOConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """MIS: ``(weights = r inside [lo, C] else 0, truncated = none, masked = r outside [lo, C])``."""
    on = mask.bool()
    ratio = log_ratio(old_logprobs, rollout_logprobs, mask).exp()
    lower = mis_lower(cfg)
    outside = on & ((ratio > cfg.rollout_is_cap) | (ratio < lower))
    weights = torch.where(on & ~outside, ratio, torch.zeros_like(ratio))
    return weights, torch.zeros_like(on), outside


def mis_lower(cfg: GRPOConfig) -> float:
    """The MIS lower bound: ``rollout_is_lower``, else ``1 / rollout_is_cap``."""
    return cfg.rollout_is_lower if cfg.rollout_is_lower is not None else 1.0 / cfg.rollout_is_cap


def sequence_rejection(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor, mode: str,
                       upper: float, lower: float | None = None) -> torch.Tensor:
    """``[B]`` bool: sequences whose ratio leaves ``[lower, upper]`` (``lower`` None: ``1 / upper``).

    ``mode = "geometric"``: ``exp(mean_t log r_t)``; ``"sequence"``: ``exp(sum_t log r_t)``. Compared in
    log space (no overflow). A row without completion tokens is never rejected.
    """
    lr = log_ratio(old_logprobs, rollout_logprobs, mask)
    total = lr.sum(-1)
    if mode == "geometric":
        stat = total / mask.bool().sum(-1).clamp(min=1)
    elif mode == "sequence":
        stat = total
    else:
        raise ValueError(f"[grpo] rollout_rejection = {mode!r}: expected 'geometric' or 'sequence'")
    low = lower if lower is not None else 1.0 / upper
    log_low = float("-inf") if low <= 0 else float(torch.tensor(low, dtype=torch.float64).log())
    log_up = float(torch.tensor(upper, dtype=torch.float64).log())
    return (stat > log_up) | (stat < log_low)


def rollout_correction(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor,
                       cfg: GRPOConfig) -> RolloutCorrection:
    """The ``[grpo] rollout_correction`` / ``rollout_rejection`` weights of a micro-batch (see the module doc)."""
    on = mask.bool()
    if cfg.rollout_correction is not None:
        weights, truncated, masked = get_rollout_correction(cfg.rollout_correction)(
            old_logprobs, rollout_logprobs, mask, cfg)
    else:
        weights, truncated, masked = on.float(), torch.zeros_like(on), torch.zeros_like(on)
    rejected = torch.zeros(on.shape[0], dtype=torch.bool, device=on.device)
    if cfg.rollout_rejection is not None:
        rejected = sequence_rejection(old_logprobs, rollout_logprobs, mask, cfg.rollout_rejection,
                                      cfg.rollout_rejection_upper, cfg.rollout_rejection_lower)
        weights = torch.where(rejected[:, None], torch.zeros_like(weights), weights)
        masked = masked | (on & rejected[:, None])
    return RolloutCorrection(weights.detach(), truncated, masked, rejected)


def rollout_mismatch_metrics(trainer_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor,
                             cfg: GRPOConfig) -> dict[str, torch.Tensor]:
    """The rollout-vs-trainer drift of a micro-batch, as detached 0-d tensors (no host sync).

    ``rollout_kl_k3``: the token mean of ``r - 1 - log r`` with ``r = exp(logp_trainer - logp_rollout)``,
    Schulman's k3 estimate of KL(rollout || trainer) from tokens the rollout sampled (>= 0 per token,
    0 iff the two agree); ``rollout_ratio_max`` / ``rollout_ratio_min``: of ``r`` over completion
    tokens; ``rollout_truncated_fraction`` / ``rollout_masked_fraction``: tokens the configured
    correction truncates / masks (rejected sequences included); ``rollout_rejected_fraction``:
    sequences rejected (0 when not configured).
    """
    on = mask.bool()
    n_tokens = on.sum().clamp(min=1)
    lr = log_ratio(trainer_logprobs, rollout_logprobs, mask)  # log(trainer / rollout)
    ratio = lr.exp()
    k3 = torch.where(on, ratio - 1.0 - lr, torch.zeros_like(lr))
    correction = rollout_correction(trainer_logprobs, rollout_logprobs, mask, cfg)
    rows = on.any(-1)
    return {
        "rollout_kl_k3": k3.sum() / n_tokens,
        "rollout_ratio_max": torch.where(on, ratio, torch.zeros_like(ratio)).max(),
        "rollout_ratio_min": torch.where(on, ratio, torch.full_like(ratio, float("inf"))).min(),
        "rollout_truncated_fraction": correction.truncated.sum() / n_tokens,
        "rollout_masked_fraction": correction.masked.sum() / n_tokens,
        "rollout_rejected_fraction": (correction.rejected & rows).sum() / rows.sum().clamp(min=1),
    }
