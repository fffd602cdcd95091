"""Per-token log-probs with the decoder split over a context-parallel group
(:mod:`cosmos_primitives.parallel.context_parallel`).

Each cp rank pads the batch to a multiple of the group size, runs the backbone (the decoder on its
own slice), and scores the tokens its slice predicts: hidden state ``t`` predicts token ``t + 1``, so
rank ``r`` with slice ``[s, e)`` scores global positions ``[s + 1, e + 1)``. The per-rank scores are
gathered into the full ``[B, T]`` tensor (and a fused loss sum is all-reduced) so that every rank
computes the same loss; gradients come back to each rank for its own tokens only.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from cosmos_primitives.algo.fused_logprob_loss import weighted_logprobs_from_hidden
from cosmos_primitives.algo.logprobs import TokenLogProbs, token_logprobs_from_hidden
from cosmos_primitives.parallel.context_parallel import (
    GatherSequence,
    SumAcross,
    context_parallel_split,
    enable_context_parallel,
    text_positions,
)


def _pad(x: torch.Tensor | None, extra: int, value: float | int) -> torch.Tensor | None:
    """Right-pad the last (sequence) dim of ``x`` by ``extra``."""
    return x if x is None or extra == 0 else F.pad(x, (0, extra), value=value)


def context_parallel_token_logprobs(
    hf_model: torch.nn.Module,
    backbone: torch.nn.Module,
    head_weight: torch.Tensor,
    input_ids: torch.Tensor,
    group: dist.ProcessGroup,
    *,
    labels: torch.Tensor | None,
    mask: torch.Tensor | None,
    chunk_size: int,
    with_entropy: bool,
    temperature: float,
    loss_weights: torch.Tensor | None,
    **model_inputs: Any,
) -> TokenLogProbs:
    """:func:`cosmos_primitives.policy.lm_policy.hf_token_logprobs` over a cp group (same contract).

    Args:
        head_weight: ``[V, H]`` LM head (replicated).
        input_ids: ``[B, T]``, the whole rows on every cp rank (identical across the group).
    """
    size = dist.get_world_size(group)
    batch, length = input_ids.shape
    padded = -(-length // size) * size
    extra = padded - length
    position_ids = model_inputs.get("position_ids")
    positions = text_positions(input_ids, position_ids)
    tail = torch.arange(extra, device=input_ids.device).expand(batch, extra)
    positions = torch.cat([positions, tail], dim=1)  # the tail restarts at 0: a segment of its own
    if position_ids is not None and extra:
        model_inputs["position_ids"] = torch.cat(
            [position_ids, tail.expand(*position_ids.shape[:-1], extra)], dim=-1)
    if model_inputs.get("attention_mask") is not None:
        model_inputs["attention_mask"] = _pad(model_inputs["attention_mask"], extra, 0)
    if model_inputs.get("mm_token_type_ids") is not None:
        model_inputs["mm_token_type_ids"] = _pad(model_inputs["mm_token_type_ids"], extra, 0)
    ids = _pad(input_ids, extra, 0)

    enable_context_parallel(hf_model, backbone)
    with context_parallel_split(group, padded, positions, model_inputs.get("attention_mask")) as split:
        out = backbone(input_ids=ids, use_cache=False, **model_inputs)
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]  # [B, T / cp, H]
    if temperature != 1.0:
        hidden = hidden / temperature
    start, stop = split.local.start, split.local.stop
    # positions [start, stop + 1): slot 0 is predicted by the previous rank (unscored, t = 0 of the head)
    window = slice(start, stop + 1)
    ids_w = F.pad(ids, (0, 1), value=0)[:, window]
    labels_w = None if labels is None else F.pad(labels, (0, padded + 1 - length), value=-100)[:, window]
    mask_w = None if mask is None else F.pad(mask, (0, padded + 1 - length), value=0)[:, window]
    hidden_w = torch.cat([hidden, hidden.new_zeros(batch, 1, hidden.shape[-1])], dim=1)
    if labels_w is None and mask_w is None:  # score every real position t >= 1 (not the padding)
        mask_w = (torch.arange(start, stop + 1, device=ids.device) < length).expand(batch, -1).long()
    if loss_weights is not None:
        weights_w = F.pad(loss_weights, (0, padded + 1 - length), value=0)[:, window]
        local = weighted_logprobs_from_hidden(hidden_w, head_weight, ids_w, weights_w, labels=labels_w,
                                              mask=mask_w, chunk_size=chunk_size)
    else:
        local = token_logprobs_from_hidden(hidden_w, head_weight, ids_w, labels=labels_w, mask=mask_w,
                                           chunk_size=chunk_size, with_entropy=with_entropy)

    def gathered(part: torch.Tensor) -> torch.Tensor:
        full = GatherSequence.apply(part[:, 1:].contiguous(), group)  # positions [1, padded + 1)
        return torch.cat([full.new_zeros(batch, 1), full], dim=1)[:, :length]

    logprobs = gathered(local.logprobs)
    entropy = None if local.entropy is None else gathered(local.entropy)
    weighted = None if local.weighted_sum is None else SumAcross.apply(local.weighted_sum, group)
    return TokenLogProbs(logprobs, entropy, weighted)
