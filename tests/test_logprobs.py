"""Chunked selective log-softmax: exact values, gradients, alignment, and bounded memory."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cosmos_primitives.algo.logprobs import (
    chunked_selective_log_softmax,
    naive_token_logprobs,
    prediction_mask,
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
    from cosmos_primitives.algo.sft_loss import sft_loss

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
