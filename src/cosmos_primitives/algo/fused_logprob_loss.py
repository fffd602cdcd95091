"""Losses that are sums of per-token terms, with the LM head's gradients computed in the forward pass.

:func:`~cosmos_primitives.algo.logprobs.chunked_selective_log_softmax` accepts any upstream
gradient, so its backward recomputes every chunk's logits: four ``[tokens x hidden x vocab]``
GEMMs per forward + backward where full logits need three. When the loss is a sum of per-token
terms, each depending only on its own token's log-prob (and entropy) once some constants are known
before the forward, its gradient with respect to a chunk's logits is known as soon as the chunk's
log-probs are:

- SFT, ``sum_t w_t log p(target_t)`` with constant weights (``w_t = -1 / tokens``):
  :func:`fused_weighted_logprob_sum`, :func:`weighted_logprobs_from_hidden`;
- any ``token_loss(logprobs [n], entropy [n] | None, rows) -> [n]`` per-token contributions
  (GRPO's PPO-clip, KL, entropy bonus and behaviour weights with a linear aggregation:
  :func:`cosmos_primitives.algo.grpo_objective.grpo_token_loss`), differentiated per chunk by autograd
  on the chunk's small vectors: :func:`fused_token_loss`, :func:`token_loss_from_hidden`.

The head turns that gradient into the hidden-state and LM-head gradients right there and keeps them
for the backward, which only scales them by the incoming gradient. Three GEMMs, the same logits
buffer as the general head (:mod:`~cosmos_primitives.algo.lm_head_chunk`), plus the gradients held
from forward to backward (``[N, H]`` and ``[V, H]``, the inputs' dtype).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from cosmos_primitives.algo.lm_head_chunk import HeadChunks, softmax_dtype
from cosmos_primitives.algo.logprobs import (
    ScoredPositions,
    TokenLogProbs,
    check_head_inputs,
    scatter_scored,
    scored_inputs,
)

TokenLoss = Callable[[torch.Tensor, "torch.Tensor | None", slice], torch.Tensor]
"""``token_loss(logprobs [n], entropy [n] or None, rows) -> [n]``: the loss contributions of the
scored tokens ``rows`` (a slice of the head's ``N`` rows, in order), each a function of its own
token's log-prob and entropy only; differentiable in both."""

# (logprobs [n], entropy [n] | None, rows, with gradients) -> (loss sum 0-d, dL/dlogp [n] | None, dL/dH [n] | None)
_ChunkTerms = Callable[[torch.Tensor, "torch.Tensor | None", slice, bool],
                       "tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]"]


class _FusedTokenLoss(torch.autograd.Function):
    """``(sum of per-token losses, log p [N], entropy [N])`` for rows of ``hidden`` [N, H] against
    ``weight`` [V, H], the gradients of the sum formed in forward."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, terms, chunk_size, with_entropy,  # type: ignore[override]
                need_hidden, need_weight, epilogue):
        head = HeadChunks(hidden, weight, chunk_size, epilogue)
        n_tokens = hidden.shape[0]
        logprobs = hidden.new_empty(n_tokens, dtype=head.dtype)
        entropy = hidden.new_empty(n_tokens if with_entropy else 0, dtype=head.dtype)
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = weight.new_empty(weight.shape) if need_weight else None
        need_grads = need_hidden or need_weight
        total = hidden.new_zeros((), dtype=head.dtype)
        for i, rows in enumerate(head.slices()):
            logits, chunk_targets = head.chunk_logits(rows), targets[rows]
            logp, lse, chunk_entropy = head.stats(logits, chunk_targets, with_entropy)
            logprobs[rows] = logp
            if with_entropy:
                entropy[rows] = chunk_entropy
            loss, g_lp, g_ent = terms(logp, chunk_entropy, rows, need_grads)
            total += loss
            if need_grads:
                grad_logits = head.logits_grad_(logits, chunk_targets, lse, g_lp, g_ent,
                                                chunk_entropy if g_ent is not None else None)
                head.add_head_grads(grad_logits, rows, grad_hidden, grad_weight, first=i == 0)
        ctx.grads = (grad_hidden, grad_weight)
        ctx.mark_non_differentiable(logprobs, entropy)
        return total, logprobs, entropy

    @staticmethod
    def backward(ctx, grad_total, _grad_logprobs, _grad_entropy):  # type: ignore[override]
        if ctx.grads is None:
            raise RuntimeError(
                "the fused log-prob loss keeps one set of gradients and can be back-propagated once; "
                "do not use retain_graph=True through it (use token_logprobs without loss_weights / token_loss)"
            )
        grad_hidden, grad_weight = ctx.grads
        ctx.grads = None
        if grad_hidden is not None:
            grad_hidden = grad_hidden.mul_(grad_total.to(grad_hidden.dtype))
        if grad_weight is not None:
            grad_weight = grad_weight.mul_(grad_total.to(grad_weight.dtype))
        return grad_hidden, grad_weight, None, None, None, None, None, None, None


def _fused(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, terms: _ChunkTerms, chunk_size: int,
           with_entropy: bool, epilogue: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(total, logprobs [N], entropy [N] or None)`` through :class:`_FusedTokenLoss` (inputs checked)."""
    dtype = softmax_dtype(weight.dtype)
    if hidden.shape[0] == 0:
        zero = (hidden.sum() + weight.sum()).to(dtype) * 0.0
        empty = hidden.new_zeros(0, dtype=dtype)
        return zero, empty, (empty if with_entropy else None)
    grad_on = torch.is_grad_enabled()
    total, logprobs, entropy = _FusedTokenLoss.apply(
        hidden.contiguous(), weight, targets.contiguous(), terms, int(chunk_size), bool(with_entropy),
        grad_on and hidden.requires_grad, grad_on and weight.requires_grad, epilogue)
    return total, logprobs, (entropy if with_entropy else None)


def fused_token_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    token_loss: TokenLoss,
    *,
    chunk_size: int = 1024,
    with_entropy: bool = False,
    epilogue: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``sum_i token_loss(log p_i, H_i)``, differentiable, with its head gradients computed in forward.

    Args:
        hidden: ``[N, H]`` final hidden states, one row per predicted token.
        weight: ``[V, H]`` LM-head weight.
        targets: ``[N]`` int64 token ids in ``[0, V)``.
        token_loss: :data:`TokenLoss`, called once per chunk with that chunk's log-probs (and
            entropies with ``with_entropy``) as leaves that require grad; its gradient with respect
            to them is taken with ``torch.autograd.grad`` on those ``[chunk]`` vectors.
        chunk_size, epilogue: as for :func:`~cosmos_primitives.algo.logprobs.chunked_selective_log_softmax`.
        with_entropy: compute each row's entropy and hand it to ``token_loss``.

    Returns:
        ``(total, logprobs, entropy)``: ``total`` 0-d float32 (float64 for float64 inputs),
        differentiable w.r.t. ``hidden`` and ``weight``, back-propagated at most once;
        ``logprobs`` / ``entropy`` ``[N]`` detached (entropy None without ``with_entropy``).
        Under ``torch.no_grad`` no gradient is formed.
    """
    hidden, targets = check_head_inputs(hidden, weight, targets, chunk_size)
    return _fused(hidden, weight, targets, _autograd_terms(token_loss), chunk_size, with_entropy, epilogue)


def _autograd_terms(token_loss: TokenLoss) -> _ChunkTerms:
    def terms(logp: torch.Tensor, entropy: torch.Tensor | None, rows: slice,
              need_grads: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        with torch.enable_grad():
            leaves = [logp.detach().requires_grad_(need_grads)]
            if entropy is not None:
                leaves.append(entropy.detach().requires_grad_(need_grads))
            per_token = token_loss(leaves[0], leaves[1] if entropy is not None else None, rows)
            if per_token.shape != logp.shape:
                raise ValueError(f"token_loss must return one loss per token, [{logp.shape[0]}]; "
                                 f"got {tuple(per_token.shape)} for rows {rows.start}:{rows.stop}")
            total = per_token.sum()
            if not need_grads:
                return total.to(logp.dtype), None, None
            grads = (torch.autograd.grad(total, leaves, allow_unused=True) if total.requires_grad
                     else [None] * len(leaves))
        g_lp = torch.zeros_like(logp) if grads[0] is None else grads[0].to(logp.dtype)
        g_ent = grads[1].to(logp.dtype) if len(grads) > 1 and grads[1] is not None else None
        return total.detach().to(logp.dtype), g_lp, g_ent

    return terms


def fused_weighted_logprob_sum(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    token_weights: torch.Tensor,
    *,
    chunk_size: int = 1024,
    epilogue: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sum_i w_i log p(target_i | hidden_i)``, differentiable, with its gradients computed in forward.

    Args:
        hidden: ``[N, H]`` final hidden states, one row per predicted token.
        weight: ``[V, H]`` LM-head weight.
        targets: ``[N]`` int64 token ids in ``[0, V)``.
        token_weights: ``[N]`` constants ``w`` (no gradient flows into them).
        chunk_size, epilogue: as for :func:`~cosmos_primitives.algo.logprobs.chunked_selective_log_softmax`;
            besides the logits buffer, the gradients (``[N, H]`` and ``[V, H]``, the inputs'
            dtype) are held until backward.

    Returns:
        ``(total, logprobs)``: ``total`` 0-d float32 (float64 for float64 inputs), differentiable
        w.r.t. ``hidden`` and ``weight``, back-propagated at most once; ``logprobs`` ``[N]``
        detached. Under ``torch.no_grad`` (or with neither input requiring grad) no gradient is
        computed and the cost is that of the log-probs alone.
    """
    hidden, targets = check_head_inputs(hidden, weight, targets, chunk_size)
    if token_weights.shape != targets.shape:
        raise ValueError(f"token_weights {tuple(token_weights.shape)} must be [N] like targets {tuple(targets.shape)}")
    w = token_weights.detach().to(softmax_dtype(weight.dtype))

    def terms(logp: torch.Tensor, _entropy: torch.Tensor | None, rows: slice,
              _need_grads: bool) -> tuple[torch.Tensor, torch.Tensor, None]:
        # d(w_t log p_t) / d log p_t = w_t: no autograd needed
        return (w[rows] * logp).sum(), w[rows], None

    total, logprobs, _ = _fused(hidden, weight, targets, terms, chunk_size, False, epilogue)
    return total, logprobs


def weighted_logprobs_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    input_ids: torch.Tensor,
    loss_weights: torch.Tensor,
    *,
    labels: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    positions: ScoredPositions | None = None,
    chunk_size: int = 1024,
    epilogue: str = "auto",
) -> TokenLogProbs:
    """Per-token log-probs of a batch and the loss ``sum(loss_weights * logprobs)`` in one pass.

    The positions scored and the alignment are those of
    :func:`~cosmos_primitives.algo.logprobs.token_logprobs_from_hidden`.

    Args:
        hidden: ``[B, T, H]`` last hidden states (after the final norm).
        weight: ``[V, H]`` LM-head weight.
        input_ids: ``[B, T]`` int64 tokens.
        loss_weights: ``[B, T]`` constant weight of each position's log-prob in the loss (e.g.
            :func:`~cosmos_primitives.algo.sft_objective.sft_token_weights`); unscored positions
            do not count.
        labels, mask, positions, chunk_size, epilogue: as for ``token_logprobs_from_hidden``.

    Returns:
        :class:`TokenLogProbs` with ``logprobs`` ``[B, T]`` float32 *detached*, ``entropy`` None
        and ``weighted_sum`` the 0-d loss to call ``backward()`` on (once).
    """
    if loss_weights.shape != input_ids.shape:
        raise ValueError(f"loss_weights {tuple(loss_weights.shape)} must have the shape of input_ids "
                         f"{tuple(input_ids.shape)}")
    positions, rows = scored_inputs(hidden, input_ids, labels, mask, positions)
    token_weights = loss_weights.to(hidden.device).flatten().index_select(0, positions.index)
    total, flat = fused_weighted_logprob_sum(rows, weight, positions.targets, token_weights, chunk_size=chunk_size,
                                             epilogue=epilogue)
    return TokenLogProbs(scatter_scored(positions, flat), None, total)


def token_loss_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    input_ids: torch.Tensor,
    token_loss: TokenLoss,
    *,
    labels: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    positions: ScoredPositions | None = None,
    chunk_size: int = 1024,
    with_entropy: bool = False,
    epilogue: str = "auto",
) -> TokenLogProbs:
    """Per-token log-probs (and entropy) of a batch and the loss ``sum(token_loss(...))`` in one pass.

    Args:
        hidden, weight, input_ids, labels, mask, positions, chunk_size, with_entropy, epilogue: as for
            :func:`~cosmos_primitives.algo.logprobs.token_logprobs_from_hidden`.
        token_loss: :data:`TokenLoss`; its ``rows`` index the scored positions in row-major order
            of ``[B, T]`` (the order of ``ScoredPositions.index``), so per-token constants can be
            gathered beforehand with ``constants.flatten()[positions.index]``.

    Returns:
        :class:`TokenLogProbs` with ``logprobs`` (and ``entropy``) ``[B, T]`` float32 *detached* and
        ``weighted_sum`` the 0-d loss to call ``backward()`` on (once).
    """
    positions, rows = scored_inputs(hidden, input_ids, labels, mask, positions)
    total, flat_lp, flat_ent = fused_token_loss(rows, weight, positions.targets, token_loss, chunk_size=chunk_size,
                                                with_entropy=with_entropy, epilogue=epilogue)
    entropy = scatter_scored(positions, flat_ent) if flat_ent is not None else None
    return TokenLogProbs(scatter_scored(positions, flat_lp), entropy, total)
