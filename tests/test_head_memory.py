"""The log-prob heads at full size (8,192 tokens, Qwen's 151,936-token vocabulary, hidden 1,536,
bf16) on ``meta`` tensors: forward + backward keep at most 1/10 of the naive head's peak bytes and
never hold a float32 tensor with V columns. Nothing is computed, so this takes seconds on a CPU;
``TensorMemoryTracker`` gives the naive head the 14,244 MiB an H200 measured for it."""

from __future__ import annotations

import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives.config import GRPOConfig
from cosmos_primitives.testing.memory import TensorMemoryTracker

TOKENS, VOCAB, HIDDEN = 8192, 151936, 1536
MiB = 2**20


def _inputs():
    hidden = torch.empty(1, TOKENS + 1, HIDDEN, dtype=torch.bfloat16, device="meta", requires_grad=True)
    weight = torch.empty(VOCAB, HIDDEN, dtype=torch.bfloat16, device="meta", requires_grad=True)
    grad_out = torch.empty(1, TOKENS + 1, device="meta")
    return hidden, weight, grad_out


IDS = torch.randint(0, VOCAB, (1, TOKENS + 1), generator=torch.Generator().manual_seed(0))  # on the host


def _grpo_loss(hidden, weight, grad_out, chunk):
    mask = torch.ones(1, TOKENS + 1)
    positions = cp.algo.scored_positions(IDS, mask=mask)
    host = dict(mask=mask, old=-torch.rand(1, TOKENS + 1), ref=-torch.rand(1, TOKENS + 1), advantages=torch.randn(1))
    on_meta = {k: v.to("meta") for k, v in host.items()}
    token_loss = cp.algo.grpo_token_loss(on_meta["old"], on_meta["advantages"], on_meta["mask"],
                                         positions.to("meta"), cfg=GRPOConfig(kl_beta=0.01, entropy_coeff=0.001),
                                         ref_logprobs=on_meta["ref"])
    return cp.algo.token_loss_from_hidden(hidden, weight, IDS, token_loss, positions=positions, chunk_size=chunk,
                                          with_entropy=True).weighted_sum


HEADS = {
    "naive": lambda h, w, g, chunk: (cp.algo.naive_token_logprobs(h, w, IDS.to("meta")) * g).sum(),
    "general": lambda h, w, g, chunk: (cp.algo.token_logprobs_from_hidden(h, w, IDS, chunk_size=chunk).logprobs
                                       * g).sum(),
    "general-entropy": lambda h, w, g, chunk: sum(
        (t * g).sum() for t in cp.algo.token_logprobs_from_hidden(h, w, IDS, chunk_size=chunk, with_entropy=True)[:2]),
    "fused-sft": lambda h, w, g, chunk: cp.algo.weighted_logprobs_from_hidden(h, w, IDS, g,
                                                                              chunk_size=chunk).weighted_sum,
    "fused-grpo": _grpo_loss,
}


def _peak(head: str, chunk: int) -> TensorMemoryTracker:
    hidden, weight, grad_out = _inputs()
    with TensorMemoryTracker() as tracker:
        HEADS[head](hidden, weight, grad_out, chunk).backward()
    assert hidden.grad is not None and weight.grad is not None and weight.grad.dtype == torch.bfloat16
    return tracker


@pytest.fixture(scope="module")
def naive_peak() -> int:
    tracker = _peak("naive", 0)
    assert 13_500 * MiB < tracker.peak < 15_000 * MiB  # the H200 measured 14,244 MiB
    return tracker.peak


@pytest.mark.parametrize("chunk", [1024, 2048])
@pytest.mark.parametrize("head", ["general", "general-entropy", "fused-sft", "fused-grpo"])
def test_full_size_head_keeps_a_tenth_of_naive_memory_and_no_float32_logits(head: str, chunk: int,
                                                                            naive_peak: int) -> None:
    tracker = _peak(head, chunk)
    assert tracker.peak <= naive_peak / 10, f"{head}: {tracker.peak / MiB:,.0f} MiB vs naive {naive_peak / MiB:,.0f}"
    float_logits = [shape for dtype, shape in tracker.allocations
                    if dtype in (torch.float32, torch.float64) and shape and shape[-1] == VOCAB]
    assert not float_logits
    # the largest thing is the one bf16 logits buffer of a chunk (or the head's [V, H] gradient)
    largest = max(torch.Size(shape).numel() for _, shape in tracker.allocations)
    assert largest == max(chunk * VOCAB, VOCAB * HIDDEN)
