"""Supervised fine-tuning loss: masked negative log-likelihood, token-mean over all data-parallel ranks.

Each rank back-propagates ``local_nll_sum * world / global_tokens``. FSDP2 (and DDP) *average*
gradients over the data-parallel ranks, so the gradient every rank ends up with is
``sum_ranks grad(local_nll_sum) / global_tokens``: the gradient of the mean NLL over every trained
token of the global batch, however unevenly the tokens fall on the ranks (packed rows of prompts
and answers of different lengths). A plain per-rank mean would over-weight the tokens of ranks
that hold few of them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from cosmos_primitives.algo.logprobs import IGNORE_INDEX


def trained_mask(labels_or_mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` bool of trained positions: ``labels != -100`` for integer labels, the mask itself
    for a bool / float mask; position 0 never counts (nothing predicts it)."""
    if labels_or_mask.dtype.is_floating_point or labels_or_mask.dtype == torch.bool:
        mask = labels_or_mask.bool().clone()
    else:
        mask = labels_or_mask != IGNORE_INDEX
    if mask.ndim != 2:
        raise ValueError(f"labels / mask must be [B, T], got shape {tuple(mask.shape)}")
    mask[:, 0] = False
    return mask


def _group_size(group: dist.ProcessGroup | None) -> int:
    return dist.get_world_size(group) if dist.is_initialized() else 1


def sft_token_weights(
    labels_or_mask: torch.Tensor,
    *,
    group: dist.ProcessGroup | None = None,
    token_count: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """``[B, T]`` float32 weights with ``sum(weights * logprobs)`` = the loss :func:`sft_loss` returns.

    Pass them as ``loss_weights`` to ``cp.policy.token_logprobs`` to have the LM head compute the
    loss and its gradient in one pass (three LM-head GEMMs instead of four), then hand the result's
    ``weighted_sum`` to :func:`sft_loss`. ``group`` and ``token_count`` as for :func:`sft_loss`;
    without ``token_count`` this all-reduces the batch's token count over ``group``.
    """
    mask = trained_mask(labels_or_mask)
    world = _group_size(group)
    if token_count is None:
        tokens = mask.sum().to(torch.float64)
        if world > 1:
            dist.all_reduce(tokens, op=dist.ReduceOp.SUM, group=group)
    else:
        tokens = torch.as_tensor(token_count, dtype=torch.float64)
    scale = (world / tokens.clamp(min=1e-12)).to(torch.float32).to(mask.device)
    return torch.where(mask, -scale, torch.zeros((), device=mask.device))


def sft_loss(
    logprobs: torch.Tensor,
    labels_or_mask: torch.Tensor,
    *,
    group: dist.ProcessGroup | None = None,
    token_count: float | torch.Tensor | None = None,
    weighted_sum: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token-mean NLL of the trained positions across the data-parallel ``group``.

    Args:
        logprobs: ``[B, T]`` float32 per-token log-probs (``cp.policy.token_logprobs(...).logprobs``;
            ``logprobs[:, t]`` scores ``input_ids[:, t]``).
        labels_or_mask: ``[B, T]`` HF labels (-100 = not trained) or a bool / 0-1 mask.
        group: the ranks whose gradients FSDP averages: ``mesh.group("dp")`` (dp_replicate x
            dp_shard; not tp, whose ranks see the same tokens). None = the default group (or a
            single process).
        token_count: global number of trained tokens to divide by, e.g. summed over the
            micro-batches of one optimizer step with gradient accumulation; default: this
            batch's count all-reduced over ``group``.
        weighted_sum: the ``weighted_sum`` of ``cp.policy.token_logprobs(..., loss_weights=w)``
            with ``w = sft_token_weights(labels_or_mask, group=group, token_count=token_count)``:
            the loss with its gradient computed in the forward pass. It is returned as ``loss``;
            ``logprobs`` (then detached) only feed ``stats``.

    Returns:
        ``(loss, stats)``: ``loss`` 0-d, to call ``backward()`` on (its *value* is this rank's
        share scaled by the group size, not the global mean); ``stats``: ``"loss"`` = the global
        mean NLL in nats (detached), ``"tokens"`` = the global trained-token count. One
        all-reduce of two numbers.
    """
    mask = trained_mask(labels_or_mask)
    if logprobs.shape != mask.shape:
        raise ValueError(f"logprobs {tuple(logprobs.shape)} and labels {tuple(mask.shape)} must have the same [B, T]")
    nll_sum = -torch.where(mask, logprobs, torch.zeros_like(logprobs)).sum()
    totals = torch.stack([mask.sum().to(torch.float64), nll_sum.detach().to(torch.float64)])
    world = _group_size(group)
    if world > 1:
        dist.all_reduce(totals, op=dist.ReduceOp.SUM, group=group)
    tokens = totals[0] if token_count is None else torch.as_tensor(token_count, dtype=torch.float64)
    denominator = (tokens / world).clamp(min=1e-12).to(logprobs.dtype).to(logprobs.device)
    loss = nll_sum / denominator if weighted_sum is None else weighted_sum
    stats = {
        "loss": (totals[1] / totals[0].clamp(min=1.0)).to(torch.float32),
        "tokens": totals[0].to(torch.float32),
    }
    return loss, stats
