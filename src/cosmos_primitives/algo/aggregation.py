"""Reducing per-token values [B, T] to the scalar that is back-propagated (``[grpo] loss_type``).

All take ``values`` [B, T] (0 or anything where ``mask == 0``) and ``mask`` [B, T] (1 on completion
tokens), and the keywords ``token_count`` and ``max_tokens`` (each uses what it needs):

- ``token-mean``: ``sum(values * mask) / token_count``, ``token_count`` defaulting to this batch's
  token count. Under data parallelism, where gradients are *averaged* over ranks, pass
  :func:`dp_mean_token_count` so the average over ranks is the mean over all ranks' tokens.
- ``seq-mean-token-sum``: mean over sequences of each sequence's token sum.
- ``seq-mean-token-mean``: mean over sequences of each sequence's token mean.
- ``seq-mean-token-sum-norm`` (Dr.GRPO): mean over sequences of ``token sum / max_tokens``, i.e.
  ``sum(values * mask) / (B * max_tokens)`` with a constant ``max_tokens``.
- ``token-sum`` (cosmos-rl's): ``sum(values * mask)``, no normaliser; the GRPO update scales each
  micro-batch's sum by its share of the step's rows, as cosmos-rl scales each mini-batch's
  (``cp.policy.grpo_update``).

Sequence means count every row of the batch (rows without tokens add 0). They need no token count
under data parallelism as long as ranks hold equally many sequences.

All five are linear in ``values`` with weights fixed by the mask: :func:`aggregation_weights` gives
them, so that a loss made of per-token terms can be summed token by token (the fused LM head of
``cp.algo.grpo_token_loss``).
"""

from __future__ import annotations

import torch

from cosmos_primitives.algo.registry import get_aggregation, register_aggregation
from cosmos_primitives.parallel.distributed import all_reduce_sum


def _masked(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if values.shape != mask.shape or values.ndim != 2:
        raise ValueError(f"values {tuple(values.shape)} and mask {tuple(mask.shape)} must both be [B, T]")
    mask = mask.to(values.dtype)
    # where(), not multiply, so that non-finite values off the mask cannot leak in as nan
    return torch.where(mask.bool(), values, torch.zeros_like(values)), mask


@register_aggregation("token-mean")
def token_mean(
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    token_count: float | torch.Tensor | None = None,
    max_tokens: int | None = None,
) -> torch.Tensor:
    """``sum(values * mask) / token_count`` (default: ``mask.sum()``); 0 for a batch without tokens."""
    values, mask = _masked(values, mask)
    if token_count is None:
        return values.sum() / mask.sum().clamp(min=1.0)
    # a per-rank mean token count may be fractional (dp_mean_token_count), so no clamp to 1 here
    return values.sum() / torch.as_tensor(token_count, dtype=values.dtype, device=values.device).clamp(min=1e-8)


@register_aggregation("seq-mean-token-sum")
def seq_mean_token_sum(
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    token_count: float | torch.Tensor | None = None,
    max_tokens: int | None = None,
) -> torch.Tensor:
    """``mean_i sum_t values[i, t] * mask[i, t]``."""
    values, _ = _masked(values, mask)
    return values.sum(-1).mean()


@register_aggregation("seq-mean-token-mean")
def seq_mean_token_mean(
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    token_count: float | torch.Tensor | None = None,
    max_tokens: int | None = None,
) -> torch.Tensor:
    """``mean_i (sum_t values[i, t] * mask[i, t] / n_i)`` with ``n_i`` the tokens of sequence i (at least 1)."""
    values, mask = _masked(values, mask)
    return (values.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()


@register_aggregation("token-sum")
def token_sum(
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    token_count: float | torch.Tensor | None = None,
    max_tokens: int | None = None,
) -> torch.Tensor:
    """``sum_{i, t} values[i, t] * mask[i, t]``."""
    values, _ = _masked(values, mask)
    return values.sum()


def _check_max_tokens(max_tokens: int | None) -> None:
    if max_tokens is None or max_tokens <= 0:
        raise ValueError(
            f"loss_type 'seq-mean-token-sum-norm' (Dr.GRPO) needs a positive max_tokens "
            f"([grpo] unbiased_loss_max_tokens, e.g. the max response length); got {max_tokens!r}"
        )


@register_aggregation("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    token_count: float | torch.Tensor | None = None,
    max_tokens: int | None = None,
) -> torch.Tensor:
    """Dr.GRPO: ``mean_i (sum_t values[i, t] * mask[i, t]) / max_tokens`` with a constant ``max_tokens``."""
    _check_max_tokens(max_tokens)
    values, _ = _masked(values, mask)
    return values.sum(-1).mean() / max_tokens


def dp_mean_token_count(mask: torch.Tensor, group: torch.distributed.ProcessGroup | None = None) -> torch.Tensor:
    """Tokens per data-parallel rank on average: ``all_reduce_sum(mask.sum()) / world_size(group)``.

    Passed as ``token_count`` to ``token-mean`` on every rank, the gradient average over ranks equals
    the gradient of the mean over all ranks' tokens, however unevenly tokens fall on ranks.
    Identity (``mask.sum()``) without a process group. Returns a 0-d float tensor on mask's device.
    """
    count = all_reduce_sum(mask.detach().to(torch.float32).sum(), group)
    world = torch.distributed.get_world_size(group) if torch.distributed.is_initialized() else 1
    return count / world


def _token_mean_weights(mask: torch.Tensor, token_count: float | torch.Tensor | None,
                        max_tokens: int | None) -> torch.Tensor:
    count = (mask.sum().clamp(min=1.0) if token_count is None
             else torch.as_tensor(token_count, dtype=mask.dtype, device=mask.device).clamp(min=1e-8))
    return (1.0 / count).expand_as(mask)


def _seq_mean_token_sum_weights(mask: torch.Tensor, token_count: float | torch.Tensor | None,
                                max_tokens: int | None) -> torch.Tensor:
    return mask.new_full(mask.shape, 1.0 / mask.shape[0])


def _token_sum_weights(mask: torch.Tensor, token_count: float | torch.Tensor | None,
                       max_tokens: int | None) -> torch.Tensor:
    return torch.ones_like(mask)


def _seq_mean_token_mean_weights(mask: torch.Tensor, token_count: float | torch.Tensor | None,
                                 max_tokens: int | None) -> torch.Tensor:
    return ((1.0 / mask.shape[0]) / mask.sum(-1, keepdim=True).clamp(min=1.0)).expand_as(mask)


def _seq_mean_token_sum_norm_weights(mask: torch.Tensor, token_count: float | torch.Tensor | None,
                                     max_tokens: int | None) -> torch.Tensor:
    _check_max_tokens(max_tokens)
    return mask.new_full(mask.shape, (1.0 / max_tokens) / mask.shape[0])


_LINEAR_WEIGHTS = {
    token_mean: _token_mean_weights,
    seq_mean_token_sum: _seq_mean_token_sum_weights,
    seq_mean_token_mean: _seq_mean_token_mean_weights,
    seq_mean_token_sum_norm: _seq_mean_token_sum_norm_weights,
    token_sum: _token_sum_weights,
}


def aggregation_weights(
    loss_type: str,
    mask: torch.Tensor,
    *,
    token_count: float | torch.Tensor | None = None,
    max_tokens: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor | None:
    """``[B, T]`` constants ``w`` with ``aggregate(values, mask) == sum(w * values)`` for any ``values``.

    ``w`` is 0 where ``mask == 0``; ``token_count`` / ``max_tokens`` as for the aggregation. None
    when ``loss_type``'s registered function is not one of the five built in here (a custom or
    overriding aggregation need not be linear). No host sync: the counts stay on ``mask``'s device.
    """
    weights_of = _LINEAR_WEIGHTS.get(get_aggregation(loss_type))
    if weights_of is None:
        return None
    if mask.ndim != 2:
        raise ValueError(f"mask {tuple(mask.shape)} must be [B, T]")
    weights = weights_of(mask.to(dtype), token_count, max_tokens)
    return torch.where(mask.bool(), weights, torch.zeros((), dtype=dtype, device=mask.device))
