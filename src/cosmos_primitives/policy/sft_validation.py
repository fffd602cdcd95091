"""SFT validation loss: the token-mean NLL of a held-out split, every data-parallel rank taking part.

cosmos-rl's SFT validation averages per-batch token-mean losses weighted by batch size
(``val/avg_loss``); here the value is the mean over every trained token of the split, the same
definition as the training ``loss`` (:func:`cosmos_primitives.algo.sft_objective.sft_loss`), so the two
curves compare directly and the value does not depend on how the items were batched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from cosmos_primitives.algo.sft_objective import trained_mask
from cosmos_primitives.policy.lm_policy import token_logprobs


def without_labels(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A copy of ``batch`` whose loss is zero (same shapes and model inputs, so a rank with nothing
    left to do runs the same forward and collectives as the others)."""
    return {**batch, "labels": torch.full_like(batch["labels"], -100)}


@dataclass(frozen=True)
class ValidationLoss:
    """``loss``: mean NLL (nats) per trained token over all ranks; ``tokens``: trained tokens scored."""

    loss: float
    tokens: int


def _max_over(values: list[int], device: torch.device | str, group: Any) -> list[int]:
    if not (dist.is_available() and dist.is_initialized()):
        return values
    tensor = torch.tensor(values, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return tensor.tolist()


def sft_validation_loss(policy: torch.nn.Module, loader: Any, *, samples_per_pass: int,
                        device: torch.device | str, group: Any = None, chunk_size: int | None = None,
                        ) -> ValidationLoss:
    """Score the rest of ``loader``'s epoch without gradients and return the token-mean NLL.

    Args:
        policy: a :class:`~cosmos_primitives.policy.CausalLMPolicy` (sharded or not) or a plain HF
            model; put in eval mode for the pass and given back its training mode.
        loader: this rank's :class:`~cosmos_primitives.data.SFTBatchLoader` over its share of the
            split (``cp.data.build_sft_validation_loader``); its epoch is used up and the next
            begun, so the next call scores the split again.
        samples_per_pass: samples drawn, packed and scored together (the training step's
            ``train_batch_per_replica``, so rows are packed as in training).
        device: where the collectives' flags live (``"cuda"`` under nccl).
        group: the data-parallel group whose ranks hold the other shares. Every rank of it must call
            this; ranks that run out first score copies of their last batch with no trained token,
            so FSDP's all-gathers stay matched.
        chunk_size: LM-head chunk (tokens), as for :func:`token_logprobs`.

    Raises:
        RuntimeError: a rank whose whole share was bad samples, with nothing to stand in for it.
    """
    was_training = policy.training
    policy.eval()
    nll = torch.zeros((), dtype=torch.float64, device=device)
    tokens = torch.zeros((), dtype=torch.float64, device=device)
    last: dict[str, torch.Tensor] | None = None
    try:
        with torch.no_grad():
            while True:
                micro_batches = loader.next_step(samples_per_pass)
                busy = micro_batches is not None
                micro_batches = micro_batches or []
                count, anyone_busy = _max_over([len(micro_batches), int(busy)], device, group)
                if not anyone_busy:
                    break
                if micro_batches:
                    last = micro_batches[-1]
                if len(micro_batches) < count:
                    if last is None:
                        raise RuntimeError("every validation sample of this rank was a bad sample: nothing to "
                                           "score while the other ranks go on; fix or drop those samples")
                    micro_batches += [without_labels(last)] * (count - len(micro_batches))
                for batch in micro_batches:
                    logprobs = token_logprobs(policy, batch, chunk_size=chunk_size).logprobs
                    mask = trained_mask(batch["labels"]).to(logprobs.device)
                    nll -= torch.where(mask, logprobs, torch.zeros_like(logprobs)).sum().to(nll)
                    tokens += mask.sum().to(tokens)
    finally:
        policy.train(was_training)
    loader.start_next_epoch()
    totals = torch.stack([nll, tokens])
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(totals, op=dist.ReduceOp.SUM, group=group)
    total_nll, total_tokens = totals.tolist()
    return ValidationLoss(loss=total_nll / max(total_tokens, 1.0), tokens=int(total_tokens))
