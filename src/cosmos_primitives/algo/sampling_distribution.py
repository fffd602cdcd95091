"""The distribution a rollout engine samples from: ``logits / temperature``, then top-k, then top-p,
renormalised over the kept tokens.

One definition for both sides of an importance ratio: the HF engine's sampler
(:class:`~cosmos_primitives.rollout.token_sampler.InverseCDFSampler`) draws from it and reports
its log-probs, vLLM reports the same quantity as ``logprobs_mode = "processed_logprobs"``, and the
trainer scores the sampled tokens under it (``cp.policy.token_logprobs(..., top_k=, top_p=)``).
Without the same filtering on the trainer's side, every ratio of a ``top_p < 1`` or ``top_k > 0``
rollout is biased by the mass the engine dropped.

The kept set follows vLLM's ``apply_top_k_top_p``: the ``top_k`` largest logits (ties with the
k-th kept), then, on the distribution renormalised over those, the smallest prefix of the tokens
sorted by probability whose mass reaches ``top_p`` (a token is kept when the mass before it is below
``top_p``; the most likely token always is).
"""

from __future__ import annotations

import torch
import torch.utils.checkpoint

from cosmos_primitives.algo.logprobs import ScoredPositions, TokenLogProbs, scatter_scored, scored_inputs


def filtering_active(top_k: int, top_p: float, vocab_size: int | None = None) -> bool:
    """Whether ``top_k`` / ``top_p`` drop anything (``top_k`` in ``{-1, 0}`` or >= vocab and ``top_p = 1``: no)."""
    k_on = top_k > 0 and (vocab_size is None or top_k < vocab_size)
    return k_on or top_p < 1.0


def sampling_keep_mask(logits: torch.Tensor, top_k: int = -1, top_p: float = 1.0) -> torch.Tensor:
    """``[N, V]`` bool: the tokens the sampler may draw from temperature-scaled ``logits`` ``[N, V]``.

    Args:
        logits: ``[N, V]`` float logits, already divided by the temperature.
        top_k: keep the ``top_k`` largest (``-1`` or ``0``: off).
        top_p: keep the smallest most-likely set with mass >= ``top_p`` (``1.0``: off), in (0, 1].
    """
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p} ([rollout.sampling_config] top_p)")
    logits = logits.detach().float()
    keep = torch.ones_like(logits, dtype=torch.bool)
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        keep = logits >= kth
    if top_p < 1.0:
        probs = torch.softmax(logits.masked_fill(~keep, float("-inf")), dim=-1)
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs
        keep_sorted = before < top_p
        keep_sorted[..., 0] = True
        keep = keep & torch.zeros_like(keep).scatter(-1, order, keep_sorted)
    return keep


def sampling_logprobs(logits: torch.Tensor, temperature: float = 1.0, top_k: int = -1, top_p: float = 1.0,
                      always_keep: torch.Tensor | None = None) -> torch.Tensor:
    """``[N, V]`` float32 log-probs of the sampling distribution (``-inf`` on dropped tokens).

    Differentiable w.r.t. ``logits`` (the kept set is a constant of the backward).

    Args:
        logits: ``[N, V]`` raw logits (any float dtype).
        temperature: > 0.
        top_k, top_p: as :func:`sampling_keep_mask`.
        always_keep: ``[N]`` int64 token ids added to the kept set (the trainer passes the sampled
            tokens: at the rollout's weights they are always in the set, and after an update a
            token that fell out of it keeps a finite log-prob instead of ``-inf``).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 to score a sampling distribution, got {temperature}")
    # x / 1.0 == x exactly: skip the pass over [N, V] (most rollouts sample at temperature 1)
    scaled = logits.float() / temperature if temperature != 1.0 else logits.float()
    if not filtering_active(top_k, top_p, scaled.shape[-1]):
        return torch.log_softmax(scaled, dim=-1)
    keep = sampling_keep_mask(scaled, top_k, top_p)
    if always_keep is not None:
        keep = keep.scatter(-1, always_keep.view(-1, 1).to(torch.int64), True)
    return torch.log_softmax(scaled.masked_fill(~keep, float("-inf")), dim=-1)


def _chunk_scores(rows: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, top_k: int, top_p: float,
                  with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    logp = sampling_logprobs(rows @ weight.t(), 1.0, top_k, top_p, always_keep=targets)  # [n, V]
    picked = logp.gather(-1, targets[:, None]).squeeze(-1)
    if not with_entropy:
        return picked, picked.new_zeros(0)
    p = logp.exp()
    return picked, -(p * logp.masked_fill(p == 0, 0.0)).sum(-1)


def filtered_token_logprobs_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    input_ids: torch.Tensor,
    *,
    top_k: int = -1,
    top_p: float = 1.0,
    labels: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    positions: ScoredPositions | None = None,
    chunk_size: int = 1024,
    with_entropy: bool = False,
) -> TokenLogProbs:
    """Per-token log-probs under the top-k / top-p filtered, renormalised distribution of ``hidden @ weight.T``.

    The trainer's side of :func:`sampling_logprobs`, aligned as
    :func:`~cosmos_primitives.algo.logprobs.token_logprobs_from_hidden` (whose arguments these are;
    divide ``hidden`` by the temperature first). The scored token is always in the kept set (see
    ``always_keep``). Each chunk's ``[chunk_size, V]`` float32 logits are recomputed in the
    backward (activation checkpointing), so memory is one chunk's, but the LM head runs in
    float32 and the fused losses do not apply: about twice the head's cost of the unfiltered path.

    Returns:
        :class:`TokenLogProbs` of ``[B, T]`` float32 (entropy of the filtered distribution when asked).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 ([policy] logprob_chunk_size), got {chunk_size}")
    positions, rows = scored_inputs(hidden, input_ids, labels, mask, positions)
    weight = weight.float()
    rows = rows.float()
    logps, entropies = [], []
    for start in range(0, rows.shape[0], chunk_size):
        args = (rows[start:start + chunk_size], weight, positions.targets[start:start + chunk_size], top_k, top_p,
                with_entropy)
        if torch.is_grad_enabled() and (rows.requires_grad or weight.requires_grad):
            logp, entropy = torch.utils.checkpoint.checkpoint(_chunk_scores, *args, use_reentrant=False)
        else:
            logp, entropy = _chunk_scores(*args)
        logps.append(logp)
        entropies.append(entropy)
    flat_lp = torch.cat(logps) if logps else rows.sum(-1) + 0.0 * weight.sum()
    entropy = scatter_scored(positions, torch.cat(entropies) if logps else flat_lp) if with_entropy else None
    return TokenLogProbs(scatter_scored(positions, flat_lp), entropy)
