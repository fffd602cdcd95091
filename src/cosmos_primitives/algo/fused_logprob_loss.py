"""A loss that is a fixed weighted sum of log-probs, with its gradients computed in the forward pass.

:func:`~cosmos_primitives.algo.logprobs.chunked_selective_log_softmax` accepts any upstream
gradient, so its backward recomputes every chunk's logits: four ``[tokens x hidden x vocab]``
GEMMs per forward + backward where full logits need three. When the loss is
``sum_t w_t log p(target_t)`` with weights ``w`` known before the forward (supervised fine-tuning:
``w_t = -1 / tokens`` on trained positions), the gradient of each chunk is known as soon as its
logits are, ``w_t (onehot(target_t) - softmax_t)``; this module turns it into the hidden-state and
LM-head gradients right there and keeps them for the backward, which only scales them by the
incoming gradient. Three GEMMs, and still one float32 ``[chunk_size, vocab]`` buffer at a time.
"""

from __future__ import annotations

import torch

from cosmos_primitives.algo.logprobs import (
    TokenLogProbs,
    accumulate_head_grads,
    check_head_inputs,
    chunk_logits,
    scatter_scored,
    scored_rows,
    softmax_dtype,
)


class _FusedWeightedLogProbSum(torch.autograd.Function):
    """``(sum_i w_i log p(target_i), log p [N])`` for rows of ``hidden`` [N, H] against ``weight`` [V, H]."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, token_weights, chunk_size, need_hidden, need_weight):  # type: ignore[override]
        n_tokens, vocab = hidden.shape[0], weight.shape[0]
        dtype = softmax_dtype(weight)
        w = token_weights.to(dtype)
        logprobs = hidden.new_empty(n_tokens, dtype=dtype)
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=dtype, device=weight.device) if need_weight else None
        buf = hidden.new_empty(min(chunk_size, n_tokens), vocab, dtype=dtype)
        for start in range(0, n_tokens, chunk_size):
            sl = slice(start, min(start + chunk_size, n_tokens))
            h, t, w_c = hidden[sl], targets[sl, None], w[sl, None]
            logits = chunk_logits(h, weight, buf)
            target_logit = logits.gather(1, t).squeeze(1)
            row_max = logits.amax(dim=1, keepdim=True)
            exp = logits.sub_(row_max).exp_()
            total = exp.sum(dim=1, keepdim=True)
            logprobs[sl] = target_logit - (row_max + total.log()).squeeze(1)
            if grad_hidden is None and grad_weight is None:
                continue
            # d(w_t logp_t)/dz = w_t (onehot(t) - p),  p = exp / total
            grad_logits = exp.mul_(-w_c / total).scatter_add_(1, t, w_c)
            accumulate_head_grads(grad_logits, h, weight, sl, grad_hidden, grad_weight)
        ctx.grads = (grad_hidden, grad_weight, weight.dtype)
        ctx.mark_non_differentiable(logprobs)
        return (w * logprobs).sum(), logprobs

    @staticmethod
    def backward(ctx, grad_total, _grad_logprobs):  # type: ignore[override]
        if ctx.grads is None:
            raise RuntimeError(
                "the fused log-prob loss keeps one set of gradients and can be back-propagated once; "
                "do not use retain_graph=True through it (use token_logprobs without loss_weights instead)"
            )
        grad_hidden, grad_weight, weight_dtype = ctx.grads
        ctx.grads = None
        if grad_hidden is not None:
            grad_hidden = grad_hidden.mul_(grad_total.to(grad_hidden.dtype))
        if grad_weight is not None:
            grad_weight = grad_weight.mul_(grad_total.to(grad_weight.dtype)).to(weight_dtype)
        return grad_hidden, grad_weight, None, None, None, None, None


def fused_weighted_logprob_sum(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    token_weights: torch.Tensor,
    *,
    chunk_size: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sum_i w_i log p(target_i | hidden_i)``, differentiable, with its gradients computed in forward.

    Args:
        hidden: ``[N, H]`` final hidden states, one row per predicted token.
        weight: ``[V, H]`` LM-head weight.
        targets: ``[N]`` int64 token ids in ``[0, V)``.
        token_weights: ``[N]`` constants ``w`` (no gradient flows into them).
        chunk_size: rows per chunk; extra memory is one float32 ``[chunk_size, V]`` buffer plus
            the gradients themselves (``[N, H]`` and a float32 ``[V, H]``), held until backward.

    Returns:
        ``(total, logprobs)``: ``total`` 0-d float32 (float64 for float64 inputs), differentiable
        w.r.t. ``hidden`` and ``weight``, back-propagated at most once; ``logprobs`` ``[N]``
        detached. Under ``torch.no_grad`` (or with neither input requiring grad) no gradient is
        computed and the cost is that of the log-probs alone.
    """
    hidden, targets = check_head_inputs(hidden, weight, targets, chunk_size)
    if token_weights.shape != targets.shape:
        raise ValueError(f"token_weights {tuple(token_weights.shape)} must be [N] like targets {tuple(targets.shape)}")
    if hidden.shape[0] == 0:
        zero = (hidden.sum() + weight.sum()).to(softmax_dtype(weight)) * 0.0
        return zero, hidden.new_zeros(0, dtype=softmax_dtype(weight))
    grad_on = torch.is_grad_enabled()
    return _FusedWeightedLogProbSum.apply(
        hidden.contiguous(), weight, targets.contiguous(), token_weights.detach(), int(chunk_size),
        grad_on and hidden.requires_grad, grad_on and weight.requires_grad,
    )


def weighted_logprobs_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    input_ids: torch.Tensor,
    loss_weights: torch.Tensor,
    *,
    labels: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    chunk_size: int = 1024,
) -> TokenLogProbs:
    """Per-token log-probs of a batch and the loss ``sum(loss_weights * logprobs)`` in one pass.

    The positions scored and the alignment are those of
    :func:`~cosmos_primitives.algo.logprobs.token_logprobs_from_hidden`.

    Args:
        hidden: ``[B, T, H]`` last hidden states (after the final norm).
        weight: ``[V, H]`` LM-head weight.
        input_ids: ``[B, T]`` int64 tokens.
        loss_weights: ``[B, T]`` constant weight of each position's log-prob in the loss (e.g.
            :func:`~cosmos_primitives.algo.sft_loss.sft_token_weights`); unscored positions
            do not count.
        labels, mask, chunk_size: as for ``token_logprobs_from_hidden``.

    Returns:
        :class:`TokenLogProbs` with ``logprobs`` ``[B, T]`` float32 *detached*, ``entropy`` None
        and ``weighted_sum`` the 0-d loss to call ``backward()`` on (once).
    """
    if loss_weights.shape != input_ids.shape:
        raise ValueError(f"loss_weights {tuple(loss_weights.shape)} must have the shape of input_ids "
                         f"{tuple(input_ids.shape)}")
    selected, rows, targets = scored_rows(hidden, input_ids, labels, mask)
    total, flat = fused_weighted_logprob_sum(rows, weight, targets, loss_weights[:, 1:][selected[:, 1:]],
                                             chunk_size=chunk_size)
    return TokenLogProbs(scatter_scored(selected, flat), None, total)
