"""The flow-matching SDE sampler: step formulas by hand, marginals on a Gaussian target, exact
log-prob recomputation on the tiny Wan model, seeds, SDE windows and guidance conventions."""

from __future__ import annotations

import math

import pytest
import torch

from cosmos_primitives.algo.flow_grpo import flow_grpo_loss
from cosmos_primitives.algo.flow_sde import (
    SDEParams,
    gaussian_log_prob,
    gaussian_mean_kl,
    ode_step,
    sde_step_stats,
)
from cosmos_primitives.algo.flow_step import guided_velocity, recompute_step, to_diffusers_guidance
from cosmos_primitives.config.policy import DIFFUSERS_LORA_TARGETS, LoraConfig
from cosmos_primitives.models.flow_transformers import flow_velocity_fn
from cosmos_primitives.policy.diffusion import DiffusionPolicy
from cosmos_primitives.rollout.flow_sampler import flow_sigmas, sample_flow, sde_window
from cosmos_primitives.testing import (
    tiny_cosmos_transformer,
    tiny_flow_scheduler,
    tiny_unipc_flow_scheduler,
    tiny_wan_transformer,
)

X = torch.tensor([[[0.5, -1.0], [2.0, 0.25]]])  # [1, 2, 2]
V = torch.tensor([[[1.5, 0.5], [-0.75, 2.0]]])


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    """Tiny tensors: torch's thread pool costs more than the maths (and 2 shared cores thrash)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _log_normal(x: float, mean: float, std: float) -> float:
    return -((x - mean) ** 2) / (2 * std**2) - math.log(std) - 0.5 * math.log(2 * math.pi)


def test_flow_grpo_step_mean_std_by_hand():
    sigma, sigma_next, a = 0.6, 0.4, 0.7
    stats = sde_step_stats(X, V, sigma, sigma_next, 0.9, SDEParams(noise_level=a))
    std_t = a * math.sqrt(sigma / (1 - sigma))
    dt = sigma_next - sigma
    for x, v, m in zip(X.flatten().tolist(), V.flatten().tolist(), stats.mean.flatten().tolist()):
        expected = x * (1 + std_t**2 * dt / (2 * sigma)) + v * (1 + std_t**2 * (1 - sigma) / (2 * sigma)) * dt
        assert m == pytest.approx(expected, rel=1e-6)
    assert stats.std.flatten().item() == pytest.approx(std_t * math.sqrt(-dt), rel=1e-6)


def test_flow_grpo_std_at_sigma_one_uses_second_sigma():
    stats = sde_step_stats(X, V, 1.0, 0.9, 0.9, SDEParams(noise_level=0.7))
    assert stats.std.flatten().item() == pytest.approx(0.7 * math.sqrt(1.0 / (1 - 0.9)) * math.sqrt(0.1), rel=1e-6)
    assert torch.isfinite(stats.mean).all()


def test_linear_schedule_std_by_hand():
    sigma, sigma_next = 0.5, 0.3
    stats = sde_step_stats(X, V, sigma, sigma_next, 0.9, SDEParams(sde_type="linear", noise_min=0.1, noise_max=0.9))
    std_t = 0.1 + (0.9 - 0.1) * sigma
    assert stats.std.flatten().item() == pytest.approx(std_t * math.sqrt(sigma - sigma_next), rel=1e-6)
    dt = sigma_next - sigma
    expected = X * (1 + std_t**2 * dt / (2 * sigma)) + V * (1 + std_t**2 * (1 - sigma) / (2 * sigma)) * dt
    torch.testing.assert_close(stats.mean, expected)


def test_cps_step_by_hand():
    sigma, sigma_next, a = 0.6, 0.4, 0.5
    stats = sde_step_stats(X, V, sigma, sigma_next, 0.9, SDEParams(sde_type="cps", noise_level=a))
    std = sigma_next * math.sin(a * math.pi / 2)
    x0_hat, x1_hat = X - sigma * V, X + (1 - sigma) * V
    torch.testing.assert_close(stats.mean, x0_hat * (1 - sigma_next) + x1_hat * math.sqrt(sigma_next**2 - std**2))
    assert stats.std.flatten().item() == pytest.approx(std, rel=1e-6)


def test_log_prob_is_the_element_average_of_the_gaussian_density():
    mean = torch.tensor([[0.0, 1.0, -2.0], [0.5, 0.5, 0.5]])
    x_next = torch.tensor([[0.3, 0.0, -2.5], [0.5, 1.5, -0.5]])
    std = torch.tensor([[0.5], [2.0]])
    got = gaussian_log_prob(x_next, mean, std)
    for b in range(2):
        by_hand = sum(_log_normal(x_next[b, i].item(), mean[b, i].item(), std[b, 0].item()) for i in range(3)) / 3
        assert got[b].item() == pytest.approx(by_hand, rel=1e-6)


def test_deterministic_step_has_no_log_prob():
    with pytest.raises(ValueError, match="deterministic"):
        gaussian_log_prob(X, X, torch.zeros(1, 1, 1))


def test_closed_form_kl_by_hand_and_normalisation():
    mean, ref = X, X + torch.tensor([[[0.1, -0.2], [0.0, 0.3]]])
    std_t, dt = 1.2, -0.05
    std = torch.full((1, 1, 1), std_t * math.sqrt(-dt))
    total = (0.1**2 + 0.2**2 + 0.3**2) / (2 * std_t**2 * abs(dt))
    assert gaussian_mean_kl(mean, ref, std, reduction="sum").item() == pytest.approx(total, rel=1e-5)
    assert gaussian_mean_kl(mean, ref, std, reduction="mean").item() == pytest.approx(total / 4, rel=1e-5)
    with pytest.raises(ValueError, match="kl_reduction"):
        gaussian_mean_kl(mean, ref, std, reduction="max")


def test_ode_step_is_euler():
    torch.testing.assert_close(ode_step(X, V, 0.6, 0.4), X - 0.2 * V)


def _gaussian_velocity(mu: float, s: float):
    """Exact velocity of the rectified flow from N(mu, s^2) data (t = 0) to N(0, 1) noise (t = 1).

    x_t = (1 - t) x0 + t eps is Gaussian with mean (1 - t) mu and variance (1 - t)^2 s^2 + t^2, and
    jointly Gaussian with eps - x0 (mean -mu, covariance with x_t: t - (1 - t) s^2), so
    v(x, t) = E[eps - x0 | x_t = x] = -mu + (t - (1 - t) s^2) / var_t * (x - (1 - t) mu).
    """

    def velocity(x: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        t = (timestep / 1000.0).reshape(-1, *([1] * (x.ndim - 1)))
        var = (1 - t) ** 2 * s**2 + t**2
        return -mu + (t - (1 - t) * s**2) / var * (x - (1 - t) * mu)

    return velocity


@pytest.mark.parametrize(("mu", "s"), [(1.5, 0.4), (-1.0, 1.0)])
def test_sde_sampler_reaches_the_gaussian_target(mu, s):
    # 4 x 50,000 independent 1-D samples (the velocity acts elementwise); linear sigma grid (shift 1)
    sigmas, timesteps = flow_sigmas(tiny_flow_scheduler(), 40, shift=1.0)
    traj = sample_flow(_gaussian_velocity(mu, s), torch.zeros(4, 1, 1), latent_shape=(1, 1, 1, 50_000),
                       sigmas=sigmas, timesteps=timesteps, seeds=[0, 1, 2, 3], sde=SDEParams())
    x = traj.samples.flatten()
    assert traj.log_probs.shape == (4, 40)
    assert abs(x.std().item() / s - 1) < 0.02
    assert abs(x.mean().item() - mu) < 0.02 * s


@pytest.fixture(scope="module")
def lora_policy():
    lora = LoraConfig(r=4, lora_alpha=8.0, target_modules=list(DIFFUSERS_LORA_TARGETS))
    policy = DiffusionPolicy(tiny_wan_transformer(seed=0), lora=lora)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in policy.transformer.named_parameters():
            if "lora_B" in name:  # a non-trivial adapter, so the policy differs from its reference
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return policy


def _rollout(policy, text, seeds, **kw):
    sigmas, timesteps = flow_sigmas(tiny_flow_scheduler(), 6)
    kw.setdefault("sde", SDEParams())
    return sample_flow(policy.velocity_fn(), text, latent_shape=(4, 1, 4, 4), sigmas=sigmas, timesteps=timesteps,
                       seeds=seeds, negative_text=torch.zeros(1, 5, 32), **kw)


def test_first_update_recomputes_the_stored_log_probs_exactly(lora_policy):
    text = torch.randn(4, 5, 32, generator=torch.Generator().manual_seed(0))
    negative = torch.zeros(1, 5, 32)
    traj = _rollout(lora_policy, text, [0, 1, 2, 3], guidance_scale=4.5)
    assert traj.sde_steps.tolist() == list(range(6))
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    for k, step in enumerate(traj.sde_steps.tolist()):
        now = recompute_step(lora_policy.velocity_fn(), traj, step, text, negative)
        assert torch.equal(now.log_prob, traj.log_probs[:, k])
        out = flow_grpo_loss(now.log_prob, traj.log_probs[:, k], advantages, clip_range=1e-4)
        assert out.ratio_mean.item() == 1.0 and out.clip_fraction.item() == 0.0
        out.loss.backward()  # differentiable through the conditional branch
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in lora_policy.trainable_parameters())
    lora_policy.transformer.zero_grad(set_to_none=True)


def test_same_seed_same_trajectory_whatever_the_batch(lora_policy):
    text = torch.randn(3, 5, 32, generator=torch.Generator().manual_seed(3))
    full = _rollout(lora_policy, text, [7, 8, 9])
    alone = _rollout(lora_policy, text[2:3], [9])
    reordered = _rollout(lora_policy, text[[2, 0]], [9, 7])
    torch.testing.assert_close(alone.latents[0], full.latents[2], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(reordered.latents, full.latents[[2, 0]], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(reordered.log_probs, full.log_probs[[2, 0]], atol=1e-5, rtol=1e-5)
    other_seed = _rollout(lora_policy, text[2:3], [10])
    assert not torch.allclose(other_seed.samples, alone.samples)


def test_sde_window_only_window_steps_are_stochastic(lora_policy):
    steps = sde_window(6, 2, (1, 5), torch.Generator().manual_seed(0))
    assert steps == list(range(steps[0], steps[0] + 2))
    text = torch.randn(2, 5, 32)
    traj = _rollout(lora_policy, text, [0, 1], sde_steps=steps)
    assert traj.sde_steps.tolist() == steps and traj.log_probs.shape == (2, 2)
    outside = next(i for i in range(6) if i not in steps)
    with pytest.raises(ValueError, match="deterministic"):
        recompute_step(lora_policy.velocity_fn(), traj, outside, text)
    # ODE steps are plain Euler steps of the stored latents
    with torch.no_grad():
        v = lora_policy.velocity_fn()(traj.latents[:, outside], traj.timesteps[outside].expand(2), text)
    expected = ode_step(traj.latents[:, outside], v, traj.sigmas[outside], traj.sigmas[outside + 1])
    torch.testing.assert_close(traj.latents[:, outside + 1], expected, atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="does not fit"):
        sde_window(6, 5, (2, 6))


def test_sde_window_draws_every_position_of_its_range_and_can_fill_it():
    starts = {sde_window(6, 2, (1, 5), torch.Generator().manual_seed(seed))[0] for seed in range(200)}
    assert starts == {1, 2, 3}  # 3 = hi - window_size: the last position that fits
    assert {sde_window(8, 3, (), torch.Generator().manual_seed(seed))[0] for seed in range(200)} == set(range(6))
    for seed in range(3):
        generator = torch.Generator().manual_seed(seed)
        assert sde_window(6, 4, (1, 5), generator) == [1, 2, 3, 4]
        assert sde_window(6, 6, (), generator) == list(range(6))
    assert sde_window(6, 0) == list(range(6))


def test_ode_rollout_and_deterministic_cps_end_have_no_log_prob(lora_policy):
    text = torch.randn(2, 5, 32)
    ode = _rollout(lora_policy, text, [0, 1], sde=None)
    assert ode.sde_steps.numel() == 0 and ode.log_probs.shape == (2, 0)
    again = _rollout(lora_policy, text, [0, 1], sde=None)
    assert torch.equal(ode.latents, again.latents)
    cps = _rollout(lora_policy, text, [0, 1], sde=SDEParams(sde_type="cps"))
    assert cps.sde_steps.tolist() == [0, 1, 2, 3, 4]  # the last step lands on sigma 0 with std 0


def test_guidance_conventions_and_detached_unconditional_branch():
    assert to_diffusers_guidance(1.0, "diffusers") == 1.0
    assert to_diffusers_guidance(0.0, "cosmos") == 1.0
    assert to_diffusers_guidance(3.5, "cosmos") == 4.5
    w = torch.tensor(2.0, requires_grad=True)

    def velocity(x, t, text):
        return w * x + text.mean(dim=(1, 2)).reshape(-1, 1, 1, 1, 1)

    x = torch.ones(1, 1, 1, 1, 1)
    cond, uncond = torch.full((1, 2, 3), 1.0), torch.full((1, 2, 3), -1.0)
    g = 4.5
    v = guided_velocity(velocity, x, torch.zeros(1), cond, uncond, g)
    assert v.item() == pytest.approx((2 - 1) + g * ((2 + 1) - (2 - 1)))
    v.sum().backward()
    assert w.grad.item() == pytest.approx(g * 1.0)  # only the conditional branch carries gradient
    off = guided_velocity(velocity, x, torch.zeros(1), cond, uncond, to_diffusers_guidance(0.0, "cosmos"))
    assert off.item() == pytest.approx(3.0)
    with pytest.raises(ValueError, match="guidance_convention"):
        to_diffusers_guidance(1.0, "other")


def test_bf16_model_gives_float32_trajectories():
    model = tiny_wan_transformer(seed=0).to(torch.bfloat16)
    policy = DiffusionPolicy(model, lora=LoraConfig(r=2, lora_alpha=2.0, target_modules=list(DIFFUSERS_LORA_TARGETS)))
    traj = _rollout(policy, torch.randn(2, 5, 32), [0, 1])
    assert traj.latents.dtype == torch.float32 and traj.log_probs.dtype == torch.float32
    assert torch.isfinite(traj.latents).all() and torch.isfinite(traj.log_probs).all()


def test_flow_sigmas_copies_the_scheduler_grid():
    scheduler = tiny_flow_scheduler(shift=3.0)
    sigmas, timesteps = flow_sigmas(scheduler, 8)
    assert sigmas.shape == (9,) and timesteps.shape == (8,)
    assert sigmas[0].item() == pytest.approx(1.0) and sigmas[-1].item() == 0.0
    torch.testing.assert_close(timesteps, sigmas[:-1] * 1000)
    shifted, _ = flow_sigmas(scheduler, 8, shift=1.0)
    assert not torch.allclose(shifted, sigmas)
    assert scheduler.config.shift == 3.0


def test_flow_sigmas_of_a_unipc_flow_scheduler_are_exact_and_shift_is_flow_shift():
    scheduler = tiny_unipc_flow_scheduler(flow_shift=5.0)
    sigmas, timesteps = flow_sigmas(scheduler, 6)
    assert sigmas.shape == (7,) and sigmas[-1].item() == 0.0 and sigmas[0].item() == pytest.approx(1.0, abs=1e-5)
    # UniPC rounds its own timesteps to integers; the sampler gets sigma * 1000 unrounded
    torch.testing.assert_close(timesteps, sigmas[:-1] * 1000)
    assert not torch.equal(timesteps, timesteps.round())
    less_shifted, _ = flow_sigmas(scheduler, 6, shift=1.0)  # passed on as flow_shift
    torch.testing.assert_close(less_shifted[:-1], torch.linspace(1, 1 / 1000, 7)[:-1], atol=2e-6, rtol=0)
    assert scheduler.config.flow_shift == 5.0
    with pytest.raises(ValueError, match="no shift"):
        flow_sigmas(type("NoShift", (), {"config": {"num_train_timesteps": 1000}})(), 4, shift=2.0)


def test_cosmos_velocity_feeds_sigma_and_the_masks_the_pipeline_uses():
    transformer = tiny_cosmos_transformer(seed=0)
    latents, text = torch.randn(2, 4, 3, 8, 8), torch.randn(2, 5, 32)
    velocity = flow_velocity_fn(transformer, num_train_timesteps=1000.0)  # picks the Cosmos wrapper
    with torch.no_grad():
        got = velocity(latents, torch.tensor(625.0), text)
        expected = transformer(hidden_states=latents, condition_mask=torch.zeros(2, 1, 3, 8, 8),
                               timestep=torch.tensor([0.625, 0.625]), encoder_hidden_states=text,
                               padding_mask=torch.zeros(1, 1, 8, 8), return_dict=False)[0]
        other_sigma = velocity(latents, torch.tensor(250.0), text)
    assert got.shape == latents.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, expected)
    assert not torch.allclose(got, other_sigma)
    # a Wan transformer keeps the plain diffusers call (timestep in [0, 1000])
    assert flow_velocity_fn(tiny_wan_transformer(seed=0)).__qualname__.startswith("diffusers_velocity_fn")


def test_sliding_sde_window_moves_like_mixgrpo_and_rolls_back():
    from cosmos_primitives.rollout.flow_sampler import sliding_sde_window

    # MixGRPO's defaults: 25 sampling steps, windows inside the first 23, 4 steps, moved by 1 every 25 iterations
    def window(k):
        return sliding_sde_window(25, 4, k, shift_interval=25, stride=1, window_range=[0, 23])

    assert window(0) == window(24) == [0, 1, 2, 3]
    assert window(25) == [1, 2, 3, 4]
    assert window(25 * 19) == [19, 20, 21, 22]  # the last window that fits
    assert window(25 * 20) == [0, 1, 2, 3]  # rolled back
    assert sliding_sde_window(10, 3, 7, shift_interval=2, stride=2) == [6, 7, 8]  # (7 // 2) * 2
    with pytest.raises(ValueError, match="sde_window_shift_interval"):
        sliding_sde_window(10, 3, 0, shift_interval=0)
    with pytest.raises(ValueError, match="does not fit"):
        sliding_sde_window(10, 3, 0, shift_interval=1, window_range=[8, 10])
