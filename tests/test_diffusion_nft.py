"""The DiffusionNFT loss (arXiv 2509.16117) against the paper's definition written out per sample, and
the direction it moves the velocity; its gradient written out by hand (adaptive weights held constant)."""

from __future__ import annotations

import pytest
import torch

from cosmos_primitives.algo.diffusion_nft import diffusion_nft_loss, optimality_probability


def batch(seed: int = 0, b: int = 3):
    g = torch.Generator().manual_seed(seed)
    shape = (b, 2, 1, 4, 4)
    x0, eps = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    t = torch.rand(b, generator=g) * 0.9 + 0.05
    x_t = (1 - t.view(-1, 1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1, 1) * eps
    v_old = torch.randn(shape, generator=g)
    v_theta = v_old + 0.1 * torch.randn(shape, generator=g)
    return x0, x_t, t, v_old, v_theta


def test_the_loss_is_the_papers_objective_written_out_per_sample():
    x0, x_t, t, v_old, v_theta = batch()
    advantages = torch.tensor([2.0, -7.0, 0.5])
    beta, clip = 0.1, 5.0
    out = diffusion_nft_loss(v_theta, v_old, x_t, x0, t, advantages, beta=beta, adv_clip_max=clip)
    total = 0.0
    for i in range(3):
        r = 0.5 + 0.5 * max(-1.0, min(1.0, float(advantages[i]) / clip))
        v_pos = beta * v_theta[i] + (1 - beta) * v_old[i]
        v_neg = (1 + beta) * v_old[i] - beta * v_theta[i]
        terms = []
        for v in (v_pos, v_neg):
            pred = x_t[i] - float(t[i]) * v  # x0 predicted from the flow velocity
            weight = max(float((pred - x0[i]).abs().mean()), 1e-5)
            terms.append(float(((pred - x0[i]) ** 2).mean()) / weight)
        total += clip * (r * terms[0] + (1 - r) * terms[1]) / beta
    assert float(out.loss) == pytest.approx(total / 3, rel=1e-5)
    assert float(out.optimality_mean) == pytest.approx((0.7 + 0.0 + 0.55) / 3)
    assert optimality_probability(torch.tensor([-10.0, 0.0, 10.0]), 5.0).tolist() == [0.0, 0.5, 1.0]


def test_good_samples_pull_the_velocity_towards_them_and_bad_ones_push_it_away():
    x0, x_t, t, v_old, _ = batch(1, b=1)
    grads = {}
    for name, adv in (("good", 5.0), ("bad", -5.0)):
        v = v_old.clone().requires_grad_(True)  # at the sampling policy: v+ = v- = v_old
        diffusion_nft_loss(v, v_old, x_t, x0, t, torch.tensor([adv]), beta=0.5, adv_clip_max=5.0).loss.backward()
        grads[name] = v.grad
    torch.testing.assert_close(grads["good"], -grads["bad"])
    target = (x_t - x0) / t.view(-1, 1, 1, 1, 1)  # the velocity whose x0 prediction is exactly x0
    step = v_old - 1e-3 * grads["good"]
    assert (step - target).norm() < (v_old - target).norm()  # a descent step on a good sample approaches it


def test_kl_term_and_bad_settings():
    x0, x_t, t, v_old, v_theta = batch(2)
    adv = torch.zeros(3)
    plain = diffusion_nft_loss(v_theta, v_old, x_t, x0, t, adv, beta=0.1, adv_clip_max=5.0)
    with_kl = diffusion_nft_loss(v_theta, v_old, x_t, x0, t, adv, beta=0.1, adv_clip_max=5.0, v_ref=v_old,
                                 kl_beta=0.5)
    kl = ((v_theta - v_old) ** 2).mean()
    assert float(with_kl.kl) == pytest.approx(float(kl), rel=1e-5)
    assert float(with_kl.loss) == pytest.approx(float(plain.loss) + 0.5 * float(kl), rel=1e-5)
    with pytest.raises(ValueError, match="nft_beta"):
        diffusion_nft_loss(v_theta, v_old, x_t, x0, t, adv, beta=0.0, adv_clip_max=5.0)
    with pytest.raises(ValueError, match="adv_clip_max"):
        optimality_probability(adv, 0.0)


def test_the_gradient_treats_the_adaptive_weights_as_constants():
    # differentiating through the weights would add a term; the paper's weights are detached
    x0, x_t, t, v_old, v_theta = batch(3)
    advantages, beta, clip, kl_beta = torch.tensor([3.0, -1.0, 9.0]), 0.2, 5.0, 0.5
    v_ref = v_old + 0.05
    v = v_theta.clone().requires_grad_(True)
    diffusion_nft_loss(v, v_old, x_t, x0, t, advantages, beta=beta, adv_clip_max=clip, v_ref=v_ref,
                       kl_beta=kl_beta).loss.backward()
    b, n = x0.shape[0], x0[0].numel()
    expected = torch.empty_like(v_theta)
    for i in range(b):
        r = 0.5 + 0.5 * max(-1.0, min(1.0, float(advantages[i]) / clip))
        ti = float(t[i])
        err_pos = x_t[i] - ti * ((1 - beta) * v_old[i] + beta * v_theta[i]) - x0[i]
        err_neg = x_t[i] - ti * ((1 + beta) * v_old[i] - beta * v_theta[i]) - x0[i]
        w_pos, w_neg = float(err_pos.abs().mean()), float(err_neg.abs().mean())
        # d err+/dv = -t beta, d err-/dv = +t beta; the 1 / beta of the loss cancels the beta
        policy = clip * 2 * ti / (b * n) * (-r * err_pos / w_pos + (1 - r) * err_neg / w_neg)
        expected[i] = policy + kl_beta * 2 * (v_theta[i] - v_ref[i]) / (b * n)
    torch.testing.assert_close(v.grad, expected, rtol=1e-5, atol=1e-7)
