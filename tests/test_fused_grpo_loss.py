"""The fused GRPO head: ``grpo_token_loss`` through ``token_loss_from_hidden`` gives the loss value,
metrics and gradients of the unfused path (general head + ``grpo_loss``) in every aggregation mode,
with KL, entropy, behaviour weights, dual clip, AIPO and the positive-example NLL; configurations
that are not sums of per-token terms are refused (None); a tiny Qwen2 policy micro-batch agrees too."""

from __future__ import annotations

import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives.algo.grpo_objective import grpo_token_loss
from cosmos_primitives.algo.registry import register_aggregation
from cosmos_primitives.config import GRPOConfig

B, T, H, V = 3, 11, 8, 50


def _batch(seed: int = 0, dtype: torch.dtype = torch.float64):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=g, dtype=dtype)
    weight = torch.randn(V, H, generator=g, dtype=dtype)
    ids = torch.randint(0, V, (B, T), generator=g)
    mask = torch.zeros(B, T, dtype=dtype)
    mask[0, 4:] = 1.0
    mask[1, 2:9] = 1.0
    mask[2, 0:6] = 1.0  # position 0 in the mask: scored nowhere, counted by the aggregation
    with torch.no_grad():
        exact = cp.algo.naive_token_logprobs(hidden, weight, ids).to(dtype)
    noise = lambda scale: scale * torch.randn(B, T, generator=g, dtype=dtype)  # noqa: E731
    old = (exact + noise(0.3)) * mask
    ref = (exact + noise(0.5)) * mask
    rollout = (old + noise(0.4)) * mask
    advantages = torch.randn(B, generator=g, dtype=dtype)
    return hidden, weight, ids, mask, old, ref, rollout, advantages


def _unfused(hidden, weight, ids, mask, cfg, chunk, **loss_args):
    hidden, weight = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    out = cp.algo.token_logprobs_from_hidden(hidden, weight, ids, mask=mask, chunk_size=chunk, with_entropy=True)
    old = loss_args.pop("old")
    lp, ent = out.logprobs, out.entropy
    loss, metrics = cp.algo.grpo_loss(lp, lp.detach() if old is None else old, cfg=cfg, mask=mask, entropy=ent,
                                      **loss_args)
    loss.backward()
    return loss.detach(), metrics, hidden.grad, weight.grad


def _fused(hidden, weight, ids, mask, cfg, chunk, **loss_args):
    hidden, weight = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    positions = cp.algo.scored_positions(ids, mask=mask)
    old = loss_args.pop("old")
    token_loss = grpo_token_loss(old, loss_args["advantages"], mask, positions, cfg=cfg,
                                 ref_logprobs=loss_args.get("ref_logprobs"),
                                 rollout_logprobs=loss_args.get("rollout_logprobs"),
                                 dp_token_count=loss_args.get("dp_token_count"))
    assert token_loss is not None
    out = cp.algo.token_loss_from_hidden(hidden, weight, ids, token_loss, positions=positions, chunk_size=chunk,
                                         with_entropy=True)
    assert not out.logprobs.requires_grad and not out.entropy.requires_grad
    lp, ent = out.logprobs, out.entropy
    loss, metrics = cp.algo.grpo_loss(lp, lp if old is None else old, cfg=cfg, mask=mask, entropy=ent,
                                      weighted_sum=out.weighted_sum, **loss_args)
    loss.backward()
    return loss.detach(), metrics, hidden.grad, weight.grad


CASES = {
    "ppo-kl-entropy-behaviour": (dict(kl_beta=0.05, entropy_coeff=0.01, behav_imp_weight_cap=1.5),
                                 ("ref", "rollout")),
    "ppo-dual-clip-positive-nll": (dict(dual_clip_c=2.0, epsilon_low=0.1, positive_nll_coef=0.3, kl_beta=0.02,
                                        kl_estimator="k2"), ("ref",)),
    "aipo-k1": (dict(aipo_rho=1.2, kl_beta=0.1, kl_estimator="k1"), ("ref",)),
    "on-policy-behaviour": (dict(entropy_coeff=-0.02, behav_imp_weight_cap=2.0), ("on-policy", "rollout")),
    "kl-reported-only": (dict(), ("ref",)),
}
LOSS_TYPES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("case", list(CASES))
def test_fused_grpo_equals_unfused_loss_metrics_and_gradients(loss_type: str, case: str) -> None:
    knobs, inputs = CASES[case]
    cfg = GRPOConfig(loss_type=loss_type, unbiased_loss_max_tokens=9 if loss_type.endswith("norm") else None,
                     **knobs)
    hidden, weight, ids, mask, old, ref, rollout, advantages = _batch(seed=len(case) + len(loss_type))
    dp_count = loss_type == "token-mean" and case.startswith("ppo-kl")  # another rank's tokens count too
    args = dict(advantages=advantages, old=None if "on-policy" in inputs else old,
                ref_logprobs=ref if "ref" in inputs else None,
                rollout_logprobs=rollout if "rollout" in inputs else None,
                dp_token_count=torch.tensor(13.5, dtype=torch.float64) if dp_count else None)
    for chunk in (3, 100):
        want_loss, want_metrics, want_h, want_w = _unfused(hidden, weight, ids, mask, cfg, chunk, **dict(args))
        loss, metrics, grad_h, grad_w = _fused(hidden, weight, ids, mask, cfg, chunk, **dict(args))
        # the same log-probs reach grpo_loss either way: value and metrics agree to the bit
        assert torch.equal(loss, want_loss)
        assert metrics.keys() == want_metrics.keys()
        for name, value in want_metrics.items():
            assert torch.equal(metrics[name], value), name
        torch.testing.assert_close(grad_h, want_h, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(grad_w, want_w, rtol=1e-10, atol=1e-12)
    assert want_w.abs().max() > 1e-3  # a real gradient


def test_a_clip_really_changes_the_gradient_the_fused_head_forms() -> None:
    """Guard against a test that would pass with the ratio ignored: stale old log-probs clip tokens,
    and the fused gradient follows (it differs from the unclipped one)."""
    hidden, weight, ids, mask, old, _, _, advantages = _batch(seed=7)
    cfg = GRPOConfig(epsilon_low=0.01, epsilon_high=0.01)
    args = dict(advantages=advantages, ref_logprobs=None, rollout_logprobs=None, dp_token_count=None)
    _, metrics, _, clipped_w = _fused(hidden, weight, ids, mask, cfg, 4, old=old, **dict(args))
    _, _, _, on_policy_w = _fused(hidden, weight, ids, mask, cfg, 4, old=None, **dict(args))
    _, _, _, want_w = _unfused(hidden, weight, ids, mask, cfg, 4, old=old, **dict(args))
    assert 0.2 < float(metrics["clip_fraction"]) < 1.0
    torch.testing.assert_close(clipped_w, want_w, rtol=1e-10, atol=1e-12)
    assert (clipped_w - on_policy_w).abs().max() > 1e-3


def test_losses_that_are_not_sums_of_token_terms_are_refused() -> None:
    _, _, ids, mask, old, _, rollout, advantages = _batch()
    positions = cp.algo.scored_positions(ids, mask=mask)

    def build(**knobs):
        return grpo_token_loss(old, advantages, mask, positions, cfg=GRPOConfig(**knobs), rollout_logprobs=rollout)

    assert build() is not None
    assert build(variant="gspo") is None  # one ratio per sequence
    assert build(off_policy_masking_delta=0.1) is None  # a sequence mean of log-probs

    @register_aggregation("test-squared-mean", override=True)
    def squared_mean(values, mask, *, token_count=None, max_tokens=None):
        return (values * mask).sum() ** 2

    assert build(loss_type="test-squared-mean") is None  # not linear
    with pytest.raises(ValueError, match=r"kl_beta = 0\.1 needs ref_logprobs"):
        build(kl_beta=0.1)


def test_aggregation_weights_reproduce_every_builtin_aggregation() -> None:
    g = torch.Generator().manual_seed(3)
    values = torch.randn(4, 6, generator=g, dtype=torch.float64)
    mask = (torch.rand(4, 6, generator=g) > 0.4).double()
    mask[3] = 0.0  # a row without tokens
    values[mask == 0] = float("inf")  # off the mask nothing may leak in
    for name in LOSS_TYPES:
        for token_count in (None, 7.5):
            kwargs = dict(token_count=token_count, max_tokens=5)
            w = cp.algo.aggregation_weights(name, mask, dtype=torch.float64, **kwargs)
            want = cp.algo.get_aggregation(name)(values, mask, **kwargs)
            torch.testing.assert_close(torch.where(mask.bool(), w * values, 0).sum(), want, msg=name)
            assert torch.all(w[mask == 0] == 0)


def test_policy_micro_batch_fused_equals_unfused(tiny_qwen2_model) -> None:
    """``cp.policy.grpo_micro_batch_loss`` on a tiny Qwen2: the fused head and the general one give
    the same loss, metrics and parameter gradients (KL, entropy, behaviour weights)."""
    policy = cp.policy.CausalLMPolicy(tiny_qwen2_model, chunk_size=5)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 1000, (3, 12), generator=g)
    mask = torch.zeros(3, 12)
    mask[0, 5:] = mask[1, 3:10] = mask[2, 6:11] = 1.0
    ref = -3.0 * torch.rand(3, 12, generator=g) * mask
    rollout = -3.0 * torch.rand(3, 12, generator=g) * mask
    advantages = torch.tensor([1.0, -0.5, 0.25])
    cfg = GRPOConfig(kl_beta=0.05, entropy_coeff=0.01, behav_imp_weight_cap=3.0, loss_type="seq-mean-token-mean")
    results = []
    for fused in (False, True):
        policy.zero_grad(set_to_none=True)
        loss, metrics = cp.policy.grpo_micro_batch_loss(
            policy, {"input_ids": ids}, mask, advantages, cfg, positions=cp.algo.scored_positions(ids, mask=mask),
            ref_logprobs=ref, rollout_logprobs=rollout, temperature=0.7, fused=fused)
        loss.backward()
        results.append((loss.detach(), metrics, {n: p.grad.clone() for n, p in policy.named_parameters()}))
    (want_loss, want_metrics, want_grads), (loss, metrics, grads) = results
    assert torch.equal(loss, want_loss) and metrics.keys() == want_metrics.keys()
    for name in metrics:
        assert torch.equal(metrics[name], want_metrics[name]), name
    for name, grad in grads.items():  # float32: agreement to rounding, relative to each gradient's scale
        want = want_grads[name]
        torch.testing.assert_close(grad, want, rtol=1e-4, atol=1e-5 * float(want.abs().max()), msg=name)
    assert all(float(g.abs().max()) > 0 for g in grads.values())
