"""GRPO for a vision-language reasoner (Cosmos-Reason / Qwen2.5-VL) on MCQ image or video prompts, colocated;
text-only causal LMs (Qwen2 / Qwen2.5 / Qwen3) and prompt / answer columns run the same way.

    python examples/grpo_vlm.py --config examples/configs/grpo_tiny.toml
    torchrun --nproc_per_node 2 examples/grpo_vlm.py --config examples/configs/grpo_tiny.toml
    python examples/grpo_vlm.py --config examples/configs/grpo_text_tiny.toml   # a text-only model

Read top to bottom: set up, train, save. Every rank generates rollouts for its own prompts with a
rollout engine (``[rollout] backend``: HF ``generate`` or vLLM), scores them, and trains; after each
optimizer step the engine sees the new weights (``cp.sync.InProcessSync``). To generate and train on
separate GPUs joined by a Redis queue, run ``examples/grpo_trainer_job.py`` and
``examples/grpo_rollout_job.py`` (one launch starts both: ``examples/run_jobs_local.sh``).

One step: prompts -> ``n`` completions each (tagged with the weight version) -> rewards -> group
advantages -> log-probs (old / reference / current) -> GRPO loss -> optimizer step -> weight sync.
With ``[validation] enable`` the engine also answers held-out items every ``freq`` steps: those of
``[validation.dataset]``, or without its ``name`` the ``[train.train_policy.dataset] test_size`` items
held out of the training prompts (unset: 10 %), which training then never sees. A SIGTERM or SIGUSR1
(``[train] signal_to_handle``) saves a checkpoint when the step in progress ends and stops the run with
exit status 75; ``train.resume=true`` goes on from it as if never stopped. Ctrl-C stops at once (exit
status 130, the checkpoints left whole) and prints the command that resumes the run.

``[distillation] enable``: a frozen teacher (``model_name_or_path``, the student's tokenizer) scores
every sampled token; the per-token advantage is ``-kl_penalty_coef`` x the sampled reverse KL to it,
summed forward with ``kl_discount_factor`` (rewards bypassed, as cosmos-rl; ``reward_advantages =
"add"`` adds them). ``[rollout.multi_turn_config] enable``: each sample is an episode of up to
``max_assistant_turns`` model turns, the ``environment`` callable answering each.
"""

from __future__ import annotations

import math
import time

import torch

import cosmos_primitives as cp
from cosmos_primitives.checkpoint import CheckpointManager
from cosmos_primitives.data import (
    BadSampleError,
    BadSampleTracker,
    MCQPromptDataset,
    ResumableDistributedSampler,
    SamplingParams,
    build_grpo_datasets,
    collate_rollouts,
    prompt_stream,
)
from cosmos_primitives.policy.distill import distill_advantages, load_teacher
from cosmos_primitives.rollout.episodes import generate_rollouts, load_environment, score_rollouts
from cosmos_primitives.sync import InProcessSync


def validate(engine, dataset: MCQPromptDataset, cfg: cp.config.Config, mesh: cp.parallel.ParallelMesh,
             bad: BadSampleTracker) -> dict[str, float]:
    """``[validation]``: one completion per held-out item (this rank's share), scored with
    ``[validation] reward_function`` (empty: the training rewards); means over every rank's items, as
    ``validation/*`` metrics."""
    rewards = cp.rewards.RewardSet(cp.config.validation_rewards(cfg))
    names = list(cp.config.validation_rewards(cfg))
    count = cp.config.validation_item_count(cfg, len(dataset))
    mine = list(range(mesh.dp_rank, count, mesh.dp_size))
    sums = torch.zeros(len(names) + 2, dtype=torch.float64)  # per reward, total, items
    params = SamplingParams.for_validation(cfg.validation, cfg.rollout, seed=cfg.train.seed)
    for start in range(0, len(mine), cfg.rollout.batch_size):
        prompts = []
        for index in mine[start:start + cfg.rollout.batch_size]:
            try:
                prompts.append(dataset[index])
            except BadSampleError as error:
                bad.record(error, sample=f"validation {index}")
        if not prompts:
            continue
        groups = engine.generate(prompts, params)
        scored = rewards([g.completions[0].text for g in groups], [g.prompt.reference for g in groups],
                         [g.prompt.row for g in groups])
        for i, name in enumerate(names):
            sums[i] += sum(scored.values(name))
        sums[-2] += float(scored.total_tensor().sum())
        sums[-1] += len(groups)
    cp.parallel.all_reduce_sum(sums, mesh.group("dp"))
    items = max(float(sums[-1]), 1.0)
    return {**{f"validation/{name}": float(sums[i]) / items for i, name in enumerate(names)},
            "validation/reward_mean": float(sums[-2]) / items, "validation/items": float(sums[-1])}


def main() -> None:
    cfg, config_path = cp.config.load_recipe_config(__doc__, plugins=True)  # --config, --dataset, --reward
    # process group, demo assets, config checks, memory plan, seed; the run folder and the checkpoint to
    # resume from, decided together (a resume continues in its own run's folder); <run_dir>/config.toml
    run = cp.run.start(cfg, config_path, memory_plan="colocated", prefix="[GRPO] ")
    cfg, info, run_dir = run.cfg, run.info, run.run_dir
    log = cp.logging.get_logger()
    mesh = cp.parallel.ParallelMesh(cfg.policy.parallelism, device_type=info.device.type)
    grpo, rollout = cfg.grpo, cfg.rollout

    # Policy (trained, FSDP2 over dp_shard), KL reference, rollout engine and weight sync.
    processor = cp.policy.load_processor(cfg.policy.model_name_or_path)
    policy = cp.policy.build_policy(cfg.policy, mesh, train=cfg.train)
    reference = cp.policy.grpo_reference(policy, info.device, mesh, kl_beta=cfg.grpo.kl_beta, policy_cfg=cfg.policy,
                                         train=cfg.train)  # None without [grpo] kl_beta
    teacher = load_teacher(cfg.distillation, mesh, info.device, policy_cfg=cfg.policy,
                           train=cfg.train)  # None without [distillation] enable
    engine, engine_model = cp.rollout.build_rollout_engine(
        rollout, cfg.policy.model_name_or_path, processor, dtype=cfg.policy.dtype, device=info.device,
        seed=cfg.train.seed + mesh.dp_rank, max_model_len=cfg.policy.model_max_length)
    if engine_model is not None:  # HF engine: its module's parameters are written (or share storage)
        sync = InProcessSync(policy.hf_model, engine_model, engine=engine)
    else:  # vLLM: tensors go through engine.update_weights under the checkpoint names vLLM loads
        sync = InProcessSync(policy.hf_model, engine, layout=cp.rollout.sync_layout(rollout),
                             dtype=cp.policy.resolve_dtype(cfg.policy.dtype))
    sync.sync(version=0)

    # Prompts, rewards, optimizer, checkpoints, metrics.
    # with [validation] enable and no validation.dataset.name, test_size holds validation prompts out
    dataset, val_dataset = build_grpo_datasets(cfg.train.train_policy, cfg.validation, seed=cfg.train.seed,
                                               processor=processor, setup_config=cfg)
    sampler = ResumableDistributedSampler(len(dataset), rank=mesh.dp_rank, world_size=mesh.dp_size,
                                          **cp.config.sampler_settings(cfg))
    bad = BadSampleTracker(cfg.train.train_policy.dataset.bad_sample_budget)
    prompts = prompt_stream(dataset, sampler, bad)
    rewards = cp.rewards.RewardSet.from_config(grpo)
    env = load_environment(rollout.multi_turn_config)  # None without [rollout.multi_turn_config] enable
    # [grpo] rollouts_per_step splits each generation into that many optimizer steps (cosmos-rl's smaller batches)
    parts = cp.policy.step_slices(grpo.rollout_batch_size * grpo.num_samples_per_prompt, grpo.rollouts_per_step)
    steps_per_epoch = math.ceil(len(sampler) / grpo.rollout_batch_size) * len(parts)
    total_steps = cfg.train.max_steps or cfg.train.epoch * steps_per_epoch
    optimizer = cp.policy.build_optimizer(policy, cfg.train)
    scheduler = cp.policy.build_lr_scheduler(optimizer, cfg.train, total_steps)
    ckpt = CheckpointManager(cfg.train.ckpt, run_dir, model=policy, optimizer=optimizer, scheduler=scheduler,
                             sampler=sampler, per_rank={"bad_samples": bad}, processor=processor)
    state = ckpt.resume(run.resume_from)
    step = state.step if state else 0
    if state:
        sync.sync(version=step)
    tracker = cp.logging.MetricsTracker(run_dir, cfg.logging, run_config=cp.config.config_to_dict(cfg),
                                        total_steps=total_steps, prefix="[GRPO] ",
                                        resumed_step=step if cfg.train.resume else None)  # replayed rows go
    dp_group = mesh.group("dp")
    split = f" (in {len(parts)} steps of {grpo.rollouts_per_step} rollouts)" if len(parts) > 1 else ""
    log.info(f"run dir {run_dir}; {total_steps} steps x {grpo.rollout_batch_size} prompts x "
             f"{grpo.num_samples_per_prompt} samples per rank{split}; {mesh}")
    if val_dataset is not None and step == 0:
        tracker.log_metrics(validate(engine, val_dataset, cfg, mesh, bad), 0)
    # a SIGTERM / SIGUSR1 ([train] signal_to_handle) saves the step in progress once it ends (with
    # [grpo] rollouts_per_step, once the generation in progress is trained), then stops
    preemption = cp.checkpoint.Preemption.from_config(cfg.train, device=info.device)

    while step < total_steps:
        times: dict[str, float] = {}
        t0 = time.perf_counter()
        params = SamplingParams.from_config(rollout, grpo.num_samples_per_prompt,
                                            seed=cfg.train.seed * 1_000_003 + step * 1009 + mesh.dp_rank)
        groups = generate_rollouts(engine, processor, [next(prompts) for _ in range(grpo.rollout_batch_size)],
                                   params, env, multi=rollout.multi_turn_config,
                                   max_response_length=rollout.max_response_length)  # episodes with an environment
        times["rollout"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        scored, extra = score_rollouts(groups, rewards, grpo, processor,
                                       max_response_length=rollout.max_response_length, multi_turn=env is not None)
        times["reward"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        batch = collate_rollouts(groups, processor).to(info.device)
        # groups dynamic sampling drops stay in the batch with no token to train (ranks keep running
        # the same forward / backward collectives) and out of the token-mean denominator
        batch.completion_mask = batch.completion_mask * scored.keep[:, None].to(batch.completion_mask)
        collate_s = time.perf_counter() - t0
        advantages, first_step = scored.advantages.to(info.device), step
        if teacher is not None:  # [N, T]: the teacher's per-token signal (teacher_kl and the like in extra)
            settings = cp.policy.GRPOUpdateSettings.from_config(cfg)
            advantages, teacher_metrics = distill_advantages(teacher, batch, advantages, cfg.distillation,
                                                             temperature=settings.temperature,
                                                             chunk_size=settings.logprob_chunk_size)
            extra = {**extra, **teacher_metrics}
        for part in parts:  # one optimizer step each (one part unless [grpo] rollouts_per_step is set)
            rows = batch if len(parts) == 1 else batch.subset(part)
            update = cp.policy.grpo_update(policy, reference, optimizer, rows, advantages[part],
                                           cp.policy.GRPOUpdateSettings.from_config(cfg), dp_group,
                                           step=step + 1)
            times["logprobs"] = collate_s + update.times["logprobs"]
            times["update"] = update.times["update"]
            scheduler.step()
            step += 1

            times["sync"] = sync.sync(version=step).seconds
            tracker.log_metrics({
                "reward/mean": float(scored.rewards.mean()), "reward/std": float(scored.rewards.std(unbiased=False)),
                **{k: v for k, v in scored.batch.metrics.items() if k.startswith("reward/") and k != "reward/total"},
                **update.metrics, **extra,
                "response_length": float(scored.lengths.float().mean()), "grad_norm": update.grad_norm,
                "lr": scheduler.get_last_lr()[0], "bad_samples": bad.count, **scored.sampling_metrics,
                **{f"time/{k}": v for k, v in times.items()}, "time/step": sum(times.values()),
            }, step)
            if val_dataset is not None and (step % max(cfg.validation.freq, 1) == 0 or step == total_steps):
                tracker.log_metrics(validate(engine, val_dataset, cfg, mesh, bad), step)
            if step == total_steps:
                break
            times.update(rollout=0.0, reward=0.0)  # the next steps train rollouts already made
            collate_s = 0.0
        # saved once the generation is trained: its prompts are consumed, so a resume starts at the next one
        ckpt.maybe_save(step, epoch=sampler.epoch, weight_version=step,
                        force=step == total_steps or any(map(ckpt.should_save, range(first_step + 1, step + 1))))
        # preemption too stops at a generation's end, where a resume starts at the next generation's prompts
        if preemption.stop_here(ckpt, step, epoch=sampler.epoch, weight_version=step):
            break

    named = cp.rewards.reward_metric_names(grpo.reward_function).values()
    curves = ["reward/mean", *(f"reward/{name}" for name in named), "entropy", "clip_fraction"]
    # safetensors/final (unless preempted), checkpoints and uploads settled, <run dir>/curves.png, exit status
    run.finish(ckpt, tracker, preemption, step=step, total_steps=total_steps,
               plot=curves + (["kl"] if grpo.kl_beta else []))


if __name__ == "__main__":
    with cp.checkpoint.exit_on_interrupt():  # Ctrl-C: no traceback; prints the command that resumes the run
        main()
