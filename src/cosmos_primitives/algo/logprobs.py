"""Per-token log-probs and entropy over a large vocabulary without full float32 logits.

A naive ``log_softmax(hidden @ W.T)`` over Qwen's 151,936-token vocabulary holds float32
``[tokens, vocab]`` tensors (5 GB at 8,192 tokens) in the forward *and* several of them in the
backward. Here the LM head is applied to ``chunk_size`` tokens at a time inside a custom autograd
function: the forward keeps only the log-sum-exp per token, and the backward recomputes each
chunk's logits, so both passes hold at most one (two with entropy) float32 ``[chunk_size, vocab]``
buffer, reused from chunk to chunk.

Alignment (the HF causal-LM convention, labels aligned with ``input_ids``)::

    logprobs[b, t] = log p(targets[b, t] | tokens[b, :t])   for t >= 1 where mask[b, t]
    logprobs[b, 0] = 0, and 0 wherever mask is False
    hidden[b, t - 1] is the state that predicts position t

``targets`` are usually ``input_ids``; ``mask`` is e.g. ``labels != -100`` (SFT) or the completion
mask (GRPO). Only masked positions are computed, so a prompt-heavy batch costs only its answers.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

IGNORE_INDEX = -100


class TokenLogProbs(NamedTuple):
    """Per-token outputs, aligned with ``input_ids``.

    logprobs: ``[B, T]`` float32, log p(token t | tokens < t) in nats; 0 at t = 0 and off the mask.
    entropy: ``[B, T]`` float32 entropy of the predictive distribution at t in nats (same
        alignment), or None when not requested.
    weighted_sum: 0-d ``sum(loss_weights * logprobs)`` when the log-probs were computed with
        ``loss_weights`` (:mod:`~cosmos_primitives.algo.fused_logprob_loss`; ``logprobs`` are then
        detached and this is the tensor to back-propagate), else None.
    """

    logprobs: torch.Tensor
    entropy: torch.Tensor | None = None
    weighted_sum: torch.Tensor | None = None


def softmax_dtype(weight: torch.Tensor) -> torch.dtype:
    """float32 for the softmax, float64 kept (for gradcheck-grade references)."""
    return torch.float64 if weight.dtype == torch.float64 else torch.float32


def chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out[:n] = hidden @ weight.T`` in ``out``'s dtype (``hidden`` [n, H], ``weight`` [V, H])."""
    n = hidden.shape[0]
    buf = out[:n]
    if hidden.dtype == out.dtype and weight.dtype == out.dtype:
        torch.mm(hidden, weight.t(), out=buf)
    else:
        # Low-precision GEMM (fp32 accumulation inside), rounded once, then softmax in float32:
        # the same numerics as HF's ``lm_head(...).float()``, which rollout engines match.
        buf.copy_(hidden @ weight.t())
    return buf


def accumulate_head_grads(grad_logits: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, rows: slice,
                          grad_hidden: torch.Tensor | None, grad_weight: torch.Tensor | None) -> None:
    """One chunk's share of the LM-head gradients, from ``grad_logits`` [n, V] (softmax dtype).

    Writes ``grad_hidden[rows] = grad_logits @ weight`` ([N, H], the weight's dtype) and adds
    ``grad_logits.T @ hidden`` ([V, H]) to ``grad_weight`` (float32 / float64, summed over chunks);
    either may be None (not needed). ``hidden`` [n, H] holds the chunk's rows.
    """
    grad_low = grad_logits.to(weight.dtype)
    if grad_hidden is not None:
        grad_hidden[rows] = grad_low @ weight
    if grad_weight is not None:
        if weight.dtype == grad_weight.dtype:
            grad_weight.addmm_(grad_low.t(), hidden)
        else:
            # per-chunk GEMM in the weight's dtype, accumulated over chunks in float32
            grad_weight.add_(grad_low.t() @ hidden)


class _ChunkedSelectiveLogSoftmax(torch.autograd.Function):
    """``(log p(target), entropy)`` per row of ``hidden`` [N, H] against ``weight`` [V, H]."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_size, with_entropy):  # type: ignore[override]
        n_tokens = hidden.shape[0]
        vocab = weight.shape[0]
        dtype = softmax_dtype(weight)
        logprobs = hidden.new_empty(n_tokens, dtype=dtype)
        lse = hidden.new_empty(n_tokens, dtype=dtype)
        entropy = hidden.new_empty(n_tokens if with_entropy else 0, dtype=dtype)
        rows = min(chunk_size, n_tokens)
        buf = hidden.new_empty(rows, vocab, dtype=dtype)
        probs = hidden.new_empty(rows, vocab, dtype=dtype) if with_entropy else None
        for start in range(0, n_tokens, chunk_size):
            sl = slice(start, min(start + chunk_size, n_tokens))
            logits = chunk_logits(hidden[sl], weight, buf)
            target_logit = logits.gather(1, targets[sl, None]).squeeze(1)
            row_max = logits.amax(dim=1, keepdim=True)
            if with_entropy:
                exp = probs[: logits.shape[0]]
                torch.sub(logits, row_max, out=exp).exp_()
                total = exp.sum(dim=1)
                # sum_j e_j * z_j as a batched dot product: no [n, V] temporary
                weighted = torch.bmm(exp.unsqueeze(1), logits.unsqueeze(2)).view(-1)
                chunk_lse = row_max.squeeze(1) + total.log()
                entropy[sl] = chunk_lse - weighted / total
            else:
                chunk_lse = row_max.squeeze(1) + logits.sub_(row_max).exp_().sum(dim=1).log()
            lse[sl] = chunk_lse
            logprobs[sl] = target_logit - chunk_lse
        ctx.save_for_backward(hidden, weight, targets, lse, entropy)
        ctx.chunk_size = chunk_size
        ctx.with_entropy = with_entropy
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):  # type: ignore[override]
        hidden, weight, targets, lse, entropy = ctx.saved_tensors
        chunk_size, with_entropy = ctx.chunk_size, ctx.with_entropy
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        n_tokens, vocab = hidden.shape[0], weight.shape[0]
        if grad_logprobs is None:
            grad_logprobs = torch.zeros_like(lse)
        use_entropy = with_entropy and grad_entropy is not None
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        dtype = softmax_dtype(weight)
        grad_weight = torch.zeros(weight.shape, dtype=dtype, device=weight.device) if need_weight else None
        rows = min(chunk_size, n_tokens)
        buf = hidden.new_empty(rows, vocab, dtype=dtype)
        probs = hidden.new_empty(rows, vocab, dtype=dtype) if use_entropy else None
        for start in range(0, n_tokens, chunk_size):
            sl = slice(start, min(start + chunk_size, n_tokens))
            h = hidden[sl]
            g_lp = grad_logprobs[sl, None]
            # d logp_t / dz = onehot(t) - p ;  d H / dz = -p * (log p + H)
            logp = chunk_logits(h, weight, buf).sub_(lse[sl, None])
            if use_entropy:
                p = torch.exp(logp, out=probs[: logp.shape[0]])
                grad_logits = logp.add_(entropy[sl, None]).mul_(-grad_entropy[sl, None]).sub_(g_lp).mul_(p)
            else:
                grad_logits = logp.exp_().mul_(-g_lp)
            grad_logits.scatter_add_(1, targets[sl, None], g_lp)
            accumulate_head_grads(grad_logits, h, weight, sl, grad_hidden, grad_weight)
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None


def check_head_inputs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                      chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate rows for a chunked LM head; returns ``hidden`` in the weight's dtype, int64 targets."""
    if hidden.ndim != 2 or weight.ndim != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden {tuple(hidden.shape)} must be [N, H] and weight {tuple(weight.shape)} [V, H]")
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"targets {tuple(targets.shape)} must be [N] with N = {hidden.shape[0]} rows of hidden")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 ([policy] logprob_chunk_size), got {chunk_size}")
    targets = targets.to(torch.int64)
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= weight.shape[0]):
        raise ValueError(
            f"target ids must lie in [0, {weight.shape[0]}); got min {int(targets.min())}, max {int(targets.max())} "
            f"(mask out ignored positions such as -100 labels before calling)"
        )
    return hidden.to(weight.dtype), targets


def chunked_selective_log_softmax(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_size: int = 1024,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of one target per row (and optionally the entropy), chunked over rows.

    Args:
        hidden: ``[N, H]`` final hidden states (any float dtype), one row per predicted token.
        weight: ``[V, H]`` LM-head weight (same dtype as ``hidden``).
        targets: ``[N]`` int64 token ids in ``[0, V)``.
        chunk_size: rows per chunk; peak extra memory is ``chunk_size * V * 4`` bytes (x2 with
            entropy), e.g. 622 MB for 1,024 rows of Qwen's vocabulary.
        with_entropy: also return the entropy of each row's distribution (differentiable).

    Returns:
        ``(logprobs [N] float32, entropy [N] float32 or None)``, in nats (float64 for float64
        inputs); differentiable w.r.t. ``hidden`` and ``weight``.
    """
    hidden, targets = check_head_inputs(hidden, weight, targets, chunk_size)
    if hidden.shape[0] == 0:
        empty = hidden.sum(dim=1).to(softmax_dtype(weight)) + 0.0 * weight.sum()
        return empty, (empty if with_entropy else None)
    logprobs, entropy = _ChunkedSelectiveLogSoftmax.apply(
        hidden.contiguous(), weight, targets.contiguous(), int(chunk_size), bool(with_entropy)
    )
    return logprobs, (entropy if with_entropy else None)


def prediction_mask(input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, T]`` bool: positions t >= 1 whose token is scored.

    ``labels != -100`` when labels are given, else ``mask`` (e.g. a completion mask), else every
    position; position 0 is never scored (nothing predicts it).
    """
    if labels is not None:
        if labels.shape != input_ids.shape:
            raise ValueError(f"labels {tuple(labels.shape)} must have the shape of input_ids {tuple(input_ids.shape)}")
        selected = labels != IGNORE_INDEX
    elif mask is not None:
        if mask.shape != input_ids.shape:
            raise ValueError(f"mask {tuple(mask.shape)} must have the shape of input_ids {tuple(input_ids.shape)}")
        selected = mask.bool()
    else:
        selected = torch.ones_like(input_ids, dtype=torch.bool)
    selected = selected.clone()
    selected[:, 0] = False
    return selected


def token_logprobs_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    input_ids: torch.Tensor,
    *,
    labels: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    chunk_size: int = 1024,
    with_entropy: bool = False,
) -> TokenLogProbs:
    """Per-token log-probs (and entropy) of a batch from last hidden states and the LM-head weight.

    Args:
        hidden: ``[B, T, H]`` last hidden states (after the final norm).
        weight: ``[V, H]`` LM-head weight (tied or not).
        input_ids: ``[B, T]`` int64 tokens.
        labels: ``[B, T]`` HF-style labels aligned with ``input_ids`` (-100 = not trained); scored
            positions use ``labels[b, t]`` as the target (equal to ``input_ids`` in the usual case).
        mask: ``[B, T]`` bool/0-1 positions to score when ``labels`` is None (e.g. completion mask).
        chunk_size: tokens per LM-head chunk (``[policy] logprob_chunk_size``).
        with_entropy: also return the per-token entropy (with gradient).

    Returns:
        :class:`TokenLogProbs` of ``[B, T]`` float32 tensors, 0 at t = 0 and on unscored positions.
    """
    selected, rows, targets = scored_rows(hidden, input_ids, labels, mask)
    flat_lp, flat_ent = chunked_selective_log_softmax(rows, weight, targets, chunk_size=chunk_size,
                                                      with_entropy=with_entropy)
    entropy = scatter_scored(selected, flat_ent) if flat_ent is not None else None
    return TokenLogProbs(scatter_scored(selected, flat_lp), entropy)


def scored_rows(hidden: torch.Tensor, input_ids: torch.Tensor, labels: torch.Tensor | None,
                mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(selected [B, T] bool, rows [N, H], targets [N])``: the hidden state predicting each scored
    position (``hidden[:, t - 1]`` predicts token t) and its target, N = ``selected.sum()``."""
    if hidden.ndim != 3 or hidden.shape[:2] != input_ids.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} must be [B, T, H] with [B, T] = {tuple(input_ids.shape)}")
    selected = prediction_mask(input_ids, labels, mask)
    targets = input_ids if labels is None else torch.where(selected, labels, input_ids)
    return selected, hidden[:, :-1][selected[:, 1:]], targets[:, 1:][selected[:, 1:]]


def scatter_scored(selected: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """``[B, T]``: ``flat`` [N] at the scored positions of ``selected`` [B, T], 0 elsewhere."""
    return torch.zeros(selected.shape, dtype=flat.dtype, device=flat.device).masked_scatter(selected, flat)


def naive_token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Reference: ``log_softmax`` of full float32 logits, same alignment (for tests and benchmarks).

    Materialises ``[B, T, V]`` float32; use :func:`token_logprobs_from_hidden` in training.
    """
    logits = (hidden[:, :-1] @ weight.t()).float()
    logp = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(logp, (1, 0))
