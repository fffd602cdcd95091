"""Chunked selective log-softmax: exact values, gradients, alignment, and bounded memory."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cosmos_primitives.algo import lm_head_chunk
from cosmos_primitives.algo.logprobs import (
    chunked_selective_log_softmax,
    naive_token_logprobs,
    prediction_mask,
    scored_positions,
    token_logprobs_from_hidden,
)


def _inputs(b=2, t=9, h=8, v=40, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(b, t, h, generator=g, dtype=dtype).requires_grad_(True)
    weight = torch.randn(v, h, generator=g, dtype=dtype).requires_grad_(True)
    ids = torch.randint(0, v, (b, t), generator=g)
    return hidden, weight, ids


@pytest.mark.parametrize("with_entropy", [False, True])
def test_gradcheck_with_a_partial_last_chunk(with_entropy: bool) -> None:
    hidden, weight, ids = _inputs(b=1, t=8, h=5, v=11)
    rows = hidden[0, :7].detach().requires_grad_(True)

    def fn(h, w):
        lp, ent = chunked_selective_log_softmax(h, w, ids[0, 1:], chunk_size=3, with_entropy=with_entropy)
        return (lp, ent) if with_entropy else lp

    assert torch.autograd.gradcheck(fn, (rows, weight))


def test_values_entropy_and_alignment_match_full_log_softmax() -> None:
    hidden, weight, ids = _inputs()
    labels = ids.clone()
    labels[0, :4] = -100
    labels[1, 6:] = -100
    out = token_logprobs_from_hidden(hidden, weight, ids, labels=labels, chunk_size=4, with_entropy=True)

    logp_full = torch.log_softmax(hidden @ weight.t(), dim=-1)  # [B, T, V]; position t-1 predicts t
    expected = logp_full[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    entropy = -(logp_full.exp() * logp_full).sum(-1)[:, :-1]
    scored = (labels != -100)[:, 1:]
    assert out.logprobs.dtype == torch.float64 and out.logprobs.shape == ids.shape
    torch.testing.assert_close(out.logprobs[:, 1:][scored], expected[scored])
    torch.testing.assert_close(out.entropy[:, 1:][scored], entropy[scored])
    # position 0 and unscored positions are exactly 0
    assert torch.all(out.logprobs[:, 0] == 0) and torch.all(out.logprobs[:, 1:][~scored] == 0)
    assert torch.all(out.entropy[:, 1:][~scored] == 0)
    assert scored.sum() == 5 + 5  # row 0: t = 4..8, row 1: t = 1..5


def test_labels_other_than_input_ids_are_the_targets() -> None:
    hidden, weight, ids = _inputs()
    labels = torch.full_like(ids, -100)
    labels[:, 3] = (ids[:, 3] + 1) % weight.shape[0]
    out = token_logprobs_from_hidden(hidden, weight, ids, labels=labels).logprobs
    logp = torch.log_softmax(hidden[:, 2] @ weight.t(), dim=-1)
    torch.testing.assert_close(out[:, 3], logp.gather(-1, labels[:, 3:4]).squeeze(-1))


def test_gradients_equal_naive_in_float32_with_a_mask() -> None:
    hidden, weight, ids = _inputs(t=12, h=16, v=300, dtype=torch.float32, seed=1)
    mask = torch.rand(ids.shape, generator=torch.Generator().manual_seed(2)) > 0.3
    coeff = torch.randn(ids.shape, generator=torch.Generator().manual_seed(3))

    out = token_logprobs_from_hidden(hidden, weight, ids, mask=mask, chunk_size=5, with_entropy=True)
    ((out.logprobs * coeff).sum() + 0.3 * out.entropy.sum()).backward()
    grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None

    logp_full = torch.log_softmax(hidden @ weight.t(), dim=-1)
    lp = torch.nn.functional.pad(logp_full[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1), (1, 0))
    ent = torch.nn.functional.pad(-(logp_full.exp() * logp_full).sum(-1)[:, :-1], (1, 0))
    keep = prediction_mask(ids, mask=mask)
    ((torch.where(keep, lp, 0) * coeff).sum() + 0.3 * torch.where(keep, ent, 0).sum()).backward()
    torch.testing.assert_close(grads[0], hidden.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(grads[1], weight.grad, atol=1e-5, rtol=1e-4)


def test_bfloat16_inputs_match_hf_style_upcast_reference() -> None:
    hidden, weight, ids = _inputs(t=16, h=32, v=500, dtype=torch.bfloat16, seed=4)
    out = token_logprobs_from_hidden(hidden, weight, ids, chunk_size=7).logprobs
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, naive_token_logprobs(hidden, weight, ids), atol=1e-5, rtol=1e-5)
    out.sum().backward()
    assert hidden.grad.dtype == torch.bfloat16 and weight.grad.dtype == torch.bfloat16


class _LargestTensor(TorchDispatchMode):
    """Records the largest tensor any op produces (forward and backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_no_op_ever_produces_full_batch_logits() -> None:
    tokens, vocab, chunk = 65, 1000, 8
    hidden, weight, ids = _inputs(b=1, t=tokens, h=4, v=vocab, dtype=torch.float32, seed=5)
    with _LargestTensor() as chunked:
        token_logprobs_from_hidden(hidden, weight, ids, chunk_size=chunk, with_entropy=True).logprobs.sum().backward()
    with _LargestTensor() as naive:
        naive_token_logprobs(hidden, weight, ids).sum().backward()
    assert naive.largest >= (tokens - 1) * vocab
    # one [chunk, vocab] buffer is the largest thing the chunked path creates
    assert chunked.largest <= chunk * vocab


def test_invalid_inputs_raise_clear_errors() -> None:
    hidden, weight, ids = _inputs(dtype=torch.float32)
    with pytest.raises(ValueError, match=r"target ids must lie in \[0, 40\)"):
        chunked_selective_log_softmax(hidden[0], weight, torch.full((9,), -100), chunk_size=4)
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        chunked_selective_log_softmax(hidden[0], weight, ids[0], chunk_size=0)
    with pytest.raises(ValueError, match=r"labels .* must have the shape of input_ids"):
        token_logprobs_from_hidden(hidden, weight, ids, labels=ids[:, :3])


def test_nothing_to_score_gives_zeros_with_a_graph() -> None:
    hidden, weight, ids = _inputs(dtype=torch.float32)
    out = token_logprobs_from_hidden(hidden, weight, ids, labels=torch.full_like(ids, -100), with_entropy=True)
    assert torch.all(out.logprobs == 0) and torch.all(out.entropy == 0)
    out.logprobs.sum().backward()
    assert torch.all(weight.grad == 0)


def test_sft_loss_is_the_masked_token_mean_and_accepts_masks() -> None:
    from cosmos_primitives.algo.sft_objective import sft_loss

    logprobs = (-torch.arange(1.0, 13.0)).reshape(2, 6).clone().requires_grad_(True)
    labels = torch.full((2, 6), -100)
    labels[0, 0] = 5  # position 0 is never trained, even when labelled
    labels[0, 4:] = 1
    labels[1, 2] = 1
    loss, stats = sft_loss(logprobs, labels)
    assert stats["tokens"] == 3
    torch.testing.assert_close(loss, torch.tensor((5.0 + 6.0 + 9.0) / 3))
    torch.testing.assert_close(stats["loss"], loss.detach())
    loss.backward()
    expected_grad = torch.zeros(2, 6)
    expected_grad[0, 4:] = expected_grad[1, 2] = -1.0 / 3
    torch.testing.assert_close(logprobs.grad, expected_grad)

    same, _ = sft_loss(logprobs, labels != -100)
    torch.testing.assert_close(same, loss)
    # gradient accumulation: divide by the step's token count, not this micro-batch's
    half, stats = sft_loss(logprobs, labels, token_count=6)
    torch.testing.assert_close(half, loss / 2)
    assert stats["tokens"] == 3
    empty, stats = sft_loss(logprobs, torch.full((2, 6), -100))
    assert empty.item() == 0 and stats["loss"] == 0 and stats["tokens"] == 0


def test_scored_positions_are_found_on_the_host_and_match_the_mask() -> None:
    hidden, weight, ids = _inputs(dtype=torch.float32)
    labels = torch.full_like(ids, -100)
    labels[0, 0] = 3  # position 0 is never scored
    labels[0, 5:] = ids[0, 5:]
    labels[1, 2] = (ids[1, 2] + 1) % weight.shape[0]
    positions = scored_positions(ids, labels=labels)
    want = prediction_mask(ids, labels=labels).flatten().nonzero().squeeze(1)
    assert torch.equal(positions.index, want) and torch.equal(positions.rows, want - 1)
    assert torch.equal(positions.targets, torch.where(labels != -100, labels, ids).flatten()[want])
    assert positions.shape == (2, 9) and positions.to("cpu") is positions
    given = token_logprobs_from_hidden(hidden, weight, ids, positions=positions).logprobs
    torch.testing.assert_close(given, token_logprobs_from_hidden(hidden, weight, ids, labels=labels).logprobs)
    with pytest.raises(ValueError, match=r"positions were found for a batch of shape \(2, 9\), not \(1, 9\)"):
        token_logprobs_from_hidden(hidden[:1], weight, ids[:1], positions=positions)


def test_eager_epilogue_equals_the_math_the_compiled_one_runs() -> None:
    """The compiled epilogue is ``torch.compile`` of ``_stats_math`` / ``_grad_math_``; run uncompiled
    here (compiling takes tens of seconds on a CPU), they equal the column-blocked eager epilogue
    over several blocks, with and without entropy, in bf16 and float64."""
    for dtype, tol in ((torch.bfloat16, dict(rtol=1e-5, atol=1e-6)), (torch.float64, dict(rtol=1e-12, atol=1e-14))):
        g = torch.Generator().manual_seed(6)
        hidden = torch.randn(5, 16, generator=g).to(dtype)
        weight = torch.randn(2500, 16, generator=g).to(dtype)
        targets = torch.randint(0, 2500, (5,), generator=g)
        g_lp, g_ent = torch.randn(5, generator=g, dtype=torch.float64), torch.randn(5, generator=g, dtype=torch.float64)
        head = lm_head_chunk.HeadChunks(hidden, weight, 5, "eager")
        head.block = 1000  # three column blocks, the last one partial
        f = head.dtype
        for with_entropy in (False, True):
            z = head.chunk_logits(slice(0, 5))
            eager = head.stats(z, targets, with_entropy)
            math = lm_head_chunk._stats_math(z, targets, f, with_entropy)
            for a, b in zip(eager, math, strict=True):
                if a is not None:
                    torch.testing.assert_close(a, b, **tol)
            lse, entropy = eager[1], eager[2]
            ent_args = (g_ent.to(f), entropy) if with_entropy else (None, None)
            grad_eager = head.logits_grad_(z.clone(), targets, lse, g_lp.to(f), *ent_args)
            grad_math = z.clone()
            lm_head_chunk._grad_math_(grad_math, targets, lse, g_lp.to(f), *ent_args, f)
            torch.testing.assert_close(grad_eager.to(f), grad_math.to(f), **tol)


def test_bfloat16_weight_gradient_accumulated_over_chunks_stays_near_the_naive_heads_error() -> None:
    """The LM-head gradient accumulates chunk by chunk in bf16 (one rounding per chunk, as Liger):
    with 16 chunks its error against exact math on the same bf16 logits stays within 4x the naive
    head's (one bf16 GEMM over all tokens); one chunk gives the naive head's error."""
    g = torch.Generator().manual_seed(8)
    tokens, vocab, width = 1025, 2000, 32
    hidden64 = torch.randn(1, tokens, width, generator=g, dtype=torch.float64).to(torch.bfloat16).double()
    weight64 = (0.3 * torch.randn(vocab, width, generator=g, dtype=torch.float64)).to(torch.bfloat16).double()
    ids = torch.randint(0, vocab, (1, tokens), generator=g)
    coeff = torch.rand(1, tokens, generator=g)

    def weight_grad(fn, dtype):
        weight = weight64.to(dtype).detach().requires_grad_(True)
        fn(hidden64.to(dtype), weight).backward()
        return weight.grad.double()

    def exact(h, w):  # float64 softmax of the bf16-rounded logits: what every bf16 head computes
        logits = (h[:, :-1] @ w.t()).to(torch.bfloat16).double()
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        return (logp * coeff[:, 1:].double()).sum()

    reference = weight_grad(exact, torch.float64)

    def error(grad: torch.Tensor) -> float:
        return float((grad - reference).norm() / reference.norm())

    naive = error(weight_grad(lambda h, w: (naive_token_logprobs(h, w, ids) * coeff).sum(), torch.bfloat16))
    chunked = {chunk: error(weight_grad(lambda h, w, c=chunk: (token_logprobs_from_hidden(
        h, w, ids, chunk_size=c).logprobs * coeff).sum(), torch.bfloat16)) for chunk in (64, 1024)}
    assert naive < 5e-3
    assert chunked[1024] <= 1.01 * naive
    assert naive < chunked[64] <= 4 * naive


@pytest.mark.gpu
def test_cuda_compiled_epilogue_matches_eager_and_heads_make_no_host_sync() -> None:
    """On a GPU: the compiled epilogue (the CUDA default) gives the eager one's log-probs, entropy
    and gradients in bf16; the general and fused heads' forward + backward make no host sync."""
    from cosmos_primitives.algo.fused_logprob_loss import weighted_logprobs_from_hidden
    from cosmos_primitives.testing.host_sync import HostSyncCounter

    assert lm_head_chunk.resolve_epilogue("auto", torch.device("cuda")) == "compiled"
    g = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(2, 700, 64, device="cuda", generator=g).to(torch.bfloat16)
    weight = (0.3 * torch.randn(30000, 64, device="cuda", generator=g)).to(torch.bfloat16)
    ids = torch.randint(0, 30000, (2, 700), device="cuda", generator=g)
    coeff = torch.rand(2, 700, device="cuda", generator=g)
    positions = scored_positions(ids.cpu(), mask=torch.ones(2, 700)).to("cuda")

    def run(epilogue: str) -> tuple[torch.Tensor, ...]:
        h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        out = token_logprobs_from_hidden(h, w, ids, positions=positions, chunk_size=512, with_entropy=True,
                                         epilogue=epilogue)
        ((out.logprobs * coeff).sum() + 0.1 * out.entropy.sum()).backward()
        fused = weighted_logprobs_from_hidden(h, w, ids, coeff, positions=positions, chunk_size=512,
                                              epilogue=epilogue)
        fused.weighted_sum.backward()
        return out.logprobs, out.entropy, h.grad.float(), w.grad.float(), fused.logprobs

    eager, compiled = run("eager"), run("compiled")
    for a, b in zip(eager, compiled, strict=True):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-3)
    for epilogue in ("eager", "compiled"):
        with HostSyncCounter() as syncs:
            run(epilogue)
        assert not syncs.counts, syncs.places
