"""World-model RL: FlowGRPO, DDRL or DiffusionNFT on a diffusers flow-matching video transformer.

    python examples/wfm_rl.py --config examples/configs/wfm_flowgrpo_tiny.toml
    python examples/wfm_rl.py --config examples/configs/wfm_ddrl_tiny.toml train.max_steps=5 train.resume=true
    torchrun --nproc-per-node 8 examples/wfm_rl.py --config examples/configs/cosmos_predict2_5_2b_flowgrpo.toml \
        policy.model_name_or_path=/path/to/diffusers-folder wfm.data.path=/path/to/clips

cosmos-rl's world-model files (``configs/cosmos-predict2-5/``) are read as they are (the loader translates them;
``python -m cosmos_primitives.migrate FILE`` shows how, docs/from_cosmos_rl.md).

Each step: take this rank's next ``[wfm] rollout_batch_size`` prompts (``cp.data.WFMPromptSource``: a shuffled,
resumable order of a mock set or clip folder, or a stream of tar shards, local or on S3, with ``kind =
"webdataset"``; the ``[wfm] group_ranks`` ranks of a group read the same ones), roll out ``num_samples_per_prompt``
videos per prompt (``/ group_ranks`` on each rank of a group) with the SDE sampler (log-probs recorded; with ``[wfm]
conditioning = "image"`` / ``"video"`` the clip's first latent frames, VAE-encoded, are held fixed as
Cosmos-Predict2.5's image- / video-to-world does), decode them with the VAE, score them with the reward service,
turn rewards into group advantages (the group's rewards gathered from its ranks), then update the LoRA adapters
(``[policy.lora]``; without it all weights) with the FlowGRPO loss on a fraction of the stochastic steps (+
``data_beta`` times the flow-matching loss on the prompts' real clips for DDRL; ``cp.policy.flow_grpo_update``),
``[wfm] num_minibatches`` optimizer steps per batch, each accumulating the gradients of micro-batches of
``[train.train_policy] mini_batch`` samples (the activation memory of one forward / backward). DiffusionNFT
(``algorithm = "diffusion_nft"``) rolls out with plain ODE steps instead and trains on the clean samples alone
(``cp.policy.diffusion_nft_update``). With ``[wfm] start_reward_server = true`` the reference reward server is
started on loopback for the run. Metrics go to ``<output_dir>/<timestamp>/metrics.jsonl``; before the first step,
every ``[wfm] eval_freq`` steps and after the last, deterministic rollouts of fixed prompts and seeds are scored and
written to ``samples/step_N/`` (mp4s named by reward, ``rewards.json``; W&B ``eval/videos`` when W&B is on), and
``curves.png`` is redrawn.

With ``[train.ckpt] enable_checkpoint`` the trainable weights (not LoRA's frozen base), AdamW and the LR schedule,
the prompt order's position, the bad samples counted and the RNGs are saved every ``save_freq`` steps (DCP, under
``checkpoints/``), and the trained weights go to ``trained_weights.safetensors`` at the end. With
``export_safetensors`` a diffusers folder (``transformer/`` with the LoRA merged, ``lora/`` the adapters alone,
``vae/``, ``scheduler/``, ``model_index.json``) goes to ``safetensors/step_N`` at each save and
``safetensors/final`` at the end. ``train.resume=true`` goes on from the latest checkpoint, in its run's folder,
exactly as if never stopped: each step draws its randomness (SDE noise, SDE window, trained steps, DDRL noise) from
generators seeded by ``(seed, step, rank)``, and the rewards are functions of the videos. A web dataset resumes at
the saved shard and sample, with the bad samples counted so far. A SIGTERM or SIGUSR1 (``[train] signal_to_handle``)
saves a checkpoint when the step in progress ends and stops the run with exit status 75, from which
``train.resume=true`` goes on the same way. Ctrl-C stops at once (exit status 130, the checkpoints left whole) and
prints the command that resumes the run.
"""

from __future__ import annotations

import contextlib
import functools
import math
from pathlib import Path
from typing import Any

import torch

import cosmos_primitives as cp
from cosmos_primitives.checkpoint import CheckpointManager
from cosmos_primitives.config import PolicyConfig
from cosmos_primitives.rewards.remote import RemoteRewardClient, reward_client
from cosmos_primitives.rollout.flow_sampler import sample_flow
from cosmos_primitives.utils import derived_generator, derived_seed

CURVES = ["reward_mean", "eval/reward_mean", "reward_std", "policy_loss", "kl", "data_loss"]  # in curves.png


def build_models(policy: PolicyConfig, text_dim: int, device: torch.device, dtype: torch.dtype) -> tuple[Any, Any, Any]:
    """(transformer in ``dtype``, vae, noise scheduler): the tiny random ones, or a diffusers folder / hub id."""
    if policy.model_name_or_path != "tiny":
        transformer, vae, scheduler = cp.policy.load_flow_model(policy, dtype=dtype)
    else:  # one fixed random model (like a checkpoint); [train] seed varies the noise and the data order
        if device.type == "cpu":
            torch.set_num_threads(1)  # tiny matrices: thread start-up costs far more than the maths
        transformer = cp.testing.tiny_wan_transformer(seed=0, text_dim=text_dim).to(dtype)
        vae, scheduler = cp.testing.tiny_wan_vae(seed=0), cp.testing.tiny_flow_scheduler()
    return transformer.to(device), vae.to(device).requires_grad_(False).eval(), scheduler


def score(client: RemoteRewardClient, vae: Any, latents: torch.Tensor, captions: list[str],
          fps: float, chunk: int) -> tuple[torch.Tensor, Any]:
    """Decode latents ``chunk`` samples at a time (the decoder's float32 feature maps of a 480p video take
    GBs per sample) and score the videos: ``[B]`` float32 rewards, the ``[B, 3, T, H, W]`` uint8 videos."""
    video = torch.cat([cp.rollout.video_to_uint8(cp.rollout.decode_video(vae, part)).cpu()
                       for part in latents.split(chunk)]).numpy()
    return torch.from_numpy(client.score_sync(captions, video, "video", video_fps=fps).total).float(), video


def curve_keys(w: Any) -> list[str]:
    """The metrics ``curves.png`` draws for ``[wfm]`` ``w``: :data:`CURVES`, less ``kl`` when ``kl_beta = 0``
    (no KL term: its panel would be a flat line)."""
    return [key for key in CURVES if key != "kl" or w.kl_beta > 0]


def train(cfg: cp.Config, config_path: str) -> Path:
    """Run the whole loop; returns the run directory."""
    # process group, config checks, [train] seed (the same LoRA initialisation on every rank and in every
    # run: a diffusers folder's loader draws nothing); the run folder and the checkpoint to resume from,
    # decided together (a resume continues in its own run's folder); <run_dir>/config.toml
    run = cp.run.start(cfg, config_path)
    cfg, info, run_dir = run.cfg, run.info, run.run_dir
    device = torch.device(info.device)
    w, s, seed = cfg.wfm, cfg.wfm.sampler, cfg.train.seed

    # Model: the transformer (LoRA or full fine-tuning, FSDP2 under torchrun), its VAE and sigma grid.
    dtype = cp.policy.resolve_dtype(cfg.policy.dtype)
    sharded = info.world_size > 1
    if cp.plan.startup.is_diffusers_folder(cfg.policy.model_name_or_path):  # bytes per rank, logged by rank 0
        cp.plan.log_memory_plan(cfg, info.world_size, device, mode="wfm")
    # under FSDP2 the weights stay float32 and are gathered in [policy] dtype (mixed precision)
    transformer, vae, noise_scheduler = build_models(cfg.policy, w.data.text_dim, device,
                                                     torch.float32 if sharded else dtype)
    policy = cp.policy.DiffusionPolicy(transformer, lora=cfg.policy.lora, keep_reference=w.kl_beta > 0,
                                       gradient_checkpointing=cfg.policy.model_gradient_checkpointing,
                                       num_train_timesteps=float(noise_scheduler.config.num_train_timesteps))
    for p in policy.trainable_parameters():
        p.data = p.data.float()  # float32 master weights for AdamW (LoRA; full fine-tuning without FSDP2)
    # the ranks of one cp group work on the same prompts and noise (data_rank): each runs the blocks on its
    # share of the video tokens ([policy.parallelism] cp_size, alias [model_parallel] context_parallel_size)
    data_rank, data_ranks, cp_rank = info.rank, info.world_size, 0
    if sharded:  # FSDP2 over [policy.parallelism] (dp_shard, or dp_replicate x dp_shard for HSDP; x cp)
        mesh = cp.parallel.ParallelMesh(cfg.policy.parallelism, device_type=device.type)
        data_rank, data_ranks, cp_rank = mesh.dp_rank, mesh.dp_size, mesh.local_rank("cp")
        if mesh.enabled("cp"):
            policy.enable_context_parallel(mesh)
        policy.shard(mesh.fsdp_mesh, param_dtype=None if dtype == torch.float32 else dtype)
    cp.utils.seed_everything(seed + data_rank)  # after the model builders, which seed torch themselves
    velocity = policy.velocity_fn()
    sigmas, timesteps = cp.rollout.flow_sigmas(noise_scheduler, w.num_inference_steps, shift=s.shift)
    if w.eval_num_inference_steps > 0:  # (some schedulers refuse a grid of 0 steps)
        eval_sigmas, eval_timesteps = cp.rollout.flow_sigmas(noise_scheduler, w.eval_num_inference_steps,
                                                             shift=s.shift)
    sde = cp.algo.SDEParams(sde_type=s.sde_type, noise_level=s.noise_level, noise_min=s.noise_min,
                               noise_max=s.noise_max)

    # Prompts (bad clips skipped and counted, as in SFT: [train.train_policy.dataset] bad_sample_budget),
    # optimizer, checkpoints. A prompt's group of rollouts may span `spread` data ranks ([wfm] group_ranks,
    # cosmos-rl's world-model layout): they read the same prompts and roll out `group` samples each.
    spread = math.gcd(w.group_ranks, data_ranks)
    group, per_step = w.num_samples_per_prompt // spread, w.rollout_batch_size
    group_index, member = divmod(data_rank, spread)
    if spread * group != w.num_samples_per_prompt:
        raise ValueError(f"[wfm] num_samples_per_prompt = {w.num_samples_per_prompt} cannot be shared by the "
                         f"{spread} data ranks of a group ([wfm] group_ranks = {w.group_ranks})")
    source = cp.data.WFMPromptSource(w.data, seed=seed, rank=group_index, world_size=data_ranks // spread,
                                     per_step=per_step,
                                     bad_sample_budget=cfg.train.train_policy.dataset.bad_sample_budget)
    guided = cp.algo.to_diffusers_guidance(w.guidance_scale, w.guidance_convention) != 1.0
    negative = cp.data.negative_prompt_embedding(w.data, w.negative_prompt)[0].to(device) if guided else None
    blank = torch.zeros(1, 3, w.data.num_frames, w.data.height, w.data.width, device=device)  # every item's shape
    latent_shape = tuple(cp.rollout.encode_video(vae, blank).shape[1:])
    del blank  # 370 MB at 93 x 432 x 768
    # image- / video-to-world: the clip's first latent frames, VAE-encoded, are held fixed (0: text-to-world);
    # a step draws how many from [lo, num_cond] (lo < num_cond with [wfm] min_num_conditional_frames)
    lo_cond, num_cond = w.condition_frame_range(latent_shape[1])
    if w.reference_update_interval and not policy.has_reference:
        raise ValueError("[wfm] reference_update_interval is set but there is no reference: it needs kl_beta > 0")
    eval_batch, eval_ids = source.eval_prompts()  # fixed for the run
    cp.policy.check_text_width(transformer, eval_batch["text"].shape[-1])  # e.g. 100352 for Cosmos-Predict2.5
    nft = w.algorithm == "diffusion_nft"
    # samples per forward / backward; the gradients of a [wfm] num_minibatches mini-batch are accumulated
    micro_batch = cfg.train.train_policy.mini_batch
    total_steps = cfg.train.max_steps or cfg.train.epoch * source.steps_per_epoch()
    optimizer = cp.policy.build_optimizer(policy.transformer, cfg.train)
    lr_scheduler = cp.policy.build_lr_scheduler(optimizer, cfg.train, total_steps)
    # LoRA's frozen base weights stay out of the checkpoints: a resumed run loads them from the model's source
    # exports (export_safetensors): a diffusers folder, LoRA merged into transformer/, the adapters in lora/
    exporter = functools.partial(cp.checkpoint.export_diffusers, components={"vae": vae, "scheduler": noise_scheduler})
    ckpt = CheckpointManager(cfg.train.ckpt, run_dir, model=policy.transformer, optimizer=optimizer,
                             scheduler=lr_scheduler, sampler=source, frozen_params=False, exporter=exporter)
    state = ckpt.resume(run.resume_from)
    step = state.step if state else 0

    curves = curve_keys(w)
    with contextlib.ExitStack() as stack:
        # with [wfm] start_reward_server the reference server runs on loopback for the run
        client = reward_client(cfg.remote_reward, start_server=w.start_reward_server, stack=stack)
        tracker = cp.logging.MetricsTracker(run_dir, cfg.logging, run_config=cp.config.config_to_dict(cfg),
                                            total_steps=total_steps, resumed_step=step if cfg.train.resume else None)
        stack.callback(tracker.finish)  # also when the loop fails
        tracker.log_text(f"{w.algorithm}: {policy.num_trainable():,} trainable weights, latents {latent_shape}, "
                         f"{group} x {per_step} rollouts of {w.num_inference_steps} steps per update and rank"
                         + (f" (groups of {group * spread} over {spread} ranks)" if spread > 1 else "") + "; "
                         f"steps {step + 1}..{total_steps}; run dir {run_dir}")

        def clip_latents(video: torch.Tensor) -> torch.Tensor:
            """The prompts' clips ``[P, 3, T, H, W]`` encoded, one per rollout: ``[P * group, C, T', H', W']``."""
            return cp.rollout.encode_video(vae, video.to(device)).repeat_interleave(group, 0)

        eval_condition = clip_latents(eval_batch["video"])[:, :, :num_cond] if num_cond else None

        def evaluate(at_step: int) -> None:
            """Deterministic (ODE) rollouts with the evaluation step count, on fixed prompts and seeds;
            their mp4s and rewards under samples/step_N, the curves in curves.png."""
            batch, prompt_ids = eval_batch, eval_ids
            text = batch["text"].to(device).repeat_interleave(group, 0)
            seeds = [derived_seed("eval", data_rank, i) for i in range(text.shape[0])]  # the same every time
            traj = sample_flow(velocity, text, latent_shape=latent_shape, sigmas=eval_sigmas,
                               timesteps=eval_timesteps, seeds=seeds, negative_text=negative,
                               guidance_scale=w.guidance_scale, guidance_convention=w.guidance_convention,
                               condition=eval_condition)
            captions = [c for c in batch["caption"] for _ in range(group)]
            rewards, video = score(client, vae, traj.samples, captions, w.data.fps, micro_batch)
            tracker.log_metrics({"eval/reward_mean": rewards.mean()}, at_step)
            ids = [p for p in prompt_ids for _ in range(group)]
            if cp_rank == 0:  # the other ranks of its cp group made the same videos
                cp.logging.save_video_samples(run_dir, at_step, video, prompt_ids=ids, captions=captions, seeds=seeds,
                                              rewards=rewards.tolist(), fps=w.data.fps, rank=data_rank,
                                              tracker=tracker, videos_per_prompt=w.eval_videos_per_prompt)
            if info.is_rank0:
                cp.logging.plot_run(run_dir, keys=curves)

        evaluating = w.eval_num_inference_steps > 0
        if evaluating and step == 0:
            evaluate(0)
        prompts = source.stream()  # from the (resumed) position
        # a SIGTERM / SIGUSR1 ([train] signal_to_handle) saves the step in progress once it ends, then stops
        preemption = cp.checkpoint.Preemption.from_config(cfg.train, device=device)
        while step < total_steps:
            step += 1
            # every random draw of this step comes from (seed, step, data rank): a resumed run repeats it
            rng = {"train_steps": derived_generator(seed, step, data_rank, "train_steps"),
                   "ddrl": derived_generator(seed, step, data_rank, "ddrl", device=device),  # where the clips are
                   "nft": derived_generator(seed, step, data_rank, "nft")}
            batch = cp.data.collate_clips([next(prompts) for _ in range(per_step)])
            text = batch["text"].to(device).repeat_interleave(group, 0)  # [B, L, D], B = per_step * group
            captions = [c for c in batch["caption"] for _ in range(group)]
            # seeded by (group, prompt, sample in the prompt's group): the same rollouts however the group is spread
            seeds = [derived_seed(seed, step, group_index, "rollout", i // group * w.num_samples_per_prompt
                                  + member * group + i % group) for i in range(text.shape[0])]
            # [wfm] shared_initial_noise: a prompt's rollouts (on every rank of its group) start from one noise
            noise_seeds = ([derived_seed(seed, step, group_index, "noise", i // group) for i in range(text.shape[0])]
                           if w.shared_initial_noise else None)
            k = num_cond if lo_cond == num_cond else int(torch.randint(
                lo_cond, num_cond + 1, (1,), generator=derived_generator(seed, step, group_index, "condition")))
            # DDRL's real clips; their first latent frames are the condition of image- / video-to-world
            clips = clip_latents(batch["video"]) if w.algorithm == "ddrl" or k else None
            condition = clips[:, :, :k] if k else None
            if w.reference_update_interval and (step - 1) % w.reference_update_interval == 0:
                policy.refresh_reference()  # cosmos-rl's update_ref_every_iter: the KL is to a recent policy
            # one SDE window for the whole batch, the same on every rank
            window = (cp.rollout.sliding_sde_window(w.num_inference_steps, s.sde_window_size, step - 1,
                                                    shift_interval=s.sde_window_shift_interval,
                                                    stride=s.sde_window_stride, window_range=s.sde_window_range)
                      if s.sde_window_mode == "sliding" else
                      cp.rollout.sde_window(w.num_inference_steps, s.sde_window_size, s.sde_window_range,
                                            derived_generator(seed, step, "sde_window")))
            traj = sample_flow(velocity, text, latent_shape=latent_shape, sigmas=sigmas, timesteps=timesteps,
                               seeds=seeds, negative_text=negative, guidance_scale=w.guidance_scale,
                               guidance_convention=w.guidance_convention, sde=None if nft else sde,
                               sde_steps=None if nft else window,  # DiffusionNFT: plain ODE rollouts
                               condition=condition, noise_seeds=noise_seeds)
            rewards, _ = score(client, vae, traj.samples, captions, w.data.fps, micro_batch)
            # the group's rewards from all its ranks ([spread, B]); this rank's advantages are row `member`
            group_rewards = cp.parallel.gather_group_rewards(rewards, data_rank=data_rank, group_ranks=spread,
                                                             cp_rank=cp_rank)
            advantages = cp.algo.flow_grpo_advantages(
                group_rewards.flatten(), torch.arange(per_step).repeat_interleave(group).repeat(spread),
                std_scope=w.advantage_std_scope, unbiased=w.advantage_std == "sample").view(spread, -1)[member]
            advantages = advantages.to(device)
            if w.advantage_transform == "neg_exp":
                advantages = cp.algo.neg_exp_advantages(advantages, clip=w.adv_clip_max)

            if nft:  # DiffusionNFT: the clean samples alone
                logged = cp.policy.diffusion_nft_update(
                    policy, velocity, optimizer, samples=traj.samples, text=text, advantages=advantages,
                    condition=condition, sigmas=sigmas, wfm=w, grad_clip=cfg.train.optm_grad_norm_clip,
                    nonfinite=cfg.train.nonfinite, micro_batch=micro_batch, generator=rng["nft"], step=step)
            else:  # FlowGRPO, + DDRL's data loss on the real clips
                logged = cp.policy.flow_grpo_update(
                    policy, velocity, optimizer, trajectory=traj, text=text, advantages=advantages, negative=negative,
                    clips=clips if w.algorithm == "ddrl" else None, wfm=w, grad_clip=cfg.train.optm_grad_norm_clip,
                    nonfinite=cfg.train.nonfinite, micro_batch=micro_batch, rng=rng, step=step)
            lr_scheduler.step()
            logged.update(reward_mean=group_rewards.mean(), reward_std=group_rewards.std(unbiased=False),
                          lr=lr_scheduler.get_last_lr()[0], bad_samples=source.bad.count)
            tracker.log_metrics(logged, step)
            ckpt.maybe_save(step, epoch=source.epoch, force=step == total_steps)
            if evaluating and (step == total_steps or (w.eval_freq > 0 and step % w.eval_freq == 0)):
                evaluate(step)
            if preemption.stop_here(ckpt, step, epoch=source.epoch):
                break
        if cfg.train.ckpt.enable_checkpoint and not preemption.stopped:
            weights = policy.adapter_state_dict()  # collective under FSDP2: every rank takes part
            if info.is_rank0:
                from safetensors.torch import save_file

                save_file(weights, str(run_dir / "trained_weights.safetensors"))
        # safetensors/final (with export_safetensors: a diffusers folder) unless preempted, checkpoints and
        # uploads settled, <run dir>/curves.png, exit status
        run.finish(ckpt, tracker, preemption, step=step, total_steps=total_steps, plot=curves)
    return run_dir


def main(argv: list[str] | None = None) -> Path:
    cfg, config_path = cp.config.load_recipe_config(__doc__, argv=argv)  # --config FILE, dotted overrides
    try:
        return train(cfg, config_path)
    finally:
        cp.parallel.destroy_distributed()  # also when start-up or the loop fails


if __name__ == "__main__":
    with cp.checkpoint.exit_on_interrupt():  # Ctrl-C: no traceback; prints the command that resumes the run
        main()
