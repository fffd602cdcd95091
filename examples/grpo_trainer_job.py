"""GRPO trainer as a job of its own: trains on the records that independent rollout jobs put on Redis, and
serves them its weights.

    torchrun --nproc_per_node 2 examples/grpo_trainer_job.py --config examples/configs/grpo_tiny_jobs.toml \\
        --run-name my_run --redis redis://HOST:6379/0
    # on any node, at any time, as many as you like (examples/grpo_rollout_job.py):
    torchrun --nproc_per_node 1 examples/grpo_rollout_job.py --config examples/configs/grpo_tiny_jobs.toml \\
        --run-name my_run --redis redis://HOST:6379/0

The trainer job and the rollout jobs share nothing but the Redis URL, the run name (their keys live
under the stream ``cosmos:<run>``) and the run secret (``$COSMOS_RUN_SECRET``, or a file named by
``$COSMOS_RUN_SECRET_FILE``; never a command-line argument), which signs the weight transfer and the stop
flag (trust model: ``docs/disaggregated.md``); each is its own ``torchrun`` and may start, die and restart on its
own. This job trains with FSDP2 over its ranks (``[policy.parallelism]``). Each step it takes the
records of whichever rollout jobs are producing, drops those more than ``[grpo] allowed_outdated_steps``
steps old, takes an optimizer step, publishes the new weight version, hands a snapshot of the weights to
its transfer thread (``cp.sync.WeightServer``: rollout jobs fetch it over a transfer group formed
through Redis; a dead or slow one never holds this job up for more than ``[disaggregated]
transfer_timeout_s``) and acknowledges the records. It logs which rollout jobs produced each step's
records, with their weight versions and lag, and writes one line per trained record to
``records.jsonl`` in the run directory. At the end it sets the run's stop flag (the rollout jobs exit)
and exports the weights like the colocated recipe.

A fresh run (no ``[train] resume``) first deletes what an earlier run of the same name left in Redis; it
refuses while a live trainer job holds the run (its heartbeat has not expired), naming it, unless given
``--force``; a resume waits up to ``[disaggregated] heartbeat_ttl_s`` for such a trainer (one killed
moments ago) to drop out, then refuses the same way: two trainers would share one consumer group.
``[train] resume`` keeps the queue and the prompt claims: the rollout jobs go on where they were (a
checkpoint also holds the claims position, put back when Redis lost it). The records trained after
the checkpoint it resumes from are trained again (``cp.queue.rollback``: their training is taken back
and their prompt ranges handed out again), and a record this job drops (sampled with weights newer
than its own, or older than the staleness bound) is returned and its prompt generated again, so that
every prompt of an epoch is trained once across kills and resumes. The prompt claims in Redis are not
signed (Lua cannot hold the secret): this job keeps its own account of the prompts it trained, in its
checkpoints, skips a record it trained before and re-issues the ranges the claims lost or skipped
(``cp.queue.trained_prompts``), so a writer holding only the Redis URL can waste or stall generation but
not make a prompt of an epoch go untrained or be trained twice.
``python -m cosmos_primitives.queue.status --redis URL --run NAME`` shows the live jobs, the queue, the
weight versions and the dead letters. Failure semantics: ``docs/disaggregated.md``. A SIGTERM or
SIGUSR1 (``[train] signal_to_handle``) saves a checkpoint (with the claims position) when the step in
progress ends and stops this job with exit status 75; the rollout jobs keep the run for its restart
with ``train.resume=true``.
"""

from __future__ import annotations

import json
import math
import sys
import time

import torch

import cosmos_primitives as cp
from cosmos_primitives.checkpoint import CheckpointManager
from cosmos_primitives.data import BadSampleTracker, MediaSettings, collate_rollouts, prompt_dataset
from cosmos_primitives.queue import RedisRolloutQueue, StalenessFilter, fetch_records, record_advantages
from cosmos_primitives.queue.disaggregated_plan import plan_jobs
from cosmos_primitives.queue.job_registry import JobRegistry, refuse_live_trainer
from cosmos_primitives.queue.prompt_claims import PromptClaims
from cosmos_primitives.queue.record import record_byte_limit
from cosmos_primitives.queue.record_groups import dead_letter_on_nonfinite
from cosmos_primitives.queue.record_metrics import (
    format_shares,
    producer_shares,
    provenance,
    record_metrics,
    share_metrics,
)
from cosmos_primitives.queue.rollback import regenerate, roll_back_to
from cosmos_primitives.queue.run_control import RunControl
from cosmos_primitives.queue.trained_prompts import TrainedPrompts
from cosmos_primitives.sync import WeightServer
from cosmos_primitives.sync.run_auth import RunSecret


def start_fresh(cfg, url: str, secret: RunSecret, log, force: bool = False) -> None:
    """Rank 0: refuse a run that a live trainer job holds (``RunInUseError``; a resume first waits up to
    ``heartbeat_ttl_s`` for a killed trainer's key to expire; ``--force`` goes on anyway); then, without
    resume, forget what an earlier run of this name left in Redis."""
    with RedisRolloutQueue(cfg.redis, url=url) as queue, RunControl(queue, secret) as control:
        fresh = not cfg.train.resume and cfg.disaggregated.clear_stream_at_start
        if force:
            log.warning(f"--force: taking run {cfg.redis.stream!r} over whatever trainer job holds it")
        else:  # a resume waits out the heartbeat of the trainer it replaces (killed moments ago)
            with JobRegistry(url, cfg.redis.stream, config=cfg.redis) as registry:
                refuse_live_trainer(registry, action="start a fresh run" if fresh else "resume the run",
                                    wait_s=0.0 if fresh else cfg.disaggregated.heartbeat_ttl_s + 1.0)
        if fresh:
            removed = control.clear_stream()
            if removed:
                log.info(f"cleared {removed} keys an earlier run left under {cfg.redis.stream!r}")
        control.clear_stop()


def keep_trained_rows(path, step: int) -> None:
    """Drop the rows of ``records.jsonl`` written at steps after ``step`` (rolled back on resume)."""
    if not path.is_file():
        return
    rows = path.read_text().splitlines(keepends=True)
    kept = [row for row in rows if row.strip() and json.loads(row)["step"] <= step]
    if len(kept) != len(rows):
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(kept))
        tmp.replace(path)


def main() -> None:
    # --force: clear the run even while a live trainer job holds it (a fresh start refuses otherwise)
    force = "--force" in sys.argv[1:]
    cfg, config_path = cp.config.load_recipe_config(__doc__, plugins=True, jobs=True,  # + --run, --redis
                                                    argv=[a for a in sys.argv[1:] if a != "--force"])
    log = cp.logging.get_logger()
    dis, grpo = cfg.disaggregated, cfg.grpo
    if dis.start_local_redis:
        raise ValueError("[disaggregated] start_local_redis = true: independent jobs need a Redis every job can "
                         "reach; start redis-server yourself and pass --redis URL (or $COSMOS_REDIS_URL)")
    secret = RunSecret.from_env()  # before any work: a job without it could neither serve nor stop the run
    if cfg.validation.enable:
        raise ValueError("[validation] enable = true runs in examples/grpo_vlm.py only (this job holds no engine); "
                         "evaluate exports with examples/evaluate.py")
    # process group, demo assets, config checks, memory plan, seed; the run folder and the checkpoint to
    # resume from, decided together (a resume continues in its own run's folder); <run_dir>/config.toml
    run = cp.run.start(cfg, config_path, memory_plan="disaggregated", prefix="[GRPO] ")
    cfg, info, run_dir = run.cfg, run.info, run.run_dir
    mesh = cp.parallel.ParallelMesh(cfg.policy.parallelism, device_type=info.device.type)
    plan = plan_jobs(cfg, mesh.world_size)
    url = cp.queue.resolve_redis_url(config=cfg.redis)
    if info.is_rank0:
        start_fresh(cfg, url, secret, log, force)
    cp.parallel.barrier()

    # Policy (FSDP2 over this job's ranks), KL reference, optimizer, checkpoints, metrics.
    dataset_cfg = cfg.train.train_policy.dataset
    processor = cp.policy.load_processor(cfg.policy.model_name_or_path)
    policy = cp.policy.build_policy(cfg.policy, mesh, train=cfg.train)
    reference = cp.policy.grpo_reference(policy, info.device, mesh, kl_beta=cfg.grpo.kl_beta, policy_cfg=cfg.policy,
                                         train=cfg.train)  # None without [grpo] kl_beta
    dataset_size = len(prompt_dataset(dataset_cfg, prompt_column=cfg.train.train_policy.prompt_column_name,
                                      response_column=cfg.train.train_policy.response_column_name,
                                      processor=processor, setup_config=cfg))
    steps_per_epoch = math.ceil(dataset_size / plan.records_per_step)
    total_steps = cfg.train.max_steps or cfg.train.epoch * steps_per_epoch
    optimizer = cp.policy.build_optimizer(policy, cfg.train)
    scheduler = cp.policy.build_lr_scheduler(optimizer, cfg.train, total_steps)
    bad = BadSampleTracker(dataset_cfg.bad_sample_budget)  # media re-read from records; counts saved per rank
    ckpt = CheckpointManager(cfg.train.ckpt, run_dir, model=policy, optimizer=optimizer, scheduler=scheduler,
                             per_rank={"bad_samples": bad}, processor=processor)
    state = ckpt.resume(run.resume_from)
    step = state.step if state else 0
    # The epoch position lives in Redis with the claims; checkpoints keep a copy for a Redis that lost it.
    # Every rank hands the ranges of records it cannot train out again; rank 0 keeps the position.
    claims = PromptClaims(url, cfg.redis.stream, dataset_size=dataset_size, range_size=plan.prompts_per_rollout,
                          seed=cfg.train.seed, claim_ttl_s=dis.claim_ttl_s)
    saved_position = state.extra.get("claims_next_range") if state else None
    if info.is_rank0 and saved_position is not None and claims.restore(int(saved_position)):
        log.info(f"Redis had lost the run's prompt position: restored range {saved_position} from the checkpoint")
    # The trainer's own account of the prompts it trained, kept in its checkpoints: the claims in Redis are
    # unsigned, so this decides what is re-issued and what was trained already (cp.queue.trained_prompts).
    # A checkpoint from before this account trusts the claims for the epoch it was saved in.
    trained_prompts = TrainedPrompts(dataset_size=dataset_size, range_size=plan.prompts_per_rollout,
                                     seed=cfg.train.seed, position_behind=saved_position is not None,
                                     first_epoch=-(-int(saved_position or 0) // claims.ranges_per_epoch))
    if state and "trained_prompts" in state.extra:
        trained_prompts.load_state_dict(state.extra["trained_prompts"])
    # a finished range's records may wait in the queue until the trainer has taken what is ahead of them
    audit_grace = -(-cfg.redis.max_pending // plan.records_per_step) + 2
    tracker = cp.logging.MetricsTracker(run_dir, cfg.logging, run_config=cp.config.config_to_dict(cfg),
                                        total_steps=total_steps, prefix="[GRPO] ")

    # The queue (records with token ids outside the embedding table are dead-lettered) and the weight server.
    # Records are checked as this job will use them: token ids inside the embedding table, sequences
    # within model_max_length and payloads within record_byte_limit of it (else dead-lettered).
    vocab_size = policy.hf_model.get_input_embeddings().weight.shape[0]
    queue = RedisRolloutQueue(cfg.redis, url=url, consumer=f"trainer-{info.rank}", vocab_size=vocab_size,
                              max_tokens=cfg.policy.model_max_length,
                              max_bytes=record_byte_limit(cfg.policy.model_max_length, grpo.num_samples_per_prompt,
                                                          episode_images=cfg.rollout.multi_turn_config.enable),
                              secret=secret)  # records not signed with the run secret are dead-lettered
    control = RunControl(queue, secret)
    stale = StalenessFilter.from_config(grpo)
    settings = MediaSettings.from_config(dataset_cfg, processor)  # sized as the rollout side sized them
    wire = None if dis.transfer_dtype == "auto" else getattr(torch, dis.transfer_dtype)
    server = WeightServer(policy.hf_model, url, cfg.redis.stream, layout=cp.rollout.sync_layout(cfg.rollout),
                          bucket_bytes=dis.bucket_mb << 20,
                          transfer_dtype=wire or cp.policy.resolve_dtype(cfg.policy.dtype),
                          host=dis.transfer_host or None, timeout_s=dis.transfer_timeout_s, secret=secret)
    if info.is_rank0 and cfg.train.resume:
        # Records trained after the checkpoint died with the weights that learned from them: they are
        # trained again (their prompts generated again), and records.jsonl forgets those steps too.
        roll_back_to(queue, claims, step)
        keep_trained_rows(run_dir / "records.jsonl", step)
    cp.parallel.barrier()  # no rank takes records before the rollback
    registry = job_id = None
    if info.is_rank0:  # the trainer job is listed once; rollout jobs read its records_per_step for their throttle
        registry = JobRegistry(url, cfg.redis.stream, ttl_s=dis.heartbeat_ttl_s)
        job_id = registry.join("trainer", ranks=info.world_size, records_per_step=plan.records_per_step)
        registry.start_heartbeat(job_id, lambda: {"step": step, "weight_version": step})
    if info.is_rank0:
        queue.publish_weight_version(step)
    first = server.publish(step)
    log.info(f"run dir {run_dir}; run {cfg.redis.stream!r} at {cp.config.redact_url(url)}; {total_steps} steps x "
             f"{plan.records_per_step} records x {grpo.num_samples_per_prompt} samples; staleness bound "
             f"{stale.max_staleness}; serving weights version {step} ({first.seconds:.2f}s to snapshot); {mesh}")
    trained_log = open(run_dir / "records.jsonl", "a") if info.is_rank0 else None  # noqa: SIM115 (closed below)

    def claims_extra() -> dict:
        """What a checkpoint keeps of the prompt claims (collective: the same on every rank)."""
        return {"claims_next_range": cp.parallel.broadcast_object(
            claims.position()["next_range"] if info.is_rank0 else None),
                "trained_prompts": trained_prompts.state_dict()}

    # a SIGTERM / SIGUSR1 ([train] signal_to_handle) saves the step in progress once it ends, then stops
    # this job alone: the rollout jobs wait for the restarted trainer (train.resume=true)
    preemption = cp.checkpoint.Preemption.from_config(cfg.train, device=info.device)
    while step < total_steps:
        times: dict[str, float] = {}
        t0 = time.perf_counter()
        records, groups = fetch_records(queue, stale, plan.records_per_trainer, trainer_step=step, settings=settings,
                                        bad=bad, timeout_s=dis.get_timeout_s, processor=processor,
                                        num_samples_per_prompt=grpo.num_samples_per_prompt,
                                        on_dropped=lambda dropped: regenerate(queue, claims, dropped),
                                        already_trained=trained_prompts.is_trained)
        times["wait"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        batch = collate_rollouts(groups, processor).to(info.device)
        times["collate"] = time.perf_counter() - t0
        with dead_letter_on_nonfinite(queue, records, step + 1):  # a restart must not stop on them again
            update = cp.policy.grpo_update(policy, reference, optimizer, batch,
                                           record_advantages(records, info.device),
                                           cp.policy.GRPOUpdateSettings.from_config(cfg), mesh.group("dp"),
                                           step=step + 1)
        times.update(update.times)
        scheduler.step()
        step += 1

        # Publish the version, then the snapshot; ack after, so the rollout throttle never counts the
        # records as consumed before the weights that consumed them are on offer.
        if info.is_rank0:
            queue.publish_weight_version(step)
        times["publish"] = server.publish(step).seconds
        queue.ack(records, step=step)  # the step lets a resume from an older checkpoint take them back

        # every trainer rank's records, for the producer summary and records.jsonl
        trained = [row for rows in cp.parallel.all_gather_object([provenance(r) for r in records]) for row in rows]
        shares = producer_shares(trained, step - 1)  # lag against the weights that trained them
        trained_prompts.mark(record_id for record_id, _, _ in trained)
        if info.is_rank0:  # re-issue what the claims lost or skipped; reset claims keys holding garbage
            trained_prompts.audit(claims, grace_steps=audit_grace, untrain=queue.untrain)
        given_up = cp.parallel.broadcast_object(trained_prompts.last_given_up if info.is_rank0 else None)
        if not info.is_rank0:  # every rank keeps the same account
            trained_prompts.give_up(given_up)
        if trained_log is not None:
            for record_id, producer, version in trained:
                trained_log.write(json.dumps({"step": step, "record_id": record_id, "producer": producer,
                                              "weight_version": version}) + "\n")
            trained_log.flush()
            log.info(f"[GRPO] step {step}: records from {format_shares(shares)}; "
                     f"{len(registry.live('rollout'))} rollout jobs live")
        tracker.log_metrics({
            **record_metrics(records, list(grpo.reward_function)), **update.metrics,
            "response_length": float(batch.completion_lengths.float().mean()), "grad_norm": update.grad_norm,
            "lr": scheduler.get_last_lr()[0], "bad_samples": bad.count, "weight_version": step,
            **share_metrics(shares), **stale.metrics(), **server.metrics(),
            **{k: v for k, v in queue.metrics().items() if k in ("queue/malformed", "queue/redelivered")},
            **{f"time/{k}": v for k, v in times.items()}, "time/step": sum(times.values()),
        }, step)
        # the claims position is read only when a save follows
        scheduled = ckpt.should_save(step) or (step == total_steps and cfg.train.ckpt.enable_checkpoint)
        ckpt.maybe_save(step, weight_version=step, force=step == total_steps,
                        extra=claims_extra() if scheduled else None)
        if preemption.stop_here(ckpt, step, weight_version=step, extra=claims_extra):
            break

    if not preemption.stopped and info.is_rank0:
        control.request_stop(f"trainer finished at step {step}")
    server.close()
    claims.close()
    if registry is not None:
        registry.leave(job_id)
        registry.close()
        trained_log.close()
    control.close()
    queue.close()
    named = cp.rewards.reward_metric_names(grpo.reward_function).values()
    # safetensors/final (unless preempted), checkpoints and uploads settled, <run dir>/curves.png, exit status
    run.finish(ckpt, tracker, preemption, step=step, total_steps=total_steps,
               plot=["reward/mean", *(f"reward/{n}" for n in named), "staleness/max", "rollout/producers"])


if __name__ == "__main__":
    with cp.checkpoint.exit_on_interrupt():  # Ctrl-C: no traceback; prints the command that resumes the run
        main()
