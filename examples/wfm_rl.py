"""World-model RL: FlowGRPO or DDRL on a diffusers flow-matching video transformer.

    python examples/wfm_rl.py --config examples/configs/wfm_flowgrpo_tiny.toml
    python examples/wfm_rl.py --config examples/configs/wfm_ddrl_tiny.toml train.max_steps=5
    torchrun --nproc-per-node 8 examples/wfm_rl.py --config examples/configs/cosmos_predict2_5_2b_flowgrpo.toml

Each step: take ``prompts_per_step`` prompts, roll out ``num_samples_per_prompt`` videos per prompt
with the SDE sampler (log-probs recorded), decode them with the VAE, score them with the reward
service, turn rewards into group advantages, then update the LoRA adapters (or all weights) with
the FlowGRPO loss on a fraction of the stochastic steps (+ ``data_beta`` times the flow-matching
loss on the prompts' real clips for DDRL). With ``[wfm] start_reward_server = true`` the reference
reward server is started on loopback for the run. Metrics go to ``<output_dir>/<timestamp>/metrics.jsonl``.
Under torchrun every rank rolls out its own prompts and the transformer is FSDP2-sharded.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from pathlib import Path
from typing import Any

import torch

import cosmos_primitives as cp
from cosmos_primitives.algo.ddrl import ddrl_data_loss, neg_exp_advantages
from cosmos_primitives.algo.flow_grpo import flow_grpo_advantages, flow_grpo_loss, select_train_steps
from cosmos_primitives.data.wfm_clips import build_wfm_dataset, collate_clips, negative_prompt_embedding
from cosmos_primitives.policy.diffusion import DiffusionPolicy
from cosmos_primitives.rewards.remote import RemoteRewardClient
from cosmos_primitives.rollout.flow_sampler import (
    flow_sigmas,
    recompute_step,
    sample_flow,
    sde_window,
    to_diffusers_guidance,
)
from cosmos_primitives.rollout.flow_sde import SDEParams, gaussian_mean_kl
from cosmos_primitives.rollout.flow_vae import decode_video, encode_video, video_to_uint8


def build_models(cfg: cp.Config, device: torch.device, dtype: torch.dtype) -> tuple[Any, Any, Any]:
    """(transformer in ``dtype``, vae, scheduler): the tiny random ones, or a diffusers folder / hub id."""
    w = cfg.wfm
    if cfg.policy.model_name_or_path == "tiny":
        if device.type == "cpu":
            torch.set_num_threads(1)  # tiny matrices: thread start-up costs far more than the maths
        # one fixed random model (like a checkpoint); [train] seed varies the noise and the data order
        transformer = cp.testing.tiny_wan_transformer(seed=0, text_dim=w.data.text_dim)
        if dtype != torch.float32:
            transformer = transformer.to(dtype)
        vae, scheduler = cp.testing.tiny_wan_vae(seed=0), cp.testing.tiny_flow_scheduler()
    else:
        diffusers = cp.utils.require("diffusers", "loading a flow transformer")
        # torch_dtype keeps the modules the model wants in float32 (norms, time embedding) there
        path = cfg.policy.model_name_or_path
        transformer = diffusers.AutoModel.from_pretrained(path, subfolder="transformer", torch_dtype=dtype)
        vae = diffusers.AutoModel.from_pretrained(path, subfolder="vae")
        # the folder names its scheduler: FlowMatchEulerDiscreteScheduler (Wan) or a flow-sigma
        # UniPCMultistepScheduler (Cosmos-Predict2.5); only its sigma grid is used
        scheduler_config = diffusers.FlowMatchEulerDiscreteScheduler.load_config(path, subfolder="scheduler")
        scheduler = getattr(diffusers, scheduler_config["_class_name"]).from_config(scheduler_config)
    return transformer.to(device), vae.to(device).requires_grad_(False).eval(), scheduler


def reward_client(cfg: cp.Config, stack: contextlib.ExitStack) -> RemoteRewardClient:
    """The reward-service client; starts the reference server on loopback when the config says so."""
    if not cfg.wfm.start_reward_server:
        return RemoteRewardClient(cfg.remote_reward)
    from cosmos_primitives.rewards.server import RewardServer

    token = os.environ.get(cfg.remote_reward.token_env) or "wfm-rl-local"
    server = stack.enter_context(RewardServer(host="127.0.0.1", port=0, token=token))
    return RemoteRewardClient(cfg.remote_reward, enqueue_url=server.enqueue_url, fetch_url=server.fetch_url,
                              token=token)


def score(client: RemoteRewardClient, vae: Any, latents: torch.Tensor, captions: list[str], fps: float) -> torch.Tensor:
    """Decode latents and score the videos: ``[B]`` float32 rewards."""
    video = video_to_uint8(decode_video(vae, latents)).cpu().numpy()  # [B, 3, T, H, W]
    return torch.from_numpy(client.score_sync(captions, video, "video", video_fps=fps).total).float()


def prompt_batch(dataset: Any, step: int, count: int, rank: int, world: int) -> dict[str, Any]:
    """``count`` items for this rank at this step (cycling through the dataset)."""
    start = (step * world + rank) * count
    return collate_clips([dataset[(start + i) % len(dataset)] for i in range(count)])


def train(cfg: cp.Config) -> Path:
    """Run the whole loop; returns the run directory."""
    info = cp.parallel.init_distributed()
    device = torch.device(info.device)
    w, s = cfg.wfm, cfg.wfm.sampler
    run_dir = cp.utils.make_run_dir(cfg.train.output_dir) if info.is_rank0 else None
    run_dir = Path(cp.parallel.broadcast_object(str(run_dir)))  # one folder for all ranks
    if info.is_rank0:
        cp.config.dump_config(cfg, run_dir / "config.toml")

    bf16 = cfg.policy.dtype == "bfloat16"
    # under FSDP2 the weights stay float32 and are gathered in bf16 (mixed-precision policy)
    transformer, vae, scheduler = build_models(cfg, device, torch.bfloat16 if bf16 and info.world_size == 1
                                               else torch.float32)
    num_train_timesteps = float(scheduler.config.num_train_timesteps)
    policy = DiffusionPolicy(transformer, lora=cfg.policy.lora, keep_reference=w.kl_beta > 0,
                             gradient_checkpointing=cfg.policy.model_gradient_checkpointing,
                             num_train_timesteps=num_train_timesteps)
    for p in policy.trainable_parameters():
        p.data = p.data.float()  # float32 master weights for AdamW (LoRA; full fine-tuning without FSDP2)
    cp.utils.seed_everything(cfg.train.seed + info.rank)  # after the model builders, which seed torch themselves
    if info.world_size > 1:  # FSDP2 over [policy.parallelism] (dp_shard, or dp_replicate x dp_shard for HSDP)
        mesh = cp.parallel.ParallelMesh(cfg.policy.parallelism, device_type=device.type)
        policy.shard(mesh.fsdp_mesh, param_dtype=torch.bfloat16 if bf16 else None)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=cfg.train.optm_lr,
                                  betas=tuple(cfg.train.optm_betas), weight_decay=cfg.train.optm_weight_decay)

    dataset = build_wfm_dataset(w.data, seed=cfg.train.seed)
    guided = to_diffusers_guidance(w.guidance_scale, w.guidance_convention) != 1.0
    negative = negative_prompt_embedding(w.data, w.negative_prompt)[0].to(device) if guided else None
    sigmas, timesteps = flow_sigmas(scheduler, w.num_inference_steps, shift=s.shift)
    if w.eval_num_inference_steps > 0:  # (some schedulers refuse a grid of 0 steps)
        eval_sigmas, eval_timesteps = flow_sigmas(scheduler, w.eval_num_inference_steps, shift=s.shift)
    sde = SDEParams(sde_type=s.sde_type, noise_level=s.noise_level, noise_min=s.noise_min, noise_max=s.noise_max)
    latent_shape = tuple(encode_video(vae, dataset[0]["video"][None].to(device)).shape[1:])
    group, per_step = w.num_samples_per_prompt, w.data.prompts_per_step
    velocity = policy.velocity_fn()
    window_gen = torch.Generator().manual_seed(cfg.train.seed)
    total_steps = cfg.train.max_steps or 100

    with contextlib.ExitStack() as stack:
        client = reward_client(cfg, stack)
        tracker = cp.logging.MetricsTracker(run_dir, cfg.logging, run_config=cp.config.config_to_dict(cfg),
                                            total_steps=total_steps)
        stack.callback(tracker.finish)
        tracker.log_text(f"{w.algorithm}: {policy.num_trainable():,} trainable weights, latents {latent_shape}, "
                         f"{group} x {per_step} rollouts of {w.num_inference_steps} steps per update")

        def evaluate(step: int) -> None:
            """Deterministic (ODE) rollouts with the evaluation step count, fixed seeds."""
            batch = prompt_batch(dataset, 0, per_step, info.rank, info.world_size)
            text = batch["text"].to(device).repeat_interleave(group, 0)
            seeds = [2**62 + info.rank * text.shape[0] + i for i in range(text.shape[0])]  # same every time
            traj = sample_flow(velocity, text, latent_shape=latent_shape, sigmas=eval_sigmas,
                               timesteps=eval_timesteps, seeds=seeds, negative_text=negative,
                               guidance_scale=w.guidance_scale, guidance_convention=w.guidance_convention)
            rewards = score(client, vae, traj.samples, [c for c in batch["caption"] for _ in range(group)], w.data.fps)
            tracker.log_metrics({"eval/reward_mean": rewards.mean()}, step)

        if w.eval_num_inference_steps > 0:
            evaluate(0)
        for step in range(1, total_steps + 1):
            batch = prompt_batch(dataset, step - 1, per_step, info.rank, info.world_size)
            text = batch["text"].to(device).repeat_interleave(group, 0)  # [B, L, D], B = per_step * group
            captions = [c for c in batch["caption"] for _ in range(group)]
            group_ids = torch.arange(per_step).repeat_interleave(group)
            first = cfg.train.seed * 2**40 + (step * info.world_size + info.rank) * text.shape[0]
            seeds = [first + i for i in range(text.shape[0])]  # one per rollout, never reused
            traj = sample_flow(velocity, text, latent_shape=latent_shape, sigmas=sigmas, timesteps=timesteps,
                               seeds=seeds, negative_text=negative, guidance_scale=w.guidance_scale,
                               guidance_convention=w.guidance_convention, sde=sde,
                               sde_steps=sde_window(w.num_inference_steps, s.sde_window_size, s.sde_window_range,
                                                    window_gen))
            rewards = score(client, vae, traj.samples, captions, w.data.fps)
            advantages = flow_grpo_advantages(rewards, group_ids, std_scope=w.advantage_std_scope).to(device)
            if w.advantage_transform == "neg_exp":
                advantages = neg_exp_advantages(advantages, clip=w.adv_clip_max)
            clips = None
            if w.algorithm == "ddrl":  # with data_beta = 0 the data loss is only measured
                clips = encode_video(vae, batch["video"].to(device)).repeat_interleave(group, 0)

            positions = select_train_steps(traj.sde_steps.numel(), w.train_step_fraction)
            metrics: dict[str, list[float]] = {}
            for mb in torch.arange(traj.batch_size).chunk(w.num_minibatches):
                sub, sub_text, sub_adv = traj.select(mb), text[mb], advantages[mb]
                optimizer.zero_grad(set_to_none=True)
                for pos in positions.tolist():
                    now = recompute_step(velocity, sub, int(sub.sde_steps[pos]), sub_text, negative)
                    kl = None
                    if w.kl_beta > 0:
                        with policy.reference() as ref_velocity:
                            ref = recompute_step(ref_velocity, sub, int(sub.sde_steps[pos]), sub_text, negative)
                        kl = gaussian_mean_kl(now.mean, ref.mean, now.std, reduction=w.kl_reduction)
                    out = flow_grpo_loss(now.log_prob, sub.log_probs[:, pos], sub_adv, clip_range=w.clip_range,
                                         adv_clip_max=w.adv_clip_max, kl=kl, kl_beta=w.kl_beta)
                    loss = out.loss
                    if clips is not None:
                        with torch.set_grad_enabled(w.data_beta > 0):
                            data = ddrl_data_loss(velocity, clips[mb], sub_text,
                                                  noise=sub.initial_noise if w.ddrl_rollout_noise else None,
                                                  sigma=now.sigma if w.ddrl_rollout_sigma else None,
                                                  num_train_timesteps=num_train_timesteps,
                                                  weighting=w.ddrl_loss_weighting)
                        loss = loss + w.data_beta * data.loss
                        metrics.setdefault("data_loss", []).append(data.loss.item())
                    (loss / len(positions)).backward()
                    for key in ("policy_loss", "kl", "clip_fraction", "approx_kl", "ratio_mean"):
                        metrics.setdefault(key, []).append(getattr(out, key).item())
                grad_norm = torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), cfg.train.optm_grad_norm_clip)
                optimizer.step()
                if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP2
                    grad_norm = grad_norm.full_tensor()
                metrics.setdefault("grad_norm", []).append(float(grad_norm))
            logged = {k: sum(v) / len(v) for k, v in metrics.items()}
            logged.update(reward_mean=rewards.mean(), reward_std=rewards.std(unbiased=False))
            tracker.log_metrics(logged, step)
        if w.eval_num_inference_steps > 0:
            evaluate(total_steps)
        if cfg.train.ckpt.enable_checkpoint:
            weights = policy.adapter_state_dict()  # collective under FSDP2: every rank takes part
            if info.is_rank0:
                from safetensors.torch import save_file

                save_file(weights, str(run_dir / "trained_weights.safetensors"))
    return run_dir


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="TOML recipe, e.g. examples/configs/wfm_flowgrpo_tiny.toml")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.max_steps=5 wfm.clip_range=1e-3")
    args = parser.parse_args(argv)
    try:
        return train(cp.load_config(args.config, overrides=args.overrides))
    finally:
        cp.parallel.destroy_distributed()


if __name__ == "__main__":
    main()
