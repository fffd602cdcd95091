"""Entropy bonus: a loss term that rewards keeping the policy's token distribution spread out."""

from __future__ import annotations

import torch

from cosmos_primitives.algo.registry import get_aggregation


def entropy_bonus(
    entropy: torch.Tensor,
    mask: torch.Tensor,
    coef: float,
    *,
    loss_type: str = "token-mean",
    token_count: float | torch.Tensor | None = None,
    max_tokens: int | None = None,
) -> torch.Tensor:
    """The term to add to the loss: ``-coef * aggregate(entropy)``.

    Args:
        entropy: [B, T] per-token entropy of the policy in nats, with gradient (e.g. from the
            log-prob computation, ``-(softmax * log_softmax).sum(-1)``).
        mask: [B, T], 1 on completion tokens.
        coef: ``[grpo] entropy_coeff``; positive values push the entropy up.
        loss_type, token_count, max_tokens: the aggregation, as for the policy loss.

    Returns:
        0-d tensor; its gradient is ``-coef * d aggregate / d entropy``.
    """
    return -coef * get_aggregation(loss_type)(entropy, mask, token_count=token_count, max_tokens=max_tokens)
