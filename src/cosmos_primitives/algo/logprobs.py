"""Per-token log-probs and entropy over a large vocabulary without full float32 logits.

A naive ``log_softmax(hidden @ W.T)`` over Qwen's 151,936-token vocabulary holds float32
``[tokens, vocab]`` tensors (5 GB at 8,192 tokens) in the forward *and* several of them in the
backward. Here the LM head is applied to ``chunk_size`` tokens at a time inside a custom autograd
function: the forward keeps only the log-sum-exp (and entropy) per token, and the backward
recomputes each chunk's logits. Each chunk's logits live in one ``[chunk_size, vocab]`` buffer in
the weight's dtype, reused from chunk to chunk; the softmax runs in float32 from it without a
float32 tensor of the buffer's size (:mod:`~cosmos_primitives.algo.lm_head_chunk`).

Alignment (the HF causal-LM convention, labels aligned with ``input_ids``)::

    logprobs[b, t] = log p(targets[b, t] | tokens[b, :t])   for t >= 1 where mask[b, t]
    logprobs[b, 0] = 0, and 0 wherever mask is False
    hidden[b, t - 1] is the state that predicts position t

``targets`` are usually ``input_ids``; ``mask`` is e.g. ``labels != -100`` (SFT) or the completion
mask (GRPO). Only masked positions are computed, so a prompt-heavy batch costs only its answers.
Which positions those are is a shape, so it is found where the labels / mask live
(:func:`scored_positions`): on the host for a loader's CPU batch, so that a GPU forward and backward
never wait for the device.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from cosmos_primitives.algo.lm_head_chunk import HeadChunks, softmax_dtype

IGNORE_INDEX = -100


class TokenLogProbs(NamedTuple):
    """Per-token outputs, aligned with ``input_ids``.

    logprobs: ``[B, T]`` float32, log p(token t | tokens < t) in nats; 0 at t = 0 and off the mask.
    entropy: ``[B, T]`` float32 entropy of the predictive distribution at t in nats (same
        alignment), or None when not requested.
    weighted_sum: 0-d loss whose gradient the head formed in its forward, when the log-probs were
        computed with ``loss_weights`` (``sum(loss_weights * logprobs)``) or a ``token_loss``
        (:mod:`~cosmos_primitives.algo.fused_logprob_loss`; ``logprobs`` and ``entropy`` are then
        detached and this is the tensor to back-propagate), else None.
    """

    logprobs: torch.Tensor
    entropy: torch.Tensor | None = None
    weighted_sum: torch.Tensor | None = None


class ScoredPositions(NamedTuple):
    """The positions of a ``[B, T]`` batch that a head scores, as flat indices (:func:`scored_positions`).

    index: ``[N]`` int64 ``b * T + t`` of each scored position (t >= 1), in row-major order.
    rows: ``[N]`` int64 ``index - 1``: the flat row of ``hidden`` [B * T, H] that predicts it.
    targets: ``[N]`` int64 token id scored there.
    shape: ``(B, T)``.
    """

    index: torch.Tensor
    rows: torch.Tensor
    targets: torch.Tensor
    shape: tuple[int, int]

    def to(self, device: torch.device | str) -> ScoredPositions:
        """On ``device``: one non-blocking copy of the three index vectors (no host sync)."""
        target = torch.device(device)
        if self.index.device.type == target.type and target.index in (None, self.index.device.index):
            return self
        stacked = torch.stack([self.index, self.rows, self.targets])
        if target.type == "cuda" and stacked.device.type == "cpu":
            # from pageable memory the driver may wait for the stream before copying
            stacked = stacked.pin_memory()
        index, rows, targets = stacked.to(device, non_blocking=True)
        return ScoredPositions(index, rows, targets, self.shape)


def scored_positions(input_ids: torch.Tensor, *, labels: torch.Tensor | None = None,
                     mask: torch.Tensor | None = None) -> ScoredPositions:
    """The positions :func:`prediction_mask` selects, and their targets (``labels`` there, else ``input_ids``).

    Computed where the tensors are: call it on the loader's CPU tensors (free); on a GPU it waits
    for the device once (``nonzero``).
    """
    selected = prediction_mask(input_ids, labels, mask)
    index = selected.flatten().nonzero().squeeze(1)
    source = input_ids if labels is None else torch.where(selected, labels, input_ids)
    batch, length = input_ids.shape
    return ScoredPositions(index, index - 1, source.flatten().index_select(0, index).to(torch.int64),
                           (batch, length))


class _ChunkedSelectiveLogSoftmax(torch.autograd.Function):
    """``(log p(target), entropy)`` per row of ``hidden`` [N, H] against ``weight`` [V, H]."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_size, with_entropy, epilogue):  # type: ignore[override]
        head = HeadChunks(hidden, weight, chunk_size, epilogue)
        n_tokens = hidden.shape[0]
        logprobs = hidden.new_empty(n_tokens, dtype=head.dtype)
        lse = hidden.new_empty(n_tokens, dtype=head.dtype)
        entropy = hidden.new_empty(n_tokens if with_entropy else 0, dtype=head.dtype)
        for rows in head.slices():
            logp, chunk_lse, chunk_entropy = head.stats(head.chunk_logits(rows), targets[rows], with_entropy)
            logprobs[rows] = logp
            lse[rows] = chunk_lse
            if with_entropy:
                entropy[rows] = chunk_entropy
        ctx.save_for_backward(hidden, weight, targets, lse, entropy)
        ctx.chunk_size, ctx.with_entropy, ctx.epilogue, ctx.block = chunk_size, with_entropy, epilogue, head.block
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):  # type: ignore[override]
        hidden, weight, targets, lse, entropy = ctx.saved_tensors
        head = HeadChunks(hidden, weight, ctx.chunk_size, ctx.epilogue, ctx.block)
        if grad_logprobs is None:
            grad_logprobs = torch.zeros_like(lse)
        grad_logprobs = grad_logprobs.to(head.dtype)
        use_entropy = ctx.with_entropy and grad_entropy is not None
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = weight.new_empty(weight.shape) if ctx.needs_input_grad[1] else None
        for i, rows in enumerate(head.slices()):
            grad_logits = head.logits_grad_(
                head.chunk_logits(rows), targets[rows], lse[rows], grad_logprobs[rows],
                grad_entropy[rows].to(head.dtype) if use_entropy else None, entropy[rows] if use_entropy else None)
            head.add_head_grads(grad_logits, rows, grad_hidden, grad_weight, first=i == 0)
        return grad_hidden, grad_weight, None, None, None, None


def check_head_inputs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                      chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate rows for a chunked LM head; returns ``hidden`` in the weight's dtype, int64 targets.

    Target ids are range-checked on the host for CPU targets, and by a device-side assertion
    (``torch._assert_async``: no host sync) on a GPU."""
    if hidden.ndim != 2 or weight.ndim != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden {tuple(hidden.shape)} must be [N, H] and weight {tuple(weight.shape)} [V, H]")
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"targets {tuple(targets.shape)} must be [N] with N = {hidden.shape[0]} rows of hidden")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 ([policy] logprob_chunk_size), got {chunk_size}")
    targets = targets.to(torch.int64)
    vocab = weight.shape[0]
    advice = "(mask out ignored positions such as -100 labels before calling)"
    if targets.numel() and targets.device.type == "cpu":
        low, high = int(targets.min()), int(targets.max())
        if low < 0 or high >= vocab:
            raise ValueError(f"target ids must lie in [0, {vocab}); got min {low}, max {high} {advice}")
    elif targets.numel():
        torch._assert_async(((targets >= 0) & (targets < vocab)).all(), f"target ids must lie in [0, {vocab}) {advice}")
    return hidden.to(weight.dtype), targets


def chunked_selective_log_softmax(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_size: int = 1024,
    with_entropy: bool = False,
    epilogue: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of one target per row (and optionally the entropy), chunked over rows.

    Args:
        hidden: ``[N, H]`` final hidden states (any float dtype), one row per predicted token.
        weight: ``[V, H]`` LM-head weight (same dtype as ``hidden``).
        targets: ``[N]`` int64 token ids in ``[0, V)``.
        chunk_size: rows per chunk; the logits buffer is ``chunk_size * V`` elements of the
            weight's dtype, e.g. 297 MiB for 1,024 rows of Qwen's vocabulary in bf16.
        with_entropy: also return the entropy of each row's distribution (differentiable).
        epilogue: ``"auto"``, ``"eager"`` or ``"compiled"``
            (:func:`~cosmos_primitives.algo.lm_head_chunk.resolve_epilogue`).

    Returns:
        ``(logprobs [N] float32, entropy [N] float32 or None)``, in nats (float64 for float64
        inputs); differentiable w.r.t. ``hidden`` and ``weight``. The backward recomputes each
        chunk's logits: four LM-head GEMMs in all (three with a frozen head).
    """
    hidden, targets = check_head_inputs(hidden, weight, targets, chunk_size)
    if hidden.shape[0] == 0:
        empty = hidden.sum(dim=1).to(softmax_dtype(weight.dtype)) + 0.0 * weight.sum()
        return empty, (empty if with_entropy else None)
    logprobs, entropy = _ChunkedSelectiveLogSoftmax.apply(
        hidden.contiguous(), weight, targets.contiguous(), int(chunk_size), bool(with_entropy), epilogue
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


def scored_inputs(hidden: torch.Tensor, input_ids: torch.Tensor, labels: torch.Tensor | None,
                  mask: torch.Tensor | None,
                  positions: ScoredPositions | None) -> tuple[ScoredPositions, torch.Tensor]:
    """``(positions, rows [N, H])``: the scored positions (``positions`` moved to ``hidden``'s
    device, else found from ``labels`` / ``mask``) and the hidden state that predicts each."""
    if hidden.ndim != 3 or hidden.shape[:2] != input_ids.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} must be [B, T, H] with [B, T] = {tuple(input_ids.shape)}")
    if positions is None:
        positions = scored_positions(input_ids, labels=labels, mask=mask)
    elif positions.shape != tuple(input_ids.shape):
        raise ValueError(f"positions were found for a batch of shape {positions.shape}, not {tuple(input_ids.shape)}")
    positions = positions.to(hidden.device)
    return positions, hidden.reshape(-1, hidden.shape[-1]).index_select(0, positions.rows)


def scatter_scored(positions: ScoredPositions, flat: torch.Tensor) -> torch.Tensor:
    """``[B, T]``: ``flat`` [N] at the scored positions, 0 elsewhere (differentiable)."""
    batch, length = positions.shape
    zeros = torch.zeros(batch * length, dtype=flat.dtype, device=flat.device)
    return zeros.scatter(0, positions.index, flat).view(batch, length)


def token_logprobs_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    input_ids: torch.Tensor,
    *,
    labels: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    positions: ScoredPositions | None = None,
    chunk_size: int = 1024,
    with_entropy: bool = False,
    epilogue: str = "auto",
) -> TokenLogProbs:
    """Per-token log-probs (and entropy) of a batch from last hidden states and the LM-head weight.

    Args:
        hidden: ``[B, T, H]`` last hidden states (after the final norm).
        weight: ``[V, H]`` LM-head weight (tied or not).
        input_ids: ``[B, T]`` int64 tokens.
        labels: ``[B, T]`` HF-style labels aligned with ``input_ids`` (-100 = not trained); scored
            positions use ``labels[b, t]`` as the target (equal to ``input_ids`` in the usual case).
        mask: ``[B, T]`` bool/0-1 positions to score when ``labels`` is None (e.g. completion mask).
        positions: the scored positions, found beforehand (e.g. on the host) with
            :func:`scored_positions`; ``labels`` and ``mask`` are then not read.
        chunk_size: tokens per LM-head chunk (``[policy] logprob_chunk_size``).
        with_entropy: also return the per-token entropy (with gradient).
        epilogue: as for :func:`chunked_selective_log_softmax`.

    Returns:
        :class:`TokenLogProbs` of ``[B, T]`` float32 tensors, 0 at t = 0 and on unscored positions.
    """
    positions, rows = scored_inputs(hidden, input_ids, labels, mask, positions)
    flat_lp, flat_ent = chunked_selective_log_softmax(rows, weight, positions.targets, chunk_size=chunk_size,
                                                      with_entropy=with_entropy, epilogue=epilogue)
    entropy = scatter_scored(positions, flat_ent) if flat_ent is not None else None
    return TokenLogProbs(scatter_scored(positions, flat_lp), entropy)


def naive_token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Reference: ``log_softmax`` of full float32 logits, same alignment (for tests and benchmarks).

    Materialises ``[B, T, V]`` float32; use :func:`token_logprobs_from_hidden` in training.
    """
    logits = (hidden[:, :-1] @ weight.t()).float()
    logp = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(logp, (1, 0))
