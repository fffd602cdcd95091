"""Fused log-prob loss: ``sum(w * logprobs)`` with its gradient computed in the forward pass.

Values and gradients against full-logit references, the number of LM-head GEMMs (three where the
general chunked head needs four), bounded memory, the SFT weights, and a tiny Qwen2 policy whose
fused SFT gradients equal the unfused ones and Hugging Face's own loss.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives.algo.fused_logprob_loss import fused_weighted_logprob_sum, weighted_logprobs_from_hidden
from cosmos_primitives.algo.logprobs import prediction_mask, token_logprobs_from_hidden
from cosmos_primitives.algo.sft_objective import sft_loss, sft_token_weights
from cosmos_primitives.config.policy import PolicyConfig
from test_logprobs import _LargestTensor


def _inputs(b=2, t=9, h=8, v=40, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(b, t, h, generator=g, dtype=dtype).requires_grad_(True)
    weight = torch.randn(v, h, generator=g, dtype=dtype).requires_grad_(True)
    ids = torch.randint(0, v, (b, t), generator=g)
    coeff = torch.randn(b, t, generator=g, dtype=dtype)
    return hidden, weight, ids, coeff


def _reference(hidden, weight, ids, coeff, keep):
    """Full log-softmax in the inputs' dtype: (log-probs [B, T], sum(coeff * logprobs) on ``keep``)."""
    logp = torch.log_softmax(hidden[:, :-1] @ weight.t(), dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    logp = torch.where(keep, torch.nn.functional.pad(logp, (1, 0)), 0)
    return logp, (coeff * logp).sum()


@pytest.mark.parametrize("chunk_size", [1, 4, 7, 100])
def test_values_and_gradients_equal_full_logits(chunk_size: int) -> None:
    hidden, weight, ids, coeff = _inputs()
    mask = torch.rand(ids.shape, generator=torch.Generator().manual_seed(1)) > 0.3
    out = weighted_logprobs_from_hidden(hidden, weight, ids, coeff, mask=mask, chunk_size=chunk_size)
    assert not out.logprobs.requires_grad and out.entropy is None
    (3.5 * out.weighted_sum).backward()  # an upstream gradient other than 1 scales the kept gradients
    grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None

    logp, total = _reference(hidden, weight, ids, coeff, prediction_mask(ids, mask=mask))
    (3.5 * total).backward()
    torch.testing.assert_close(out.logprobs, logp.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out.weighted_sum.detach(), total.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grads[0], hidden.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grads[1], weight.grad, rtol=1e-10, atol=1e-12)


def test_log_probs_equal_the_general_chunked_head_and_labels_are_the_targets() -> None:
    hidden, weight, ids, coeff = _inputs(dtype=torch.float32, seed=2)
    labels = torch.full_like(ids, -100)
    labels[0, 3:] = ids[0, 3:]
    labels[1, 5] = (ids[1, 5] + 1) % weight.shape[0]  # a target other than the input token
    fused = weighted_logprobs_from_hidden(hidden, weight, ids, coeff, labels=labels, chunk_size=3)
    plain = token_logprobs_from_hidden(hidden, weight, ids, labels=labels, chunk_size=3).logprobs
    torch.testing.assert_close(fused.logprobs, plain.detach(), rtol=0, atol=1e-6)
    scored = prediction_mask(ids, labels=labels)
    torch.testing.assert_close(fused.weighted_sum.detach(), (coeff * plain.detach())[scored].sum())


def test_bfloat16_gradients_keep_the_dtype_and_match_the_general_head() -> None:
    hidden, weight, ids, coeff = _inputs(t=16, h=32, v=500, dtype=torch.bfloat16, seed=4)
    fused = weighted_logprobs_from_hidden(hidden, weight, ids, coeff.float(), chunk_size=7)
    fused.weighted_sum.backward()
    assert fused.logprobs.dtype == torch.float32
    assert hidden.grad.dtype == torch.bfloat16 and weight.grad.dtype == torch.bfloat16
    grads = hidden.grad.float(), weight.grad.float()
    hidden.grad = weight.grad = None
    plain = token_logprobs_from_hidden(hidden, weight, ids, chunk_size=7).logprobs
    (coeff.float() * plain).sum().backward()
    torch.testing.assert_close(fused.logprobs, plain.detach())
    torch.testing.assert_close(grads[0], hidden.grad.float(), rtol=2e-2, atol=1e-3)
    torch.testing.assert_close(grads[1], weight.grad.float(), rtol=2e-2, atol=1e-3)


def test_frozen_head_no_grad_mode_and_a_second_backward() -> None:
    hidden, weight, ids, coeff = _inputs(dtype=torch.float32)
    frozen = weight.detach()
    out = weighted_logprobs_from_hidden(hidden, frozen, ids, coeff, chunk_size=4)
    out.weighted_sum.backward()
    assert hidden.grad is not None and frozen.grad is None

    with torch.no_grad():
        quiet = weighted_logprobs_from_hidden(hidden, weight, ids, coeff, chunk_size=4)
    assert quiet.weighted_sum.grad_fn is None
    torch.testing.assert_close(quiet.logprobs, out.logprobs)

    again = weighted_logprobs_from_hidden(hidden, weight, ids, coeff, chunk_size=4).weighted_sum
    again.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="back-propagated once"):
        again.backward()


def test_nothing_to_score_still_reaches_both_inputs() -> None:
    hidden, weight, ids, coeff = _inputs(dtype=torch.float32)
    out = weighted_logprobs_from_hidden(hidden, weight, ids, coeff, labels=torch.full_like(ids, -100))
    assert out.weighted_sum.item() == 0 and torch.all(out.logprobs == 0)
    out.weighted_sum.backward()  # FSDP ranks with nothing to train still run a backward
    assert torch.all(hidden.grad == 0) and torch.all(weight.grad == 0)


def test_bad_inputs_raise_clear_errors() -> None:
    hidden, weight, ids, coeff = _inputs(dtype=torch.float32)
    with pytest.raises(ValueError, match=r"loss_weights \(2, 3\) must have the shape of input_ids \(2, 9\)"):
        weighted_logprobs_from_hidden(hidden, weight, ids, coeff[:, :3])
    with pytest.raises(ValueError, match=r"token_weights \(3,\) must be \[N\]"):
        fused_weighted_logprob_sum(hidden[0], weight, ids[0], coeff[0, :3])
    with pytest.raises(ValueError, match=r"target ids must lie in \[0, 40\)"):
        fused_weighted_logprob_sum(hidden[0], weight, torch.full((9,), 40), coeff[0])


class _HeadOps(_LargestTensor):
    """Also counts the matrix products that touch the vocabulary dimension."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab, self.gemms = vocab, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.addmm_):
            self.gemms += any(self.vocab in a.shape for a in args if isinstance(a, torch.Tensor))
        return super().__torch_dispatch__(func, types, args, kwargs)


def test_three_head_gemms_per_chunk_instead_of_four_and_bounded_memory() -> None:
    tokens, vocab, chunk = 65, 1000, 8
    hidden, weight, ids, coeff = _inputs(b=1, t=tokens, h=4, v=vocab, dtype=torch.float32, seed=5)
    chunks = -(-(tokens - 1) // chunk)
    with _HeadOps(vocab) as fused:
        weighted_logprobs_from_hidden(hidden, weight, ids, coeff, chunk_size=chunk).weighted_sum.backward()
    with _HeadOps(vocab) as general:
        (coeff * token_logprobs_from_hidden(hidden, weight, ids, chunk_size=chunk).logprobs).sum().backward()
    assert (fused.gemms, general.gemms) == (3 * chunks, 4 * chunks)
    assert fused.largest <= max(chunk * vocab, weight.numel())


def test_sft_weights_give_the_sft_loss_and_its_gradient() -> None:
    logprobs = (-torch.arange(1.0, 13.0)).reshape(2, 6).clone().requires_grad_(True)
    labels = torch.full((2, 6), -100)
    labels[0, 0] = 5  # position 0 is never trained
    labels[0, 4:] = 1
    labels[1, 2] = 1
    loss, stats = sft_loss(logprobs, labels)
    weights = sft_token_weights(labels)
    expected = torch.zeros(2, 6)
    expected[0, 4:] = expected[1, 2] = -1.0 / 3
    torch.testing.assert_close(weights, expected)
    torch.testing.assert_close((weights * logprobs).sum(), loss)
    torch.testing.assert_close(sft_token_weights(labels, token_count=6), expected / 2)
    # with a fused loss, sft_loss returns it and takes its statistics from the detached log-probs
    fused = (weights * logprobs).sum()
    same, same_stats = sft_loss(logprobs.detach(), labels, weighted_sum=fused)
    assert same is fused and same_stats == stats


def test_policy_fused_sft_gradients_match_unfused_and_hf(tiny_qwen2_dir: Path) -> None:
    from test_policy_model import text_batch

    cfg = PolicyConfig(model_name_or_path=str(tiny_qwen2_dir), dtype="float32", logprob_chunk_size=5)
    policy = cp.policy.build_policy(cfg)
    hf = policy.hf_model
    batch = text_batch()
    out = cp.policy.token_logprobs(policy, batch, loss_weights=cp.algo.sft_token_weights(batch["labels"]))
    loss, stats = sft_loss(out.logprobs, batch["labels"], weighted_sum=out.weighted_sum)
    loss.backward()
    fused = {n: p.grad.clone() for n, p in hf.named_parameters()}
    policy.zero_grad()
    plain_loss, _ = sft_loss(cp.policy.token_logprobs(policy, batch).logprobs, batch["labels"])
    plain_loss.backward()
    torch.testing.assert_close(loss.detach(), plain_loss.detach(), rtol=1e-6, atol=1e-6)
    for name, param in hf.named_parameters():
        torch.testing.assert_close(fused[name], param.grad, atol=1e-7, rtol=1e-5, msg=name)
    hf_loss = hf(input_ids=batch["input_ids"], labels=batch["labels"], use_cache=False).loss
    torch.testing.assert_close(stats["loss"], hf_loss.detach(), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="cannot be combined with with_entropy"):
        cp.policy.token_logprobs(policy, batch, with_entropy=True, loss_weights=torch.zeros(batch["labels"].shape))


def test_a_nonlinear_token_loss_with_entropy_matches_full_logits() -> None:
    """``token_loss_from_hidden``: any per-token loss of the log-prob and entropy, differentiated per
    chunk, gives full-logit autograd's value and gradients (float64)."""
    hidden, weight, ids, coeff = _inputs(t=12, v=60, seed=9)
    mask = torch.rand(ids.shape, generator=torch.Generator().manual_seed(2)) > 0.3
    positions = cp.algo.scored_positions(ids, mask=mask)
    c = coeff.flatten()[positions.index]  # per-token constants, gathered in the head's order

    def token_loss(logp, entropy, rows):
        return c[rows] * torch.exp(0.5 * logp) + 0.3 * entropy**2 - c[rows] * logp * entropy

    out = cp.algo.token_loss_from_hidden(hidden, weight, ids, token_loss, positions=positions, chunk_size=4,
                                         with_entropy=True)
    (2.0 * out.weighted_sum).backward()
    grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None

    logp_all = torch.log_softmax(hidden[:, :-1] @ weight.t(), dim=-1)
    logp = logp_all.gather(-1, ids[:, 1:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    keep = prediction_mask(ids, mask=mask)[:, 1:]
    cc = coeff[:, 1:]
    want = (cc * torch.exp(0.5 * logp) + 0.3 * entropy**2 - cc * logp * entropy)[keep].sum()
    (2.0 * want).backward()
    torch.testing.assert_close(out.weighted_sum.detach(), want.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out.logprobs[:, 1:][keep], logp[keep].detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out.entropy[:, 1:][keep], entropy[keep].detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grads[0], hidden.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grads[1], weight.grad, rtol=1e-10, atol=1e-12)


def test_token_loss_misuse_and_no_grad() -> None:
    hidden, weight, ids, _ = _inputs(dtype=torch.float32)
    with pytest.raises(ValueError, match=r"token_loss must return one loss per token, \[4\]; got \(\) for rows 0:4"):
        cp.algo.token_loss_from_hidden(hidden, weight, ids, lambda lp, ent, rows: lp.sum(), chunk_size=4)
    with torch.no_grad():
        quiet = cp.algo.token_loss_from_hidden(hidden, weight, ids, lambda lp, ent, rows: -lp, chunk_size=4)
    assert quiet.weighted_sum.grad_fn is None
    plain = token_logprobs_from_hidden(hidden, weight, ids, chunk_size=4).logprobs
    torch.testing.assert_close(quiet.weighted_sum, -plain.sum())
    # a loss that ignores the entropy it was given: no entropy term in the gradient (none needed)
    out = cp.algo.token_loss_from_hidden(hidden, weight, ids, lambda lp, ent, rows: -lp, chunk_size=4,
                                         with_entropy=True)
    out.weighted_sum.backward()
    expected = torch.autograd.grad(-plain.sum(), hidden)[0]
    torch.testing.assert_close(hidden.grad, expected)
