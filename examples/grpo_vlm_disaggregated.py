"""GRPO for a vision-language reasoner with rollout and trainer ranks joined by a Redis queue (disaggregated).

    torchrun --standalone --nproc_per_node 2 examples/grpo_vlm_disaggregated.py \\
        --config examples/configs/grpo_tiny_disaggregated.toml

One ``torchrun`` job, two roles. The last ``[disaggregated] num_rollout_ranks`` ranks generate:
they score their rollouts, compute group advantages and put one record per prompt (token ids,
log-probs, rewards, advantages, weight version, media paths) on a Redis Streams queue
(``cp.queue``; address from ``[redis] url`` or ``$COSMOS_REDIS_URL``, or a private redis-server that
rank 0 starts when ``[disaggregated] start_local_redis = true``). The other ranks train, with FSDP2
over the trainer ranks only: they take records, drop those more than ``[grpo]
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
advantages -> queue -> log-probs (old / reference / current) -> GRPO loss -> optimizer step ->
weight broadcast. The colocated recipe, every rank doing both, is ``examples/grpo_vlm.py``.
"""

from __future__ import annotations

import math
import time

import msgspec
import torch
import torch.distributed as dist

import cosmos_primitives as cp
from cosmos_primitives.checkpoint import CheckpointManager, export_safetensors
from cosmos_primitives.checkpoint.layout import SAFETENSORS_DIR
from cosmos_primitives.data import (
    BadSampleTracker,
    MediaSettings,
    ResumableDistributedSampler,
    SamplingParams,
    collate_rollouts,
    prompt_dataset,
    prompt_stream,
)
from cosmos_primitives.parallel.roles import RoleMesh, split_roles
from cosmos_primitives.queue import (
    RedisRolloutQueue,
    RedisServer,
    RolloutThrottle,
    StalenessFilter,
    fetch_records,
    record_advantages,
    records_from_scores,
)
from cosmos_primitives.queue.disaggregated_plan import QueuePlan, plan_disaggregated
from cosmos_primitives.queue.record_metrics import record_metrics
from cosmos_primitives.queue.run_control import RunControl
from cosmos_primitives.sync import WeightBroadcaster, WeightReceiver, new_sync_group


def train_from_queue(cfg, info, roles, plan: QueuePlan, mesh: RoleMesh, sync_group, url: str, run_dir,
                     trainer_groups):
    """Trainer ranks: records -> batch -> GRPO update -> publish version -> broadcast weights -> ack.

    With ``[train.ckpt] enable_checkpoint`` the trainers save their policy, optimizer and scheduler
    among themselves (``trainer_groups``: that group and a gloo twin for async saves); ``[train]
    resume`` restarts from the latest one, the rollout ranks receive its weights first, and the
    records still queued (unacknowledged ones are redelivered, none trained twice) are used."""
    log = cp.logging.get_logger()
    grpo, dis, dataset_cfg = cfg.grpo, cfg.disaggregated, cfg.train.train_policy.dataset
    processor = cp.policy.load_processor(cfg.policy.model_name_or_path)
    policy = cp.policy.build_policy(cfg.policy, mesh, train=cfg.train)
    reference = cp.policy.grpo_reference(policy, info.device, mesh, kl_beta=cfg.grpo.kl_beta, policy_cfg=cfg.policy,
                                         train=cfg.train)  # None without [grpo] kl_beta
    prompts = prompt_dataset(dataset_cfg, prompt_column=cfg.train.train_policy.prompt_column_name,
                             response_column=cfg.train.train_policy.response_column_name, processor=processor,
                             setup_config=cfg)
    steps_per_epoch = math.ceil(len(prompts) / plan.records_per_step)
    total_steps = cfg.train.max_steps or cfg.train.epoch * steps_per_epoch
    optimizer = cp.policy.build_optimizer(policy, cfg.train)
    scheduler = cp.policy.build_lr_scheduler(optimizer, cfg.train, total_steps)
    tracker = cp.logging.MetricsTracker(run_dir, cfg.logging, run_config=cp.config.config_to_dict(cfg),
                                        total_steps=total_steps, prefix="[GRPO] ")
    # records with token ids outside the policy's embedding table are dead-lettered, not trained on
    vocab_size = policy.hf_model.get_input_embeddings().weight.shape[0]
    queue = RedisRolloutQueue(cfg.redis, url=url, consumer=f"trainer-{info.rank}", vocab_size=vocab_size)
    control = RunControl(queue)
    stale = StalenessFilter.from_config(grpo)
    settings = MediaSettings.from_config(dataset_cfg, processor)  # sized as the rollout side sized them
    bad = BadSampleTracker(dataset_cfg.bad_sample_budget)
    wire = None if dis.transfer_dtype == "auto" else getattr(torch, dis.transfer_dtype)
    sender = WeightBroadcaster(policy.hf_model, sync_group, layout=cp.rollout.sync_layout(cfg.rollout),
                               bucket_bytes=dis.bucket_mb << 20,
                               transfer_dtype=wire or cp.policy.resolve_dtype(cfg.policy.dtype))
    # the final export is made by the whole job in main(), so the trainers' checkpoints export nothing
    ckpt = CheckpointManager(msgspec.structs.replace(cfg.train.ckpt, export_safetensors=False), run_dir,
                             model=policy, optimizer=optimizer, scheduler=scheduler, per_rank={"bad_samples": bad},
                             process_group=trainer_groups[0], async_group=trainer_groups[1]) if trainer_groups else None
    state = ckpt.resume(cfg.train.resume, output_dir=cfg.train.output_dir) if ckpt is not None else None
    step = state.step if state else 0
    if info.is_rank0:
        queue.publish_weight_version(step)
    first = sender.sync(version=step)  # the rollout ranks' first receive, checked bit for bit
    log.info(f"run dir {run_dir}; trainer ranks {list(roles.trainer_ranks)}, "
             f"rollout ranks {list(roles.rollout_ranks)}; "
             f"{total_steps} steps x {plan.records_per_step} records x {grpo.num_samples_per_prompt} samples; "
             f"staleness bound {stale.max_staleness}; first weight sync {first.seconds:.2f}s "
             f"({first.bytes_moved / 2**20:.1f} MiB, verified); {mesh}")

    while step < total_steps:
        times: dict[str, float] = {}
        t0 = time.perf_counter()
        records, groups = fetch_records(queue, stale, plan.records_per_trainer, trainer_step=step, settings=settings,
                                        bad=bad, timeout_s=dis.get_timeout_s, processor=processor,
                                        num_completions=grpo.num_samples_per_prompt)
        times["wait"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        batch = collate_rollouts(groups, processor).to(info.device)
        times["collate"] = time.perf_counter() - t0
        update = cp.policy.grpo_update(policy, reference, optimizer, batch, record_advantages(records, info.device),
                                       cp.policy.GRPOUpdateSettings.from_config(cfg), mesh.group("dp"),
                                       step=step + 1)
        times.update(update.times)
        scheduler.step()
        step += 1

        # Publish first: rollout ranks that see the new version join the broadcast; the records are
        # acknowledged after it, so the throttle never counts them as consumed too early.
        if info.is_rank0:
            queue.publish_weight_version(step)
        sync_result = sender.sync(version=step)
        times["sync"] = sync_result.seconds
        queue.ack(records)

        tracker.log_metrics({
            **record_metrics(records, list(grpo.reward_function)), **update.metrics,
            "response_length": float(batch.completion_lengths.float().mean()), "grad_norm": update.grad_norm,
            "lr": scheduler.get_last_lr()[0], "bad_samples": bad.count,
            "weight_version": step,
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


def generate_into_queue(cfg, info, roles, plan: QueuePlan, sync_group, url: str):
    """Rollout ranks: receive weights when a newer version is published, otherwise generate and put records."""
    log = cp.logging.get_logger()
    grpo, dis = cfg.grpo, cfg.disaggregated
    processor = cp.policy.load_processor(cfg.policy.model_name_or_path)
    engine, engine_model = cp.rollout.build_rollout_engine(
        cfg.rollout, cfg.policy.model_name_or_path, processor, dtype=cfg.policy.dtype, device=info.device,
        seed=cfg.train.seed + info.rank, max_model_len=cfg.policy.model_max_length, colocated=False,
        engine_ranks=roles.rollout_ranks)
    # the HF engine's module is written in place; vLLM takes each bucket through update_weights
    receiver = WeightReceiver(engine_model if engine_model is not None else engine, sync_group,
                              engine=engine if engine_model is not None else None)
    receiver.sync()  # the trainer's weights at its start, checked bit for bit

    dataset = prompt_dataset(cfg.train.train_policy.dataset, prompt_column=cfg.train.train_policy.prompt_column_name,
                             response_column=cfg.train.train_policy.response_column_name, processor=processor,
                             setup_config=cfg)
    sampler = ResumableDistributedSampler(len(dataset), rank=roles.index, world_size=roles.num_rollouts,
                                          **cp.config.sampler_settings(cfg))
    bad = BadSampleTracker(cfg.train.train_policy.dataset.bad_sample_budget)
    prompts = prompt_stream(dataset, sampler, bad)
    rewards = cp.rewards.RewardSet.from_config(grpo)
    queue = RedisRolloutQueue(cfg.redis, url=url)
    control = RunControl(queue)
    throttle = RolloutThrottle.from_config(queue, grpo, plan.records_per_step)
    batches, waited_s, n = 0, 0.0, grpo.num_samples_per_prompt
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
        params = SamplingParams.from_config(cfg.rollout, n, seed=cfg.train.seed * 1_000_003 + batches * 1009
                                            + info.rank)
        groups = engine.generate([next(prompts) for _ in range(plan.prompts_per_rollout)], params)
        scored = cp.rewards.score_groups(groups, rewards, grpo, cfg.rollout.max_response_length)
        # a group dynamic sampling drops is not put: the trainer waits for more
        records = records_from_scores(groups, scored, list(grpo.reward_function))
        if records:
            queue.put_many(records)
        batches += 1
        queue.save_producer_state(producer, {"sampler": sampler.state_dict(), "batches": batches})
        dropped = f", {len(groups) - len(records)} equal-reward groups dropped" if len(records) < len(groups) else ""
        log.info(f"[rollout] batch {batches}: {len(records)} records with weight version {engine.weight_version}"
                 f"{dropped}, reward {float(scored.rewards.mean()):.3f}, {time.perf_counter() - t0:.1f}s; "
                 f"waited {waited_s:.1f}s for the trainer so far")
    log.info(f"[rollout] stopping ({control.stop_requested()}) after {batches} batches at weight version "
             f"{engine.weight_version}; {bad.count} bad prompts")
    control.close()
    queue.close()
    return engine_model, None


def main() -> None:
    cfg, config_path = cp.config.load_recipe_config(__doc__, plugins=True)  # --config, --dataset, --reward
    info = cp.parallel.init_distributed()
    log = cp.logging.get_logger()
    if cfg.validation.enable:
        raise ValueError("[validation] enable = true runs in examples/grpo_vlm.py only (the trainer ranks here "
                         "hold no engine); evaluate exports with examples/evaluate.py")
    roles = split_roles(info.world_size, cfg.disaggregated.num_rollout_ranks)
    plan = plan_disaggregated(cfg, roles)
    # Every rank takes part in creating the trainers' mesh, the weight-broadcast group and the
    # trainers' checkpoint groups (a gloo twin for async saves): group creation is collective.
    mesh = RoleMesh(cfg.policy.parallelism, roles.trainer_ranks, device_type=info.device.type)
    sync_group = new_sync_group(src=roles.trainer_ranks[0], receivers=roles.rollout_ranks)
    saves = cfg.train.ckpt.enable_checkpoint or bool(cfg.train.resume)
    trainer_groups = (dist.new_group(list(roles.trainer_ranks)),
                      dist.new_group(list(roles.trainer_ranks), backend="gloo")) if saves else None
    if info.is_rank0:
        from cosmos_primitives.testing.demo_assets import ensure_demo_assets

        ensure_demo_assets(cfg)  # only acts on "demo:<path>" paths (the tiny configs)
    cp.parallel.barrier()
    cfg = cp.config.check_runnable(cfg, config_path)  # drops "demo:"; a missing path or refused key stops here
    cp.plan.log_memory_plan(cfg, len(roles.trainer_ranks), info.device, mode="disaggregated")  # rank 0 logs
    cp.utils.seed_everything(cfg.train.seed)

    # Run directory (shared by all ranks), resolved config, the queue's Redis (clean for a fresh run).
    stamp = cp.parallel.broadcast_object(time.strftime("%Y%m%d%H%M%S"))
    run_dir = cp.utils.make_run_dir(cfg.train.output_dir, reuse_latest=bool(cfg.train.resume), timestamp=stamp)
    redis_server, url = None, None
    if info.is_rank0:
        cp.config.dump_config(cfg, run_dir / "config.toml")
        if cfg.disaggregated.start_local_redis:
            # AOF fsynced on every write in the run dir: a resume (same run dir) gets the queued records back
            redis_server = RedisServer(data_dir=run_dir / "redis").start()  # stopped with rank 0, however it ends
            url = redis_server.url
            log.info(f"started a local redis-server at {url} for this run (append-only file in {run_dir / 'redis'})")
        with RedisRolloutQueue(cfg.redis, url=url) as queue, RunControl(queue) as control:
            if cfg.disaggregated.clear_stream_at_start and not cfg.train.resume:  # a resume keeps what is queued
                control.clear_stream()
            control.clear_stop()
    url = cp.parallel.broadcast_object(url)

    if roles.is_trainer:
        model, processor = train_from_queue(cfg, info, roles, plan, mesh, sync_group, url, run_dir, trainer_groups)
    else:
        model, processor = generate_into_queue(cfg, info, roles, plan, sync_group, url)
    if cfg.train.ckpt.export_safetensors:  # collective over the job; rank 0 (a trainer) writes
        export_safetensors(model, run_dir / SAFETENSORS_DIR / "final", processor=processor,
                           max_shard_size_gb=cfg.train.ckpt.max_shard_size_gb, dtype=cfg.train.ckpt.export_dtype)
    cp.parallel.barrier()
    if redis_server is not None:
        redis_server.close()
    cp.parallel.destroy_distributed()


if __name__ == "__main__":
    with cp.checkpoint.exit_on_interrupt():  # Ctrl-C: no traceback; prints the command that resumes the run
        main()
