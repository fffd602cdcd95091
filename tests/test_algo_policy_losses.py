"""Policy losses (PPO-clip + dual clip, GSPO, AIPO) and off-policy corrections vs loops and hand-worked numbers.

Reference computations below are element-by-element loops over Python/torch scalars, so that
torch.autograd through them gives the reference gradient.
"""

from __future__ import annotations

import math

import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives.config import GRPOConfig

LN = math.log


def batch(seed: int, b: int = 4, t: int = 6) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    logprobs = (-torch.rand(b, t, generator=gen) * 3).requires_grad_()
    old = logprobs.detach() + 0.6 * torch.randn(b, t, generator=gen)  # ratios well outside [0.8, 1.2]
    adv = torch.randn(b, generator=gen) * 2
    mask = (torch.rand(b, t, generator=gen) > 0.25).float()
    mask[:, 0] = 1.0
    return logprobs, old, adv, mask


def reference_ppo(logprobs, old, adv, mask, eps_low, eps_high, c):
    """Per-token PPO-clip with dual clip, one scalar at a time."""
    rows = []
    for i in range(logprobs.shape[0]):
        row = []
        for j in range(logprobs.shape[1]):
            if mask[i, j] == 0:
                row.append(torch.zeros(()))
                continue
            rho = torch.exp(torch.clamp(logprobs[i, j] - old[i, j], -20, 20))
            a = adv[i]
            loss = -torch.minimum(rho * a, torch.clamp(rho, 1 - eps_low, 1 + eps_high) * a)
            if c and a < 0:
                loss = torch.minimum(-c * a, loss)
            row.append(loss)
        rows.append(torch.stack(row))
    return torch.stack(rows)


def reference_gspo(logprobs, old, adv, mask, eps_low, eps_high):
    rows = []
    for i in range(logprobs.shape[0]):
        idx = [j for j in range(logprobs.shape[1]) if mask[i, j] == 1]
        mean_d = sum(logprobs[i, j] - old[i, j] for j in idx) / len(idx)
        s = torch.exp(torch.clamp(mean_d, -20, 10))
        loss = -torch.minimum(s * adv[i], torch.clamp(s, 1 - eps_low, 1 + eps_high) * adv[i])
        rows.append(torch.stack([loss if mask[i, j] == 1 else torch.zeros(()) for j in range(logprobs.shape[1])]))
    return torch.stack(rows)


def grad_of(fn, logprobs, *args, **kwargs):
    leaf = logprobs.detach().clone().requires_grad_()
    out = fn(leaf, *args, **kwargs)
    values = out.per_token_loss if isinstance(out, cp.algo.PolicyLossOutput) else out
    values.sum().backward()
    return values.detach(), leaf.grad


@pytest.mark.parametrize(("eps_low", "eps_high", "c"), [(0.2, 0.2, 3.0), (0.2, 0.28, 0.0), (0.1, 0.3, 1.5)])
def test_ppo_clip_matches_loop_reference_values_and_gradients(eps_low, eps_high, c) -> None:
    logprobs, old, adv, mask = batch(0)
    cfg = GRPOConfig(epsilon_low=eps_low, epsilon_high=eps_high, dual_clip_c=c)
    got, got_grad = grad_of(cp.algo.ppo_clip_loss, logprobs, old, adv, mask, cfg)
    want, want_grad = grad_of(reference_ppo, logprobs, old, adv, mask, eps_low, eps_high, c)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grad, want_grad)


@pytest.mark.parametrize(("eps_low", "eps_high", "c"), [(-1.0, -1.0, 100.0), (-1.0, 0.28, 3.0), (0.2, -1.0, 0.0)])
def test_a_negative_epsilon_leaves_that_side_unclipped_as_in_cosmos_rl(eps_low, eps_high, c) -> None:
    """cosmos-rl's GRPO loss clamps the ratio at ``1 - epsilon_low`` only when ``epsilon_low >= 0`` and at
    ``1 + epsilon_high`` only when ``epsilon_high >= 0`` (its distillation files set both to -1)."""
    logprobs, old, adv, mask = batch(1)  # advantages of both signs
    cfg = GRPOConfig(epsilon_low=eps_low, epsilon_high=eps_high, dual_clip_c=c)
    got, got_grad = grad_of(cp.algo.ppo_clip_loss, logprobs, old, adv, mask, cfg)
    # an absent bound is one no ratio reaches (ratios are exp of a log-ratio clamped to [-20, 20])
    low, high = (eps_low if eps_low >= 0 else 2.0), (eps_high if eps_high >= 0 else math.exp(21.0))
    want, want_grad = grad_of(reference_ppo, logprobs, old, adv, mask, low, high, c)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grad, want_grad)
    out = cp.algo.ppo_clip_loss(logprobs, old, adv, mask, cfg)
    ratio_low, ratio_high = out.ratio < 1.0, out.ratio > 1.0
    if eps_low < 0 and eps_high < 0:
        assert not out.clipped.any()
    if eps_low < 0:
        assert not (out.clipped & ratio_low).any()
    if eps_high < 0:
        assert not (out.clipped & ratio_high).any()


def test_ppo_clip_hand_worked_tokens_with_dual_clip() -> None:
    # eps 0.2, c = 3. Token by token (A, rho) -> loss, d loss / d logp:
    #  (+1, 1.1): unclipped          -> -1.1, grad -rho*A = -1.1
    #  (+1, 1.5): clipped at 1.2     -> -1.2, grad 0
    #  (-1, 0.5): clipped at 0.8     ->  0.8, grad 0
    #  (-1, 2.0): unclipped, 2 < 3   ->  2.0, grad -rho*A = 2.0
    #  (-1, 4.0): dual clip at c|A|  ->  3.0, grad 0
    #  (+1, 4.0): clipped at 1.2     -> -1.2, grad 0 (dual clip only for A < 0)
    ratios = torch.tensor([1.1, 1.5, 0.5, 2.0, 4.0, 4.0])
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, -1.0, 1.0])
    old = torch.full((6, 1), -2.0)
    logprobs = (old + ratios.log().unsqueeze(1)).requires_grad_()
    out = cp.algo.ppo_clip_loss(logprobs, old, adv, torch.ones(6, 1), GRPOConfig())
    out.per_token_loss.sum().backward()
    torch.testing.assert_close(out.per_token_loss.squeeze(1), torch.tensor([-1.1, -1.2, 0.8, 2.0, 3.0, -1.2]))
    torch.testing.assert_close(logprobs.grad.squeeze(1), torch.tensor([-1.1, 0.0, 0.0, 2.0, 0.0, 0.0]))
    assert out.clipped.squeeze(1).tolist() == [False, True, True, False, False, True]
    assert out.dual_clipped.squeeze(1).tolist() == [False, False, False, False, True, False]
    torch.testing.assert_close(out.ratio.squeeze(1), ratios)


def test_masked_tokens_give_zero_loss_and_gradient_even_when_non_finite() -> None:
    logprobs = torch.tensor([[-1.0, float("-inf")]], requires_grad=True)
    old = torch.tensor([[-1.0, -50.0]])
    out = cp.algo.ppo_clip_loss(logprobs, old, torch.tensor([1.0]), torch.tensor([[1.0, 0.0]]), GRPOConfig())
    out.per_token_loss.sum().backward()
    assert out.per_token_loss.tolist() == [[-1.0, 0.0]]
    assert logprobs.grad.tolist() == [[-1.0, 0.0]]


def test_gspo_matches_loop_reference_values_and_gradients() -> None:
    logprobs, noisy_old, _, mask = batch(1)
    # token log-ratios = per-sequence mean + noise of masked mean 0, so the sequence ratios are
    # e^0.001 (kept), e^0.01 (clipped above, A > 0), e^-0.01 (clipped below, A < 0), e^-0.002 (kept)
    noise = noisy_old - logprobs.detach()
    noise = (noise - cp.algo.sequence_mean(noise, mask).unsqueeze(1)) * mask
    old = logprobs.detach() - torch.tensor([[0.001], [0.01], [-0.01], [-0.002]]) - noise
    adv = torch.tensor([1.0, 1.0, -1.0, 2.0])
    cfg = GRPOConfig(variant="gspo", epsilon_low=3e-3, epsilon_high=4e-3)
    got, got_grad = grad_of(cp.algo.gspo_loss, logprobs, old, adv, mask, cfg)
    want, want_grad = grad_of(reference_gspo, logprobs, old, adv, mask, 3e-3, 4e-3)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grad, want_grad)
    row_has_grad = (got_grad != 0).any(dim=1)
    assert row_has_grad.tolist() == [True, False, False, True]


def test_gspo_hand_worked_gradient_through_the_sequence_mean() -> None:
    # two tokens with log-ratios 0.2 and -0.1: mean 0.05, s = e^0.05 = 1.0512711; A = 2; eps 0.2 -> unclipped.
    # Each token's loss is -A s = -2.1025422; with seq-mean-token-mean the sequence loss is the same number and
    # d loss / d logp_k = -A s / 2 = -1.0512711 for both tokens (the mean spreads the gradient evenly).
    old = torch.tensor([[-1.0, -2.0, -3.0]])
    logprobs = (old + torch.tensor([[0.2, -0.1, 5.0]])).requires_grad_()
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    out = cp.algo.gspo_loss(logprobs, old, torch.tensor([2.0]), mask, GRPOConfig())
    torch.testing.assert_close(out.per_token_loss, torch.tensor([[-2.1025422, -2.1025422, 0.0]]))
    cp.algo.seq_mean_token_mean(out.per_token_loss, mask).backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-1.0512711, -1.0512711, 0.0]]))
    # with GSPO's small eps (4e-4 high) the same sequence is clipped: loss -2 * 1.0004, no gradient
    leaf = logprobs.detach().requires_grad_()
    clipped = cp.algo.gspo_loss(leaf, old, torch.tensor([2.0]), mask, GRPOConfig(epsilon_low=3e-4, epsilon_high=4e-4))
    clipped.per_token_loss.sum().backward()
    torch.testing.assert_close(clipped.per_token_loss[0, :2], torch.tensor([-2.0008, -2.0008]))
    assert leaf.grad.abs().sum() == 0
    assert clipped.clipped.tolist() == [[True, True, False]]


def test_aipo_hand_worked_and_requires_rho() -> None:
    # rho_max = 2. (A, rho): (+1, 3) -> -min(3, 2) = -2, grad 0; (-1, 1.5) -> 1.5, grad -rho*A = 1.5
    old = torch.tensor([[-1.0], [-1.0]])
    logprobs = (old + torch.tensor([[LN(3.0)], [LN(1.5)]])).requires_grad_()
    out = cp.algo.aipo_loss(logprobs, old, torch.tensor([1.0, -1.0]), torch.ones(2, 1), GRPOConfig(aipo_rho=2.0))
    out.per_token_loss.sum().backward()
    torch.testing.assert_close(out.per_token_loss, torch.tensor([[-2.0], [1.5]]))
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0], [1.5]]))
    assert out.clipped.tolist() == [[True], [False]]
    with pytest.raises(ValueError, match="aipo_rho"):
        cp.algo.aipo_loss(logprobs, old, torch.tensor([1.0, -1.0]), torch.ones(2, 1), GRPOConfig())


def test_aipo_matches_loop_reference() -> None:
    logprobs, old, adv, mask = batch(2)

    def reference(lp, old, adv, mask):
        return torch.stack([
            torch.stack([
                -torch.clamp(torch.exp(torch.clamp(lp[i, j] - old[i, j], -20, 20)), max=4.0) * adv[i]
                if mask[i, j] else torch.zeros(()) for j in range(lp.shape[1])
            ]) for i in range(lp.shape[0])
        ])

    got, got_grad = grad_of(cp.algo.aipo_loss, logprobs, old, adv, mask, GRPOConfig(aipo_rho=4.0))
    want, want_grad = grad_of(reference, logprobs, old, adv, mask)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grad, want_grad)


def test_behaviour_weights_hand_worked_and_vs_loop() -> None:
    # old - rollout = ln 2 -> w = 2, over the cap 1.5 -> 0; ln 1.2 -> 1.2; masked token -> 0
    old = torch.tensor([[-1.0, -1.0, -1.0]])
    rollout = old - torch.tensor([[LN(2.0), LN(1.2), 0.0]])
    w = cp.algo.behaviour_weights(old, rollout, torch.tensor([[1.0, 1.0, 0.0]]), cap=1.5)
    torch.testing.assert_close(w, torch.tensor([[0.0, 1.2, 0.0]]))
    _, old, _, mask = batch(3)
    rollout = old + 0.5 * torch.randn(old.shape, generator=torch.Generator().manual_seed(9))
    got = cp.algo.behaviour_weights(old, rollout, mask, cap=1.3)
    for i in range(old.shape[0]):
        for j in range(old.shape[1]):
            w = math.exp(float(old[i, j] - rollout[i, j]))
            assert got[i, j].item() == pytest.approx(w if mask[i, j] and w <= 1.3 else 0.0, rel=1e-5)
    uncapped = cp.algo.behaviour_weights(old, rollout, mask)
    assert (uncapped[mask.bool()] > 0).all()


def test_off_policy_sequence_mask_hand_worked() -> None:
    # delta 0.1. Mean of (behaviour - current) over each sequence's tokens:
    #  seq 0: A = -1, tokens 0.2, 0.4 -> 0.3 > 0.1 -> masked
    #  seq 1: A = +1, same divergence  -> kept (only negative advantages are masked)
    #  seq 2: A = -1, tokens 0.1, 0.0 (third token off-mask, 9.0) -> 0.05 <= 0.1 -> kept
    current = torch.zeros(3, 3)
    behaviour = torch.tensor([[0.2, 0.4, 0.0], [0.2, 0.4, 0.0], [0.1, 0.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    keep = cp.algo.off_policy_sequence_mask(current, behaviour, torch.tensor([-1.0, 1.0, -1.0]), mask, delta=0.1)
    assert keep.tolist() == [0.0, 1.0, 1.0]


def test_off_policy_sequence_mask_vs_loop() -> None:
    logprobs, old, adv, mask = batch(4, b=8)
    keep = cp.algo.off_policy_sequence_mask(logprobs, old, adv, mask, delta=0.05)
    for i in range(8):
        idx = [j for j in range(mask.shape[1]) if mask[i, j]]
        divergence = sum(float(old[i, j] - logprobs[i, j].detach()) for j in idx) / len(idx)
        assert keep[i].item() == (0.0 if adv[i] < 0 and divergence > 0.05 else 1.0)
    assert not keep.requires_grad


def test_shape_errors_name_the_tensor() -> None:
    lp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"old_logprobs \(2, 4\) must match logprobs \(2, 3\)"):
        cp.algo.ppo_clip_loss(lp, torch.zeros(2, 4), torch.zeros(2), torch.ones(2, 3))
    with pytest.raises(ValueError, match="advantages"):
        cp.algo.ppo_clip_loss(lp, lp, torch.zeros(3), torch.ones(2, 3))
