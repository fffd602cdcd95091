"""A teacher model's log-probs of the student's own rollouts, for on-policy distillation
(``cosmos_primitives.algo.distillation``)."""

from __future__ import annotations

import torch

from cosmos_primitives.data.rollout_batch import RolloutBatch
from cosmos_primitives.policy.lm_policy import token_logprobs


@torch.no_grad()
def teacher_logprobs(teacher: torch.nn.Module, batch: RolloutBatch, *, micro_batch: int = 8,
                     temperature: float = 1.0, chunk_size: int | None = None) -> torch.Tensor:
    """Per-token log-probs under ``teacher`` of the tokens the student sampled: ``[N, T]`` float32.

    Args:
        teacher: a ``cp.policy.CausalLMPolicy`` (sharded or not) or a plain HF causal LM / VLM with
            the student's tokenizer (the ids are scored as they are; a teacher with another
            vocabulary cannot score them).
        batch: the student's rollouts (``collate_rollouts``): ``N`` rows, ``completion_mask`` ``[N, T]``.
        micro_batch: rows per teacher forward.
        temperature: score ``logits / temperature`` (the student's sampling temperature, so that the
            divergence compares the two distributions the student's tokens were drawn from).
        chunk_size: tokens per LM-head chunk.

    Returns:
        ``[N, T]`` on the batch's device, 0 where ``completion_mask`` is 0.
    """
    rows = [slice(i, min(i + max(1, micro_batch), len(batch))) for i in range(0, len(batch), max(1, micro_batch))]
    parts = [token_logprobs(teacher, batch.rows(r), mask=batch.completion_mask[r], chunk_size=chunk_size,
                            temperature=temperature).logprobs for r in rows]
    mask = batch.completion_mask
    return torch.cat(parts).to(mask.device).float() * mask.to(torch.float32)
