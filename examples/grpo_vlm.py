"""GRPO for a vision-language reasoner (Cosmos-Reason / Qwen2.5-VL) on MCQ image or video prompts.

    python examples/grpo_vlm.py --config examples/configs/grpo_tiny.toml
    torchrun --nproc_per_node 2 examples/grpo_vlm.py --config examples/configs/grpo_tiny.toml
    torchrun --standalone --nproc_per_node 2 examples/grpo_vlm.py --mode disaggregated \\
        --config examples/configs/grpo_tiny_disaggregated.toml

Colocated (default): every rank generates rollouts for its own prompts with an HF engine, scores
them, and trains; after each optimizer step the engine sees the new weights (``cp.sync``).

Disaggregated: one ``torchrun`` job, two roles. The last ``[disaggregated] num_rollout_ranks``
ranks generate: they score their rollouts, compute group advantages and put one record per prompt
(token ids, log-probs, rewards, advantages, weight version, media paths) on a Redis Streams queue
(``cp.queue``; address from ``[redis] url`` or ``$COSMOS_REDIS_URL``, or a private redis-server
that rank 0 starts when ``[disaggregated] start_local_redis = true``). The other ranks train, with
FSDP2 over the trainer ranks only: they take records, drop those more than ``[grpo]
allowed_outdated_steps`` steps old (counted), rebuild the batch from the records (media re-read
from their paths), take an optimizer step, publish the new weight version, broadcast the weights
to the rollout ranks in buckets (``cp.sync.WeightBroadcaster``) and acknowledge the records.
A rollout rank joins a broadcast as soon as it sees a newer published version, and generates only
while the queue holds less than the staleness bound's worth of records (``cp.queue.RolloutThrottle``),
so it never blocks on a full queue while the trainer waits for it in a broadcast. At the end the
trainer sets the queue's stop flag and closes the broadcast; the rollout ranks return and every
rank joins the safetensors export. With [train.ckpt] enable_checkpoint the trainers save their state
among themselves; [train] resume restarts them from it, with the queued records kept, and the
rollout ranks go on with the prompts after the ones they had queued.

One step: prompts -> ``n`` completions each (tagged with the weight version) -> rewards -> group
advantages -> [queue] -> log-probs (old / reference / current) -> GRPO loss -> optimizer step ->
weight sync.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import msgspec
import torch
import torch.distributed as dist

import cosmos_primitives as cp
from cosmos_primitives.checkpoint import CheckpointManager
from cosmos_primitives.checkpoint.layout import SAFETENSORS_DIR
from cosmos_primitives.checkpoint.safetensors_export import export_safetensors
from cosmos_primitives.data import MCQPromptDataset, ResumableDistributedSampler
from cosmos_primitives.data.bad_samples import BadSampleError, BadSampleTracker
from cosmos_primitives.data.media import MediaSettings
from cosmos_primitives.data.records import RolloutGroup, SamplingParams
from cosmos_primitives.data.rollout_batch import RolloutBatch, collate_rollouts
from cosmos_primitives.parallel.roles import RoleMesh, RoleSplit, split_roles
from cosmos_primitives.queue import (
    RedisRolloutQueue,
    RolloutRecord,
    RolloutThrottle,
    StalenessFilter,
    group_from_record,
    record_advantages,
    record_from_group,
    record_rewards,
)
from cosmos_primitives.queue.run_control import RunControl, check_queue_capacity
from cosmos_primitives.rewards.compose import RewardBatch
from cosmos_primitives.sync import InProcessSync, WeightBroadcaster, WeightReceiver, new_sync_group


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="TOML config")
    parser.add_argument("--mode", choices=("colocated", "disaggregated"), default="colocated",
                        help="colocated: every rank generates and trains; disaggregated: rollout ranks and "
                             "trainer ranks exchange records over Redis ([disaggregated], [redis])")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. grpo.kl_beta=0.01")
    return parser.parse_args()


# ------------------------------------------------------------------------------ shared by both modes

def start_run(cfg: cp.config.Config, info: cp.parallel.DistInfo) -> Path:
    """Demo assets (tiny configs), seeds, and the run directory ``<output_dir>/<timestamp>`` (collective)."""
    if info.is_rank0:
        from cosmos_primitives.testing.demo_assets import ensure_demo_assets

        ensure_demo_assets(cfg)  # only acts on [custom] demo_model / demo_data (tiny configs)
    cp.parallel.barrier()
    cp.utils.seed_everything(cfg.train.seed)
    stamp = cp.parallel.broadcast_object(time.strftime("%Y%m%d%H%M%S"))
    run_dir = cp.utils.make_run_dir(cfg.train.output_dir, reuse_latest=bool(cfg.train.resume), timestamp=stamp)
    if info.is_rank0:
        cp.config.dump_config(cfg, run_dir / "config.toml")
    return run_dir


def build_policies(cfg: cp.config.Config, mesh: cp.parallel.ParallelMesh, device: torch.device):
    """The trained policy (FSDP2 over ``mesh``'s dp_shard) and, when ``[grpo] kl_beta`` is set, the
    KL reference: a frozen copy, or with ``[policy.lora]`` the policy itself run with its adapters off."""
    policy = cp.policy.build_policy(cfg.policy, mesh)
    reference = None
    if cfg.grpo.kl_beta:
        reference = policy if cfg.policy.lora is not None else (
            cp.policy.build_policy(cfg.policy, None, device=device).eval().requires_grad_(False))
    return policy, reference


def prompt_stream(dataset: MCQPromptDataset, sampler: ResumableDistributedSampler,
                  bad: BadSampleTracker) -> Iterator:
    """Prompts of this rank forever (epoch after epoch); bad rows are skipped and counted."""
    while True:
        for index in sampler:
            try:
                yield dataset[index]
            except BadSampleError as error:
                bad.record(error, sample=index)
        sampler.set_epoch(sampler.epoch + 1)


def sampling_params(cfg: cp.config.Config, seed: int) -> SamplingParams:
    sampling = cfg.rollout.sampling_config
    return SamplingParams(n=cfg.grpo.num_samples_per_prompt, temperature=sampling.temperature,
                          top_p=sampling.top_p, top_k=sampling.top_k,
                          repetition_penalty=sampling.repetition_penalty,
                          max_new_tokens=cfg.rollout.max_response_length, seed=seed)


class Scored(NamedTuple):
    """Rewards of a list of groups, one entry per completion in group order (``N`` = groups x n)."""

    rewards: torch.Tensor  # [N] float32, after overlong shaping
    advantages: torch.Tensor  # [N] float32, group-relative
    lengths: torch.Tensor  # [N] int64, generated tokens
    batch: RewardBatch  # per-reward values and batch metrics
    keep: torch.Tensor  # [N] bool: False for groups DAPO dynamic sampling drops (equal rewards)
    sampling_metrics: dict[str, float]  # dynamic_sampling/* counts (empty when it is off)


def score_rollouts(groups: Sequence[RolloutGroup], rewards: cp.rewards.RewardSet, cfg: cp.config.Config) -> Scored:
    """Rewards (``[grpo] reward_function``, overlong shaping) and group advantages of ``groups``."""
    completions = [c for g in groups for c in g.completions]
    scored = rewards([c.text for c in completions],
                     [g.prompt.reference for g in groups for _ in g.completions],
                     [g.prompt.row for g in groups for _ in g.completions])
    lengths = torch.tensor([len(c.token_ids) for c in completions])
    reward = cp.algo.apply_overlong_reward(scored.total_tensor(), lengths, cfg.grpo, cfg.rollout.max_response_length)
    keep, sampling_metrics = torch.ones(len(completions), dtype=torch.bool), {}
    if cp.algo.dynamic_sampling_enabled(cfg.grpo):
        sizes = torch.tensor([len(g.completions) for g in groups])
        group_ids = torch.repeat_interleave(torch.arange(len(groups)), sizes)
        dropped = cp.algo.dynamic_sampling(reward, group_ids)
        keep, sampling_metrics = dropped.keep, dropped.metrics()
    return Scored(reward, cp.algo.compute_advantages(reward, cfg=cfg.grpo), lengths, scored, keep, sampling_metrics)


def policy_logprobs(model, batch: RolloutBatch, rows: slice, *, temperature: float, chunk_size: int,
                    with_entropy: bool = False):
    """Log-probs (and entropy) of the completion tokens of ``batch`` rows ``rows``: [rows, T] float32."""
    return cp.policy.token_logprobs(model, slice_inputs(batch, rows), mask=batch.completion_mask[rows],
                                    chunk_size=chunk_size, with_entropy=with_entropy, temperature=temperature)


def slice_inputs(batch: RolloutBatch, rows: slice) -> dict[str, torch.Tensor]:
    """Model inputs of a row range (media rows follow their sequences, one image / video block each)."""
    out = {k: v[rows] for k, v in batch.inputs.items() if k in ("input_ids", "attention_mask", "mm_token_type_ids")}
    for values, grid in (("pixel_values", "image_grid_thw"), ("pixel_values_videos", "video_grid_thw")):
        if values in batch.inputs:
            per_row = batch.inputs[grid].shape[0] // len(batch)
            lengths = batch.inputs[grid].prod(-1).tolist()
            start = sum(lengths[: rows.start * per_row])
            stop = sum(lengths[: rows.stop * per_row])
            out[values] = batch.inputs[values][start:stop]
            out[grid] = batch.inputs[grid][rows.start * per_row : rows.stop * per_row]
    if "second_per_grid_ts" in batch.inputs:
        per_row = batch.inputs["second_per_grid_ts"].shape[0] // len(batch)
        out["second_per_grid_ts"] = batch.inputs["second_per_grid_ts"][rows.start * per_row : rows.stop * per_row]
    return out


def update_policy(policy, reference, optimizer, batch: RolloutBatch, advantages: torch.Tensor,
                  cfg: cp.config.Config, dp_group):
    """One GRPO update on ``batch`` (``[grpo] mu_iterations`` optimizer steps over its micro-batches).

    With ``[grpo] behav_imp_weight_cap`` or ``off_policy_masking_delta`` set, the engine's log-probs
    go to the loss as the behaviour policy (AReaL behaviour weights / off-policy masking) and the
    ratio's old policy is the trainer's weights at the start of the update.

    Args:
        advantages: [N] per row, on the batch's device.

    Returns:
        ``(metrics, grad_norm, times)``: token-weighted means of the loss metrics, the last
        gradient norm, and seconds spent in ``"logprobs"`` (old / reference) and ``"update"``.
    """
    grpo = cfg.grpo
    behaviour_logprobs = grpo.behav_imp_weight_cap is not None or grpo.off_policy_masking_delta is not None
    temperature, chunk = cfg.rollout.sampling_config.temperature, cfg.policy.logprob_chunk_size
    micro = max(1, cfg.train.train_policy.mini_batch)
    rows = [slice(i, min(i + micro, len(batch))) for i in range(0, len(batch), micro)]
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    token_count = cp.algo.dp_mean_token_count(batch.completion_mask, dp_group)
    if float(token_count) == 0.0:  # every group of every rank was dropped (all-reduced: all ranks agree)
        return {}, 0.0, {"logprobs": time.perf_counter() - t0, "update": 0.0}
    # the PPO ratio's "old" policy ([grpo] old_logprobs); None: this update's first forward (the
    # weights at its start), free when there is one iteration
    old = [batch.rollout_logprobs[r] for r in rows]
    with torch.no_grad():
        if behaviour_logprobs or grpo.old_logprobs == "recompute":
            old = [policy_logprobs(policy, batch, r, temperature=temperature, chunk_size=chunk).logprobs
                   for r in rows] if grpo.mu_iterations > 1 else None
        # a LoRA policy is its own reference, with the adapters off
        with cp.policy.adapters_disabled(policy.hf_model) if reference is policy else contextlib.nullcontext():
            ref = [policy_logprobs(reference, batch, r, temperature=temperature, chunk_size=chunk).logprobs
                   for r in rows] if reference is not None else None
    times["logprobs"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    metric_sums: dict[str, float] = {}
    for _ in range(grpo.mu_iterations):
        for i, r in enumerate(rows):
            out = policy_logprobs(policy, batch, r, temperature=temperature, chunk_size=chunk, with_entropy=True)
            loss, metrics = cp.algo.grpo_loss(
                out.logprobs, old[i] if old else out.logprobs.detach(), advantages[r],
                batch.completion_mask[r], cfg=grpo, ref_logprobs=ref[i] if ref else None,
                rollout_logprobs=batch.rollout_logprobs[r] if behaviour_logprobs else None,
                entropy=out.entropy, dp_token_count=token_count)
            loss.backward()
            weight = float(batch.completion_mask[r].sum() / batch.completion_mask.sum())
            for k, v in metrics.items():
                metric_sums[k] = metric_sums.get(k, 0.0) + float(v) * weight / grpo.mu_iterations
        grad_norm = cp.parallel.clip_grad_norm_(policy.parameters(), cfg.train.optm_grad_norm_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    times["update"] = time.perf_counter() - t0
    return metric_sums, grad_norm, times


def loss_metrics(metric_sums: dict[str, float]) -> dict[str, float]:
    # "kl" exists only with a reference model (kl_beta != 0): never log a KL that was not computed
    return {k: metric_sums[k] for k in ("kl", "clip_fraction", "entropy", "loss", "behaviour_weight_mean",
                                        "behaviour_capped_fraction", "off_policy_masked_fraction") if k in metric_sums}


def validate(engine, dataset: MCQPromptDataset, cfg: cp.config.Config, mesh: cp.parallel.ParallelMesh,
             bad: BadSampleTracker) -> dict[str, float]:
    """``[validation]``: one completion per held-out item (this rank's share), scored with
    ``[validation] reward_function``; means over every rank's items, as ``validation/*`` metrics."""
    val = cfg.validation
    rewards = cp.rewards.RewardSet(val.reward_function)
    names = list(val.reward_function)
    count = len(dataset) if val.max_items is None else min(val.max_items, len(dataset))
    mine = list(range(mesh.dp_rank, count, mesh.dp_size))
    sums = torch.zeros(len(names) + 2, dtype=torch.float64)  # per reward, total, items
    params = SamplingParams(n=1, temperature=val.temperature, max_new_tokens=cfg.rollout.max_response_length,
                            seed=cfg.train.seed)
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


# --------------------------------------------------------------------------------------- colocated

def run_colocated(cfg: cp.config.Config, info: cp.parallel.DistInfo) -> None:
    log = cp.logging.get_logger()
    mesh = cp.parallel.ParallelMesh(cfg.policy.parallelism, device_type=info.device.type)
    run_dir = start_run(cfg, info)
    grpo, rollout = cfg.grpo, cfg.rollout

    # Policy (trained, FSDP2 over dp_shard), frozen reference, rollout engine and weight sync.
    processor = cp.eval.load_processor(cfg.policy.model_name_or_path)
    policy, reference = build_policies(cfg, mesh, info.device)
    engine, engine_model = cp.rollout.build_rollout_engine(
        rollout, cfg.policy.model_name_or_path, processor, dtype=cfg.policy.dtype, device=info.device,
        seed=cfg.train.seed + info.rank, max_model_len=cfg.policy.model_max_length)
    if engine_model is not None:  # HF engine: its module's parameters are written (or share storage)
        sync = InProcessSync(policy.hf_model, engine_model, engine=engine)
    else:  # vLLM: tensors go through engine.update_weights under the checkpoint names vLLM loads
        sync = InProcessSync(policy.hf_model, engine, layout=cp.rollout.sync_layout(rollout),
                             dtype=cp.policy.resolve_dtype(cfg.policy.dtype))
    sync_result = sync.sync(version=0)

    # Prompts, rewards, optimizer, checkpoints.
    dataset = MCQPromptDataset.from_config(cfg.train.train_policy.dataset)
    sampler = ResumableDistributedSampler(len(dataset), rank=mesh.dp_rank, world_size=mesh.dp_size,
                                          seed=cfg.train.seed)
    bad = BadSampleTracker(cfg.train.train_policy.dataset.bad_sample_budget)
    rewards = cp.rewards.RewardSet.from_config(grpo)
    steps_per_epoch = math.ceil(len(sampler) / grpo.rollout_batch_size)
    total_steps = cfg.train.max_steps or cfg.train.epoch * steps_per_epoch
    optimizer = cp.policy.build_optimizer(policy, cfg.train)
    scheduler = cp.policy.build_lr_scheduler(optimizer, cfg.train, total_steps)
    ckpt = CheckpointManager(cfg.train.ckpt, run_dir, model=policy, optimizer=optimizer, scheduler=scheduler,
                             sampler=sampler, processor=processor)
    state = ckpt.resume(cfg.train.resume, output_dir=cfg.train.output_dir)
    step = state.step if state else 0
    if state:
        sync_result = sync.sync(version=step)
    tracker = cp.logging.MetricsTracker(run_dir, cfg.logging, run_config=cp.config.config_to_dict(cfg),
                                        total_steps=total_steps, prefix="[GRPO] ")
    prompts = prompt_stream(dataset, sampler, bad)
    dp_group = mesh.group("dp")
    log.info(f"run dir {run_dir}; {total_steps} steps x {grpo.rollout_batch_size} prompts x "
             f"{grpo.num_samples_per_prompt} samples per rank; {mesh}")
    val_dataset = MCQPromptDataset.from_config(cfg.validation.dataset) if cfg.validation.enable else None
    if val_dataset is not None and step == 0:
        tracker.log_metrics(validate(engine, val_dataset, cfg, mesh, bad), 0)

    while step < total_steps:
        times: dict[str, float] = {}
        t0 = time.perf_counter()
        batch_prompts = [next(prompts) for _ in range(grpo.rollout_batch_size)]
        groups = engine.generate(batch_prompts, sampling_params(cfg, cfg.train.seed * 1_000_003 + step * 1009
                                                                + info.rank))
        times["rollout"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        scored = score_rollouts(groups, rewards, cfg)
        times["reward"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        batch = collate_rollouts(groups, processor).to(info.device)
        # groups dynamic sampling drops stay in the batch with no token to train (ranks keep running
        # the same forward / backward collectives) and out of the token-mean denominator
        batch.completion_mask = batch.completion_mask * scored.keep[:, None].to(batch.completion_mask)
        collate_s = time.perf_counter() - t0
        metric_sums, grad_norm, update_times = update_policy(policy, reference, optimizer, batch,
                                                             scored.advantages.to(info.device), cfg, dp_group)
        times["logprobs"] = collate_s + update_times["logprobs"]
        times["update"] = update_times["update"]
        scheduler.step()
        step += 1

        sync_result = sync.sync(version=step)
        times["sync"] = sync_result.seconds

        tracker.log_metrics({
            "reward/mean": float(scored.rewards.mean()), "reward/std": float(scored.rewards.std(unbiased=False)),
            **{k: v for k, v in scored.batch.metrics.items() if k.startswith("reward/") and k != "reward/total"},
            **loss_metrics(metric_sums),
            "response_length": float(scored.lengths.float().mean()), "grad_norm": grad_norm,
            "lr": scheduler.get_last_lr()[0], "bad_samples": bad.count, **scored.sampling_metrics,
            **{f"time/{k}": v for k, v in times.items()}, "time/step": sum(times.values()),
        }, step)
        if val_dataset is not None and (step % max(cfg.validation.freq, 1) == 0 or step == total_steps):
            tracker.log_metrics(validate(engine, val_dataset, cfg, mesh, bad), step)
        ckpt.maybe_save(step, epoch=sampler.epoch, weight_version=step, force=step == total_steps)

    log.info(f"[GRPO] Training finished at step {step}/{total_steps}, saving final checkpoint in huggingface "
             "safetensors...")
    if cfg.train.ckpt.export_safetensors:
        ckpt.export_final()
    failures = ckpt.close()
    tracker.finish()
    if info.is_rank0:
        curves = ["reward/mean", *(f"reward/{name}" for name in cfg.grpo.reward_function), "entropy", "clip_fraction"]
        cp.logging.plot_run(run_dir, keys=curves + (["kl"] if cfg.grpo.kl_beta else []))
    cp.parallel.destroy_distributed()
    if failures:
        raise SystemExit(f"{len(failures)} upload(s) failed: {failures}")


# ----------------------------------------------------------------------------------- disaggregated

class QueuePlan(NamedTuple):
    """Sizes both roles agree on (computed identically on every rank from the config)."""

    records_per_step: int  # all trainer ranks together
    records_per_trainer: int  # per trainer rank and step
    prompts_per_rollout: int  # records one rollout rank puts per generate call


def plan_disaggregated(cfg: cp.config.Config, roles: RoleSplit) -> QueuePlan:
    """Check that the config can run disaggregated with these roles; raise naming the key otherwise."""
    dis, grpo = cfg.disaggregated, cfg.grpo
    per_step = dis.records_per_step or grpo.rollout_batch_size * roles.num_trainers
    if per_step % roles.num_trainers:
        raise ValueError(f"[disaggregated] records_per_step = {per_step} must be a multiple of the "
                         f"{roles.num_trainers} trainer ranks (each trains on the same number of records)")
    per_put = dis.prompts_per_rollout or grpo.rollout_batch_size
    check_queue_capacity(cfg.redis.max_pending, grpo.allowed_outdated_steps, per_step, roles.num_rollouts, per_put,
                         on_policy=grpo.on_policy)
    ckpt = cfg.train.ckpt
    if ckpt.upload_s3 or ckpt.upload_hf:
        raise ValueError("--mode disaggregated does not upload exports yet: set [train.ckpt] upload_s3 = false and "
                         "upload_hf = false, and upload <run_dir>/safetensors/final yourself")
    return QueuePlan(per_step, per_step // roles.num_trainers, per_put)


def start_local_redis() -> tuple[subprocess.Popen, str]:
    """A private redis-server (no persistence) on a free loopback port; returns ``(process, url)``.

    It runs under ``sh``, which stops it when this process's end of its stdin pipe closes, so the
    server goes away with rank 0 however rank 0 ends (also SIGKILL). Close ``process.stdin`` to stop it.
    """
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("[disaggregated] start_local_redis = true needs redis-server on PATH (apt-get install "
                           "redis-server); or set it to false and give [redis] url or $COSMOS_REDIS_URL")
    port = cp.parallel.free_port()
    server = f"{shlex.quote(binary)} --port {port} --bind 127.0.0.1 --save '' --appendonly no"
    process = subprocess.Popen(["sh", "-c", f"{server} & read _; kill $!"], stdin=subprocess.PIPE,
                               stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=0.5)
    deadline = time.monotonic() + 10.0
    while True:
        try:
            client.ping()
            break
        except redis.exceptions.ConnectionError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the local redis-server on port {port} did not start") from None
            time.sleep(0.05)
    client.close()
    return process, url


def run_disaggregated(cfg: cp.config.Config, info: cp.parallel.DistInfo) -> None:
    log = cp.logging.get_logger()
    if cfg.validation.enable:
        raise ValueError("[validation] enable = true runs in colocated mode only (the trainer ranks of "
                         "--mode disaggregated hold no engine); evaluate exports with examples/evaluate.py")
    roles = split_roles(info.world_size, cfg.disaggregated.num_rollout_ranks)
    plan = plan_disaggregated(cfg, roles)
    # Every rank takes part in creating the trainers' mesh and the weight-broadcast group (collective).
    mesh = RoleMesh(cfg.policy.parallelism, roles.trainer_ranks, device_type=info.device.type)
    sync_group = new_sync_group(src=roles.trainer_ranks[0], receivers=roles.rollout_ranks)
    # the trainers checkpoint among themselves (groups are made by every rank of the job)
    saves = cfg.train.ckpt.enable_checkpoint or bool(cfg.train.resume)
    trainer_groups = (dist.new_group(list(roles.trainer_ranks)),
                      dist.new_group(list(roles.trainer_ranks), backend="gloo")) if saves else None
    run_dir = start_run(cfg, info)

    redis_process, url = None, None
    if cfg.disaggregated.start_local_redis and info.is_rank0:
        redis_process, url = start_local_redis()
        log.info(f"started a local redis-server at {url} for this run")
    url = cp.parallel.broadcast_object(url)
    if info.is_rank0:  # a clean stream before any rollout rank puts
        with RedisRolloutQueue(cfg.redis, url=url) as queue, RunControl(queue) as control:
            if cfg.disaggregated.clear_stream_at_start and not cfg.train.resume:  # a resume keeps what is queued
                control.clear_stream()
            control.clear_stop()
    cp.parallel.barrier()

    if roles.is_trainer:
        model, processor = train_from_queue(cfg, info, roles, plan, mesh, sync_group, url, run_dir, trainer_groups)
    else:
        model, processor = generate_into_queue(cfg, info, roles, plan, sync_group, url)
    if cfg.train.ckpt.export_safetensors:  # collective over the job; rank 0 (a trainer) writes
        export_safetensors(model, run_dir / SAFETENSORS_DIR / "final", processor=processor,
                           max_shard_size_gb=cfg.train.ckpt.max_shard_size_gb, dtype=cfg.train.ckpt.export_dtype)
    cp.parallel.barrier()
    if redis_process is not None:
        redis_process.stdin.close()
        redis_process.wait(timeout=30)
    cp.parallel.destroy_distributed()


def fetch_records(queue: RedisRolloutQueue, stale: StalenessFilter, want: int, step: int, settings: MediaSettings,
                  bad: BadSampleTracker, timeout_s: float) -> tuple[list[RolloutRecord], list[RolloutGroup]]:
    """``want`` trainable records and their rebuilt groups; stale or unreadable ones are acknowledged and counted."""
    records: list[RolloutRecord] = []
    groups: list[RolloutGroup] = []
    while len(records) < want:
        got = queue.get(want - len(records), timeout=timeout_s)
        if not got:
            raise TimeoutError(f"no rollout record arrived for {timeout_s}s at trainer step {step} "
                               "([disaggregated] get_timeout_s); are the rollout ranks alive?")
        kept, dropped = stale.split(got, trainer_step=step)
        if dropped:
            queue.ack(dropped)
        for record in kept:
            try:
                groups.append(group_from_record(record, settings))
                records.append(record)
            except BadSampleError as error:  # e.g. an image deleted since the rollout
                bad.record(error, sample=record.record_id)
                queue.ack([record])
    return records, groups


def train_from_queue(cfg, info, roles, plan: QueuePlan, mesh: RoleMesh, sync_group, url: str, run_dir: Path,
                     trainer_groups=None):
    """Trainer ranks: records -> batch -> GRPO update -> publish version -> broadcast weights -> ack.

    With ``[train.ckpt] enable_checkpoint`` the trainers save their policy, optimizer and scheduler
    among themselves (``trainer_groups``: that group and a gloo twin for async saves); ``[train]
    resume`` restarts from the latest one, the rollout ranks receive its weights first, and the
    records still queued (unacknowledged ones are redelivered, none trained twice) are used."""
    log = cp.logging.get_logger()
    grpo = cfg.grpo
    processor = cp.eval.load_processor(cfg.policy.model_name_or_path)
    policy, reference = build_policies(cfg, mesh, info.device)
    dataset_cfg = cfg.train.train_policy.dataset
    steps_per_epoch = math.ceil(len(MCQPromptDataset.from_config(dataset_cfg)) / plan.records_per_step)
    total_steps = cfg.train.max_steps or cfg.train.epoch * steps_per_epoch
    optimizer = cp.policy.build_optimizer(policy, cfg.train)
    scheduler = cp.policy.build_lr_scheduler(optimizer, cfg.train, total_steps)
    tracker = cp.logging.MetricsTracker(run_dir, cfg.logging, run_config=cp.config.config_to_dict(cfg),
                                        total_steps=total_steps, prefix="[GRPO] ")
    queue = RedisRolloutQueue(cfg.redis, url=url, consumer=f"trainer-{info.rank}")
    control = RunControl(queue)
    stale = StalenessFilter.from_config(grpo)
    settings = MediaSettings.from_config(dataset_cfg)
    bad = BadSampleTracker(dataset_cfg.bad_sample_budget)
    dis = cfg.disaggregated
    wire = None if dis.transfer_dtype == "auto" else getattr(torch, dis.transfer_dtype)
    sender = WeightBroadcaster(policy.hf_model, sync_group, layout=cp.rollout.sync_layout(cfg.rollout),
                               bucket_bytes=dis.bucket_mb << 20,
                               transfer_dtype=wire or cp.policy.resolve_dtype(cfg.policy.dtype))
    # the final export is made by the whole job below, so the trainers' checkpoints export nothing
    ckpt = CheckpointManager(msgspec.structs.replace(cfg.train.ckpt, export_safetensors=False), run_dir,
                             model=policy, optimizer=optimizer, scheduler=scheduler,
                             process_group=trainer_groups[0], async_group=trainer_groups[1]) if trainer_groups else None
    state = ckpt.resume(cfg.train.resume, output_dir=cfg.train.output_dir) if ckpt is not None else None
    step = state.step if state else 0
    if info.is_rank0:
        queue.publish_weight_version(step)
    first = sender.sync(version=step)  # the rollout ranks' first receive, checked bit for bit
    dp_group = mesh.group("dp")
    reward_names = list(grpo.reward_function)
    log.info(f"run dir {run_dir}; trainer ranks {list(roles.trainer_ranks)}, "
             f"rollout ranks {list(roles.rollout_ranks)}; "
             f"{total_steps} steps x {plan.records_per_step} records x {grpo.num_samples_per_prompt} samples; "
             f"staleness bound {stale.max_staleness}; first weight sync {first.seconds:.2f}s "
             f"({first.bytes_moved / 2**20:.1f} MiB, verified); {mesh}")

    while step < total_steps:
        times: dict[str, float] = {}
        t0 = time.perf_counter()
        records, groups = fetch_records(queue, stale, plan.records_per_trainer, step, settings, bad,
                                        dis.get_timeout_s)
        times["wait"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        batch = collate_rollouts(groups, processor).to(info.device)
        times["collate"] = time.perf_counter() - t0
        metric_sums, grad_norm, update_times = update_policy(
            policy, reference, optimizer, batch, record_advantages(records, info.device), cfg, dp_group)
        times.update(update_times)
        scheduler.step()
        step += 1

        # Publish first: rollout ranks that see the new version join the broadcast; the records are
        # acknowledged after it, so the throttle never counts them as consumed too early.
        if info.is_rank0:
            queue.publish_weight_version(step)
        sync_result = sender.sync(version=step)
        times["sync"] = sync_result.seconds
        queue.ack(records)

        rewards = record_rewards(records)
        tracker.log_metrics({
            "reward/mean": float(rewards.mean()), "reward/std": float(rewards.std(unbiased=False)),
            **{f"reward/{name}": sum(float(r.meta.get(f"reward/{name}", 0.0)) for r in records) / len(records)
               for name in reward_names},
            **loss_metrics(metric_sums),
            "response_length": float(batch.completion_lengths.float().mean()), "grad_norm": grad_norm,
            "lr": scheduler.get_last_lr()[0], "bad_samples": bad.count,
            "weight_version": step, "rollout/weight_version": sum(r.weight_version for r in records) / len(records),
            **stale.metrics(), **sync_result.metrics(),
            **{k: v for k, v in queue.metrics().items() if k in ("queue/malformed", "queue/redelivered")},
            **{f"time/{k}": v for k, v in times.items()}, "time/step": sum(times.values()),
        }, step)
        if ckpt is not None:
            ckpt.maybe_save(step, weight_version=step, force=step == total_steps)

    log.info(f"[GRPO] Training finished at step {step}/{total_steps}, saving final checkpoint in huggingface "
             "safetensors...")
    if ckpt is not None:
        ckpt.close()
    if info.is_rank0:
        control.request_stop(f"trainer finished at step {step}")
    sender.close()  # the rollout ranks' receive returns None
    control.close()
    queue.close()
    tracker.finish()
    if info.is_rank0:
        cp.logging.plot_run(run_dir, keys=["reward/mean", "reward/single_choice", "reward/format", "staleness/max"])
    return policy, processor


def records_of(groups: Sequence[RolloutGroup], scored: Scored, reward_names: Sequence[str]) -> list[RolloutRecord]:
    """One queue record per group; ``meta`` carries the group's mean of each reward for the trainer's logs."""
    n = len(groups[0].completions)
    out = []
    for i, group in enumerate(groups):
        rows = slice(i * n, (i + 1) * n)
        meta = {f"reward/{name}": sum(scored.batch.values(name)[rows]) / n for name in reward_names}
        out.append(record_from_group(group, scored.rewards[rows], scored.advantages[rows], meta=meta))
    return out


def generate_into_queue(cfg, info, roles, plan: QueuePlan, sync_group, url: str):
    """Rollout ranks: receive weights when a newer version is published, otherwise generate and put records."""
    log = cp.logging.get_logger()
    grpo, dis = cfg.grpo, cfg.disaggregated
    processor = cp.eval.load_processor(cfg.policy.model_name_or_path)
    engine, engine_model = cp.rollout.build_rollout_engine(
        cfg.rollout, cfg.policy.model_name_or_path, processor, dtype=cfg.policy.dtype, device=info.device,
        seed=cfg.train.seed + info.rank, max_model_len=cfg.policy.model_max_length)
    # the HF engine's module is written in place; vLLM takes each bucket through update_weights
    receiver = WeightReceiver(engine_model if engine_model is not None else engine, sync_group,
                              engine=engine if engine_model is not None else None)
    receiver.sync()  # the trainer's weights at its start, checked bit for bit

    dataset = MCQPromptDataset.from_config(cfg.train.train_policy.dataset)
    sampler = ResumableDistributedSampler(len(dataset), rank=roles.index, world_size=roles.num_rollouts,
                                          seed=cfg.train.seed)
    bad = BadSampleTracker(cfg.train.train_policy.dataset.bad_sample_budget)
    prompts = prompt_stream(dataset, sampler, bad)
    rewards = cp.rewards.RewardSet.from_config(grpo)
    queue = RedisRolloutQueue(cfg.redis, url=url)
    control = RunControl(queue)
    throttle = RolloutThrottle.from_config(queue, grpo, plan.records_per_step)
    batches, waited_s = 0, 0.0
    producer = f"rollout{roles.index}"
    saved = queue.producer_state(producer) if cfg.train.resume else None
    if saved is not None:  # the queue was kept: go on with the prompts after the ones it holds
        sampler.load_state_dict(saved["sampler"])
        batches = int(saved["batches"])
        log.info(f"[rollout] resuming prompt order at epoch {sampler.epoch}, position {sampler.position} "
                 f"after {batches} batches")
    while True:
        if control.stop_requested() is not None:
            while receiver.sync() is not None:  # any broadcast still owed, then the trainer's close()
                pass
            break
        published = queue.weight_version()
        if published is not None and published > engine.weight_version:
            if receiver.sync() is None:
                break
            continue
        if throttle.ahead_by(engine.weight_version) > 0:  # the trainer has enough records queued
            time.sleep(dis.poll_s)
            waited_s += dis.poll_s
            continue
        t0 = time.perf_counter()
        groups = engine.generate([next(prompts) for _ in range(plan.prompts_per_rollout)],
                                 sampling_params(cfg, cfg.train.seed * 1_000_003 + batches * 1009 + info.rank))
        scored = score_rollouts(groups, rewards, cfg)
        # one record per group; dynamic sampling drops a group whole, so the trainer waits for more
        group_keep = scored.keep[:: len(groups[0].completions)].tolist()
        records = [r for r, kept in zip(records_of(groups, scored, list(grpo.reward_function)), group_keep) if kept]
        if records:
            queue.put_many(records)
        batches += 1
        queue.save_producer_state(producer, {"sampler": sampler.state_dict(), "batches": batches})
        dropped = f", {len(groups) - len(records)} equal-reward groups dropped" if len(records) < len(groups) else ""
        log.info(f"[rollout] batch {batches}: {len(records)} records with weight version {engine.weight_version}"
                 f"{dropped}, "
                 f"reward {float(scored.rewards.mean()):.3f}, {time.perf_counter() - t0:.1f}s; "
                 f"waited {waited_s:.1f}s for the trainer so far")
    log.info(f"[rollout] stopping ({control.stop_requested()}) after {batches} batches at weight version "
             f"{engine.weight_version}; {bad.count} bad prompts")
    control.close()
    queue.close()
    return engine_model, None


def main() -> None:
    args = parse_args()
    cfg = cp.load_config(args.config, args.overrides)
    info = cp.parallel.init_distributed()
    if args.mode == "colocated":
        run_colocated(cfg, info)
    else:
        run_disaggregated(cfg, info)


if __name__ == "__main__":
    main()
