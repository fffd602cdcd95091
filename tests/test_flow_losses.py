"""FlowGRPO and DDRL losses, advantages and trained-step selection, against the formulas."""

from __future__ import annotations

import math

import pytest
import torch

from cosmos_primitives.algo.advantages import group_stats
from cosmos_primitives.algo.ddrl import ddrl_data_loss, neg_exp_advantages, noisy_latents
from cosmos_primitives.algo.flow_grpo import flow_grpo_advantages, flow_grpo_loss, select_train_steps


def test_group_advantages_use_group_mean_and_population_std():
    rewards = torch.tensor([1.0, 2.0, 3.0, 10.0, 10.0, 40.0])
    groups = torch.tensor([0, 0, 0, 5, 5, 5])
    adv = flow_grpo_advantages(rewards, groups)
    std0 = math.sqrt(2 / 3)
    assert adv[:3].tolist() == pytest.approx([-1 / (std0 + 1e-4), 0.0, 1 / (std0 + 1e-4)], rel=1e-5)
    std1 = math.sqrt(((10 - 20) ** 2 * 2 + 20**2) / 3)
    assert adv[5].item() == pytest.approx(20 / (std1 + 1e-4), rel=1e-5)


def test_batch_std_scope_keeps_group_means():
    rewards = torch.tensor([1.0, 3.0, 10.0, 14.0])
    groups = torch.tensor([0, 0, 1, 1])
    adv = flow_grpo_advantages(rewards, groups, std_scope="batch")
    batch_std = rewards.std(unbiased=False).item()
    expected = [(-1) / (batch_std + 1e-4), 1 / (batch_std + 1e-4), -2 / (batch_std + 1e-4), 2 / (batch_std + 1e-4)]
    assert adv.tolist() == pytest.approx(expected, rel=1e-5)
    assert flow_grpo_advantages(torch.tensor([2.0, 2.0])).tolist() == [0.0, 0.0]  # no group ids: one group
    with pytest.raises(ValueError, match="advantage_std_scope"):
        flow_grpo_advantages(rewards, groups, std_scope="prompt")


def test_a_lone_sample_gets_advantage_zero_as_in_flow_grpo_and_the_stats_are_group_stats():
    """Flow-GRPO's per-prompt tracker takes a lone sample's own reward as its mean (std 0 + 1e-4):
    advantage 0, where the LLM GRPO rule (mean 0, std 1) would give it its reward. The FlowGRPO
    advantages are ``cp.algo.group_stats`` with that rule, to the bit, in both std conventions."""
    rewards = torch.tensor([0.3, 0.9, 0.4, 7.0, 0.25, 0.5, 0.75, 1.0])
    groups = torch.tensor([2, 2, 2, 9, 4, 4, 4, 4])  # uneven groups, one of a single sample (reward 7)
    for unbiased in (False, True):
        adv = flow_grpo_advantages(rewards, groups, unbiased=unbiased)
        assert adv[3].item() == 0.0
        mean, std = group_stats(rewards, groups, unbiased=unbiased, lone_sample="own")
        assert torch.equal(adv, (rewards - mean) / (std + 1e-4))
        # the LLM rule is the default and gives the lone sample its reward
        llm_mean, llm_std = group_stats(rewards, groups, unbiased=unbiased)
        assert (llm_mean[3].item(), llm_std[3].item()) == (0.0, 1.0)
        assert torch.equal(llm_mean[:3], mean[:3]) and torch.equal(llm_std[4:], std[4:])
    with pytest.raises(ValueError, match="lone_sample"):
        group_stats(rewards, groups, lone_sample="drop")


def test_flow_grpo_loss_matches_the_clipped_objective_by_hand():
    old = torch.tensor([-1.0, -1.0, -1.0, -1.0])
    new = old + torch.tensor([0.01, -0.01, 0.01, 0.0])
    adv = torch.tensor([2.0, 2.0, -7.0, 1.0])  # -7 is clamped to -5
    eps = 1e-3
    out = flow_grpo_loss(new, old, adv, clip_range=eps, adv_clip_max=5.0)
    terms = []
    for d, a in zip([0.01, -0.01, 0.01, 0.0], [2.0, 2.0, -5.0, 1.0]):
        r = math.exp(d)
        terms.append(max(-a * r, -a * min(max(r, 1 - eps), 1 + eps)))
    assert out.policy_loss.item() == pytest.approx(sum(terms) / 4, rel=1e-5)
    assert out.clip_fraction.item() == pytest.approx(3 / 4)
    assert out.kl.item() == 0.0


def test_flow_grpo_gradient_vanishes_where_clipped_and_kl_adds_linearly():
    old = torch.zeros(2, 3)
    new = torch.tensor([[0.5, 0.0, 0.0], [0.0, 0.0, -0.5]], requires_grad=True)
    adv = torch.tensor([1.0, -1.0])
    kl = torch.full((2, 3), 0.25, requires_grad=True)
    out = flow_grpo_loss(new, old, adv, clip_range=0.1, kl=kl, kl_beta=0.04)
    out.loss.backward()
    # ratio e^0.5 with A > 0 and ratio e^-0.5 with A < 0 are clipped: no gradient there
    assert new.grad[0, 0].item() == 0.0 and new.grad[1, 2].item() == 0.0
    assert new.grad[0, 1].item() == pytest.approx(-1.0 / 6)  # d/dlogp of -A * ratio at ratio 1, / 6 elements
    assert out.loss.item() == pytest.approx(out.policy_loss.item() + 0.04 * 0.25, rel=1e-6)
    assert kl.grad[0, 0].item() == pytest.approx(0.04 / 6)


def test_flow_grpo_loss_shape_errors():
    with pytest.raises(ValueError, match="advantages"):
        flow_grpo_loss(torch.zeros(3), torch.zeros(3), torch.zeros(2), clip_range=1e-3)
    with pytest.raises(ValueError, match="old_log_probs"):
        flow_grpo_loss(torch.zeros(3), torch.zeros(3, 1), torch.zeros(3), clip_range=1e-3)


def test_select_train_steps():
    assert select_train_steps(10).tolist() == list(range(10))
    picked = select_train_steps(10, 0.3, torch.Generator().manual_seed(0))
    assert len(picked) == 3 and picked.tolist() == sorted(set(picked.tolist())) and picked.max() < 10
    assert len(select_train_steps(4, 0.01)) == 1
    # sizes where round and int differ: 3.7 -> 4 and 9.9 -> 10 (all steps, in order)
    assert len(select_train_steps(10, 0.37, torch.Generator().manual_seed(0))) == 4
    assert select_train_steps(10, 0.99).tolist() == list(range(10))
    with pytest.raises(ValueError, match="train_step_fraction"):
        select_train_steps(10, 0.0)
    with pytest.raises(ValueError, match="sde_window_size"):
        select_train_steps(0)


def test_neg_exp_advantage_transform():
    adv = torch.tensor([-3.0, 0.0, 1.0, 4.0])
    out = neg_exp_advantages(adv, clip=5.0)
    assert out.tolist() == pytest.approx([-5.0, -1.0, -math.exp(-1.0), -math.exp(-4.0)], rel=1e-6)
    assert bool((out[1:].diff() > 0).all())  # order kept: better samples pushed down less


def test_noisy_latents_interpolate_and_target_velocity():
    x0 = torch.full((2, 1, 1, 1, 2), 3.0)
    noise = torch.full((2, 1, 1, 1, 2), -1.0)
    x, target = noisy_latents(x0, noise, torch.tensor([0.25, 1.0]))
    assert x[0].flatten().tolist() == [0.75 * 3 - 0.25, 0.75 * 3 - 0.25]
    assert x[1].flatten().tolist() == [-1.0, -1.0]
    assert target.flatten().tolist() == [-4.0] * 4


def test_ddrl_data_loss_is_the_velocity_mse_and_uses_given_noise_and_sigma():
    x0 = torch.randn(3, 2, 1, 2, 2, generator=torch.Generator().manual_seed(0))
    noise = torch.randn(3, 2, 1, 2, 2, generator=torch.Generator().manual_seed(1))
    sigma = torch.tensor([0.1, 0.5, 0.9])
    seen = {}

    def exact(x, timestep, text):  # knows x0: predicts the exact velocity
        seen["t"] = timestep
        s = (timestep / 1000).reshape(-1, 1, 1, 1, 1)
        return (x - x0) / s

    out = ddrl_data_loss(exact, x0, torch.zeros(3, 4, 8), noise=noise, sigma=sigma)
    assert out.loss.item() == pytest.approx(0.0, abs=1e-9)
    torch.testing.assert_close(seen["t"], sigma * 1000)

    def zero(x, timestep, text):
        return torch.zeros_like(x)

    out = ddrl_data_loss(zero, x0, torch.zeros(3, 4, 8), noise=noise, sigma=sigma)
    torch.testing.assert_close(out.per_sample, ((noise - x0) ** 2).flatten(1).mean(1))
    drawn = ddrl_data_loss(zero, x0, torch.zeros(3, 4, 8), generator=torch.Generator().manual_seed(0))
    assert drawn.sigma.shape == (3,) and bool(((drawn.sigma >= 0) & (drawn.sigma < 1)).all())
