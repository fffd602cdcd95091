"""Image- and video-to-world conditioning on the tiny models: the clip's first latent frames are held
fixed in every sampled latent, the model sees them (Cosmos: in its condition-mask channel), they stay
out of the log-probs and of every loss (FlowGRPO with its KL, DDRL's data term, DiffusionNFT), a short
RL run of the recipe works in each mode, and a condition that leaves nothing to generate is refused."""

from __future__ import annotations

import copy

import msgspec
import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives.algo import SDEParams, recompute_step
from cosmos_primitives.algo.ddrl import ddrl_data_loss
from cosmos_primitives.config import WFMConfig
from cosmos_primitives.data import HashingTextEmbedder, MockClipDataset, collate_clips
from cosmos_primitives.logging import read_metrics
from cosmos_primitives.models import cosmos_velocity_fn
from cosmos_primitives.policy import DiffusionPolicy, diffusion_nft_update, flow_grpo_update
from cosmos_primitives.rollout import encode_video, flow_sigmas, sample_flow
from cosmos_primitives.testing import tiny_cosmos_transformer, tiny_flow_scheduler, tiny_wan_transformer, tiny_wan_vae
from test_wfm_recipes import CONFIGS, run_recipe

pytest.importorskip("diffusers")
SHAPE = (4, 5, 4, 4)  # latent (C, T, H, W): the tiny VAE keeps 1 + 4k frames
K = 2  # conditioning latent frames
B = 2


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matrices: one thread is faster than many on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def setup():
    """A DiffusionPolicy (reference kept), the text ``[B, L, 32]`` of B mock clips and the first K latent
    frames of those clips encoded by the tiny VAE ``[B, C, K, H, W]`` (what the recipe conditions on)."""
    torch.manual_seed(0)
    policy = DiffusionPolicy(tiny_wan_transformer(seed=0), lora=None, keep_reference=True)
    clips = MockClipDataset(B, num_frames=SHAPE[1], height=2 * SHAPE[2], width=2 * SHAPE[3], max_tokens=4,
                            embedder=HashingTextEmbedder(32))
    batch = collate_clips([clips[i] for i in range(B)])
    with torch.no_grad():
        latents = encode_video(tiny_wan_vae(seed=0), batch["video"])
    assert latents.shape == (B, *SHAPE)
    return policy, batch["text"], latents[:, :, :K]


def rollout(velocity, text, condition, sde=True, steps=3):
    sigmas, timesteps = flow_sigmas(tiny_flow_scheduler(), steps)
    return sample_flow(velocity, text, latent_shape=SHAPE, sigmas=sigmas, timesteps=timesteps, seeds=list(range(B)),
                       sde=SDEParams() if sde else None, condition=condition)


def garbage_on_condition_frames(velocity):
    """``velocity`` with its output on the first K latent frames replaced by large junk."""
    def fn(x, t, text, num_condition_frames=0):
        assert num_condition_frames == K  # the sampler / updates tell the model which frames are clean
        v = velocity(x, t, text, num_condition_frames=num_condition_frames)
        return torch.cat([v[:, :, :K] * 0 + 1e3, v[:, :, K:]], dim=2)
    return fn


def test_every_sampled_latent_starts_with_the_encoded_clip_frames_and_the_model_sees_them():
    policy, text, condition = setup()
    traj = rollout(policy.velocity_fn(), text, condition)
    assert traj.num_condition_frames == K and traj.latents.shape == (B, 4, *SHAPE)
    for step in range(traj.latents.shape[1]):  # the initial noise, every step's result and the sample
        assert torch.equal(traj.latents[:, step, :, :K], condition)
    assert not torch.equal(traj.latents[:, 1, :, K:], traj.latents[:, 0, :, K:])  # the rest is generated
    other = rollout(policy.velocity_fn(), text, condition + 1.0)
    assert not torch.allclose(other.samples[:, :, K:], traj.samples[:, :, K:])  # it depends on the condition
    sub = traj.select([1])
    assert torch.equal(sub.condition, condition[[1]])


def test_log_probs_cover_the_generated_frames_only():
    policy, text, condition = setup()
    velocity = policy.velocity_fn()
    traj = rollout(velocity, text, condition)
    with torch.no_grad():
        for k, step in enumerate(traj.sde_steps.tolist()):
            now = recompute_step(velocity, traj, step, text)
            torch.testing.assert_close(now.log_prob, traj.log_probs[:, k], rtol=1e-5, atol=1e-6)
            # the junk velocity moves the step's mean on the condition frames only: the log-prob is unchanged
            junk = recompute_step(garbage_on_condition_frames(velocity), traj, step, text)
            assert not torch.allclose(junk.mean[:, :, :K], now.mean[:, :, :K])
            assert torch.equal(junk.log_prob, now.log_prob)
    # text-to-world: the same perturbation of the whole latent does reach the log-prob
    free = rollout(velocity, text, None)
    with torch.no_grad():
        now = recompute_step(velocity, free, 0, text)
        shifted = recompute_step(lambda x, t, c: velocity(x, t, c) + 1e3, free, 0, text)
    assert not torch.allclose(shifted.log_prob, now.log_prob)


def update_metrics(algorithm: str, junk: bool) -> dict[str, float]:
    """One FlowGRPO (with KL) / DDRL / DiffusionNFT update of a fresh policy on a conditioned rollout."""
    policy, text, condition = setup()
    velocity = policy.velocity_fn()
    traj = rollout(velocity, text, condition, sde=algorithm != "diffusion_nft")
    trained = garbage_on_condition_frames(velocity) if junk else velocity
    w = WFMConfig(algorithm=algorithm, kl_beta=0.1, data_beta=1.0, num_minibatches=2, train_step_fraction=0.5)
    optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=1e-3)
    advantages = torch.tensor([1.0, -1.0])
    gen = lambda: torch.Generator().manual_seed(7)  # noqa: E731
    if algorithm == "diffusion_nft":
        return diffusion_nft_update(policy, trained, optimizer, samples=traj.samples, text=text, advantages=advantages,
                                    condition=traj.condition, wfm=w, grad_clip=1.0, nonfinite="stop",
                                    generator=gen(), step=1)
    clips = torch.cat([condition, torch.randn(B, SHAPE[0], SHAPE[1] - K, *SHAPE[2:])], dim=2) if (
        algorithm == "ddrl") else None
    rng = {"train_steps": gen(), "ddrl": gen()}
    return flow_grpo_update(policy, trained, optimizer, trajectory=traj, text=text, advantages=advantages,
                            clips=clips, wfm=w, grad_clip=1.0, nonfinite="stop", rng=rng, step=1)


@pytest.mark.parametrize("algorithm", ["flow_grpo", "ddrl", "diffusion_nft"])
def test_every_loss_ignores_the_condition_frames(algorithm):
    torch.manual_seed(0)
    clean = update_metrics(algorithm, junk=False)
    torch.manual_seed(0)
    junk = update_metrics(algorithm, junk=True)
    assert clean.keys() == junk.keys() and ("kl" in clean)
    assert clean == junk  # losses, KL, data loss, gradient norms: bitwise the same


def test_ddrl_data_loss_keeps_the_clip_frames_clean_and_out_of_the_loss():
    policy, text, condition = setup()
    velocity = policy.velocity_fn()
    x0 = torch.cat([condition, torch.randn(B, SHAPE[0], SHAPE[1] - K, *SHAPE[2:])], dim=2)
    noise, sigma = torch.randn(B, *SHAPE), torch.full((B,), 0.5)
    seen = {}

    def spy(x, t, text, num_condition_frames=0):
        seen["x"], seen["k"] = x, num_condition_frames
        return velocity(x, t, text, num_condition_frames=num_condition_frames)

    with torch.no_grad():
        base = ddrl_data_loss(spy, x0, text, noise=noise, sigma=sigma, num_condition_frames=K)
        assert seen["k"] == K and torch.equal(seen["x"][:, :, :K], condition)
        other_noise = noise.clone()
        other_noise[:, :, :K] += 5.0  # noise on the condition frames never reaches the model or the loss
        assert torch.equal(ddrl_data_loss(velocity, x0, text, noise=other_noise, sigma=sigma,
                                          num_condition_frames=K).loss, base.loss)


def test_cosmos_condition_mask_channel_flags_the_condition_frames():
    transformer = tiny_cosmos_transformer(seed=0)
    velocity = cosmos_velocity_fn(transformer)
    x, text = torch.randn(2, *SHAPE), torch.randn(2, 4, 32)
    t = torch.full((2,), 500.0)
    with torch.no_grad():
        plain, masked = velocity(x, t, text), velocity(x, t, text, num_condition_frames=K)
    assert plain.shape == masked.shape == x.shape
    assert not torch.allclose(plain, masked)  # the mask channel reaches the model


def test_a_condition_that_leaves_nothing_to_generate_is_refused_naming_the_keys():
    w = WFMConfig(conditioning="video", num_conditional_frames=3)
    assert WFMConfig().condition_latent_frames(1) == 0
    assert WFMConfig(conditioning="image").condition_latent_frames(2) == 1 and w.condition_latent_frames(4) == 3
    with pytest.raises(ValueError, match=r"num_conditional_frames = 3 .*num_frames = 5 encode to only 3 latent"):
        w.condition_latent_frames(3)
    with pytest.raises(ValueError, match=r"conditioning = \"image\" holds its first frame"):
        WFMConfig(conditioning="image").condition_latent_frames(1)
    policy, text, _ = setup()
    with pytest.raises(ValueError, match=r"condition must be \[B, C, F, H, W\]"):
        rollout(policy.velocity_fn(), text, torch.zeros(B, SHAPE[0], SHAPE[1], *SHAPE[2:]))


def test_recipe_refuses_more_conditional_frames_than_the_clips_have(tmp_path):
    with pytest.raises(ValueError, match="num_conditional_frames = 2 latent frames"):
        run_recipe(["--config", str(CONFIGS / "wfm_flowgrpo_tiny.toml"), f"train.output_dir={tmp_path}",
                    "logging.logger=[]", "wfm.conditioning=video", "wfm.data.num_frames=2"])


@pytest.mark.parametrize(("mode", "config", "extra"), [
    ("image", "wfm_flowgrpo_tiny.toml", ["wfm.data.num_frames=5"]),  # the tiny VAE: 5 frames -> 5 latent frames
    ("video", "wfm_ddrl_tiny.toml", ["wfm.data.num_frames=5", "wfm.num_conditional_frames=2"]),
    ("video", "wfm_nft_tiny.toml", ["wfm.data.num_frames=5", "wfm.num_conditional_frames=3"]),
])
def test_a_short_conditioned_run_of_the_recipe(mode, config, extra, tmp_path):
    run_dir = run_recipe([
        "--config", str(CONFIGS / config), f"train.output_dir={tmp_path}", "logging.logger=[]",
        f"wfm.conditioning={mode}",
        "train.max_steps=2", "wfm.num_samples_per_prompt=2", "wfm.num_inference_steps=3",
        "wfm.eval_num_inference_steps=2", "wfm.sampler.sde_window_size=0", "train.ckpt.enable_checkpoint=false",
        "wfm.eval_videos_per_prompt=1", *extra])
    records = [r for r in read_metrics(run_dir) if "reward_mean" in r]
    assert [r["step"] for r in records] == [1, 2]
    assert all(torch.isfinite(torch.tensor(r["policy_loss"])) for r in records)
    assert list((run_dir / "samples").glob("step_2/*.mp4"))


def test_config_copy_keeps_conditioning():  # the keys round-trip through the TOML dump a run writes
    cfg = cp.load_config(CONFIGS / "wfm_flowgrpo_tiny.toml", overrides=["wfm.conditioning=video",
                                                                        "wfm.num_conditional_frames=1"])
    again = cp.config.config_from_dict(copy.deepcopy(cp.config.config_to_dict(cfg)))
    assert (again.wfm.conditioning, again.wfm.num_conditional_frames) == ("video", 1)
    assert msgspec.structs.replace(again.wfm, conditioning="text").condition_latent_frames(1) == 0
