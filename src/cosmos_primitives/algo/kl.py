"""Per-token KL estimators against a frozen reference policy (Schulman's k1 / k2 / k3).

With ``x = clamp(logp_ref - logp_theta, -20, 20)`` on the sampled tokens (drawn from the current
policy): k1 = ``-x`` (unbiased, high variance, can be negative), k2 = ``x^2 / 2`` (low variance,
biased), k3 = ``exp(x) - x - 1`` (unbiased, always >= 0; the GRPO default). The gradient flows
through ``logprobs``; ``ref_logprobs`` are constants (a reference copy of the model, or the same
model with its LoRA adapters disabled).

Shapes: ``logprobs``, ``ref_logprobs`` [B, T] float32 -> [B, T]. Masking and aggregation happen
in the caller.
"""

from __future__ import annotations

import torch

from cosmos_primitives.algo.registry import register_kl_estimator

KL_LOG_RATIO_CLAMP = 20.0


def _log_ratio(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    if ref_logprobs.shape != logprobs.shape:
        raise ValueError(f"ref_logprobs {tuple(ref_logprobs.shape)} must match logprobs {tuple(logprobs.shape)}")
    return torch.clamp(ref_logprobs.detach() - logprobs, -KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)


@register_kl_estimator("k1")
def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k1 = ``logp_theta - logp_ref``."""
    return -_log_ratio(logprobs, ref_logprobs)


@register_kl_estimator("k2")
def kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k2 = ``(logp_ref - logp_theta)^2 / 2``."""
    return 0.5 * _log_ratio(logprobs, ref_logprobs) ** 2


@register_kl_estimator("k3")
def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 = ``exp(x) - x - 1`` with ``x = logp_ref - logp_theta``."""
    x = _log_ratio(logprobs, ref_logprobs)
    return torch.exp(x) - x - 1.0
