"""GRPO rollout job: generates for a trainer job it shares only a Redis URL and a run name with.

    torchrun --nproc_per_node 1 examples/grpo_rollout_job.py --config examples/configs/grpo_tiny_jobs.toml \\
        --run-name my_run --redis redis://HOST:6379/0

Start as many as you like, on any node, before or after the trainer job (``examples/grpo_trainer_job.py``,
whose docstring shows the pair, with the same ``$COSMOS_RUN_SECRET`` or ``$COSMOS_RUN_SECRET_FILE``); kill one
(even with SIGKILL) and start another at any time. Every rank
of this job is one rollout engine (``[rollout] backend``) and one member of the run:

1. it registers as a live job of the run (a heartbeat key in Redis, ``[disaggregated] heartbeat_ttl_s``),
   waits for the trainer to serve weights (``[disaggregated] wait_for_trainer_s``) and loads the current
   version through a transfer group formed over Redis (``cp.sync.WeightClient``);
2. it claims a range of prompts of the current epoch (``cp.queue.PromptClaims``: ranges it does not renew
   within ``[disaggregated] claim_ttl_s`` go to another job, so a killed job's prompts are not lost),
   generates ``[grpo] num_samples_per_prompt`` completions each with the weights it holds, scores them,
   and puts one record per prompt on the queue, with an id fixed by epoch and prompt (a range produced
   twice is trained once) and its job id as producer;
3. before each range it fetches the newest weights when the trainer has published a newer version (a
   job that falls behind skips versions), and waits while the queue already holds the staleness bound's
   worth of records (``cp.queue.RolloutThrottle``).

With ``[rollout] backend = "vllm"`` and ``[rollout.parallelism] tp_size = k > 1`` the job is ``world / k``
engines of ``k`` consecutive ranks, each acting in lockstep (``generate`` and the weight load are
collectives over its ranks): the engine's first rank is the member of the run above and decides every
step (stop / fetch / wait / claim), broadcast over the TP group; the other ranks fetch the full weights
when told (each a ``WeightClient`` member ``<job>-tp<r>``; the group fetches until all hold one snapshot)
and call ``generate`` with no prompts of their own (the engine gathers the group's, so every rank submits
the first rank's). Untested on real vLLM (the stand-in in ``tests/standins/vllm`` only).

With ``[rollout.multi_turn_config] enable`` each sample is an episode of model turns and environment
replies (``cp.rollout.episodes``, as in ``examples/grpo_vlm.py``); its record keeps the loss masks.

It stops when the trainer sets the run's stop flag, handing back the claims it holds. Records of a
range in flight when the job dies are never put (a record is one Redis entry: whole or absent).
"""

from __future__ import annotations

import socket
import time
from typing import Any

import cosmos_primitives as cp
from cosmos_primitives.data import BadSampleTracker, SamplingParams, prompt_dataset
from cosmos_primitives.queue import RedisRolloutQueue, RolloutThrottle, records_from_scores
from cosmos_primitives.queue.claimed_prompts import claim_prompts, finish_claim
from cosmos_primitives.queue.disaggregated_plan import plan_jobs
from cosmos_primitives.queue.job_registry import JobRegistry
from cosmos_primitives.queue.prompt_claims import PromptClaims
from cosmos_primitives.queue.record_metrics import PRODUCER_KEY
from cosmos_primitives.queue.run_control import RunControl
from cosmos_primitives.rollout.episodes import generate_rollouts, load_environment, score_rollouts
from cosmos_primitives.rollout.partial import take_newer_weights
from cosmos_primitives.sync import WeightClient, WeightTransferError
from cosmos_primitives.sync.run_auth import RunSecret


def wait_for_trainer(queue: RedisRolloutQueue, control: RunControl, timeout_s: float, log, *,
                     resuming: bool = False) -> bool:
    """Block until the run's trainer has published a weight version; False when the run has finished.

    ``resuming`` (``train.resume=true``, as one launch gives every job): the stop flag the trainer left
    when its last run finished is not the end of this run: wait for the resumed trainer to clear it."""
    deadline = time.monotonic() + timeout_s if timeout_s > 0 else None
    logged = False
    while resuming and control.stop_requested() is not None:
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"run {queue.stream!r} is stopped ({control.stop_requested()}) and no resumed trainer "
                               f"cleared it within {timeout_s}s ([disaggregated] wait_for_trainer_s); start "
                               "examples/grpo_trainer_job.py with train.resume=true and the same --run and --redis")
        if not logged:
            log.info(f"[rollout] run {queue.stream!r} is stopped ({control.stop_requested()}); train.resume=true: "
                     "waiting for the resumed trainer to clear it")
            logged = True
        time.sleep(0.5)
    while control.stop_requested() is None:
        if queue.weight_version() is not None:
            return True
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"no trainer published weights for run {queue.stream!r} within {timeout_s}s "
                               "([disaggregated] wait_for_trainer_s); is examples/grpo_trainer_job.py running "
                               "with the same --run and --redis?")
        if not logged:
            log.info(f"[rollout] waiting for the trainer of run {queue.stream!r}")
            logged = True
        time.sleep(0.5)
    return False


def fetch_in_step(client: WeightClient, group: Any, control: RunControl, log) -> str | None:
    """Load the newest weights the trainer serves, retrying while it (re)starts; with a TP ``group``, on
    every rank of it until all hold the same snapshot (the trainer may publish between their fetches, and
    an engine whose ranks hold two versions would mix them). None once loaded, else the stop reason."""
    while True:
        held, reason = None, control.stop_requested()
        if reason is None and client.published_version() is not None:
            try:
                client.refresh()
                held = (client.session, client.weight_version)
            except WeightTransferError as error:  # the trainer restarting, or a transfer cut off
                log.warning(f"[rollout] {client.member_id}: weight fetch failed ({error}); retrying")
        states = cp.parallel.all_gather_object((held, reason), group)  # [(held, reason)] without a group
        reasons = [r for _, r in states if r is not None]
        if reasons:
            return reasons[0]
        versions = {h for h, _ in states}
        if None not in versions and len(versions) == 1:
            return None
        if None in versions:
            time.sleep(0.5)


def next_action(client: WeightClient, control: RunControl, throttle: RolloutThrottle, trainer_lost: bool,
                log) -> tuple[str, Any]:
    """What the engine does next, decided by its first rank: ``("stop", reason)``, ``("lost", error)`` (no
    trainer serves: retry), ``("fetched", None)`` (newer weights on this rank), ``("wait", None)`` (the
    queue holds enough) or ``("claim", None)``."""
    reason = control.stop_requested()
    if reason is not None:
        return "stop", reason
    try:  # newer weights, or a restarted trainer's (even at a lower version: another checkpoint)
        fresh = client.refresh()
    except WeightTransferError as error:  # the trainer restarting, or gone
        if not trainer_lost:
            log.warning(f"[rollout] {client.member_id}: cannot fetch weights ({error}); retrying until a "
                        "trainer serves")
        return "lost", str(error)
    if fresh is not None:
        return "fetched", None
    if throttle.ahead_by(client.weight_version) > 0:  # the trainer has enough records queued
        return "wait", None
    return "claim", None


def main() -> None:
    cfg, config_path = cp.config.load_recipe_config(__doc__, plugins=True, jobs=True)  # + --run, --redis
    info = cp.parallel.init_distributed()
    log = cp.logging.get_logger()
    dis, grpo = cfg.disaggregated, cfg.grpo
    url = cp.queue.resolve_redis_url(config=cfg.redis)
    secret = RunSecret.from_env()  # the trainer's: records, requests, digests and the stop flag are signed with it
    queue = RedisRolloutQueue(cfg.redis, url=url, secret=secret)
    control = RunControl(queue, secret)
    # vLLM lays the job out as engines of tp_size consecutive ranks, built together by the whole job
    vllm = cp.utils.resolve_backend(cfg.rollout.backend, log=False) == "vllm"  # "auto": decided on this machine
    tp = cfg.rollout.parallelism.tp_size if vllm and info.world_size > 1 else 1
    lead = info.rank % tp == 0  # the engine's first rank: it registers, claims, puts, and decides for its group
    multi = cfg.rollout.multi_turn_config
    partial = cfg.rollout.partial_rollout_chunk_tokens
    if (multi.enable or partial) and tp > 1:  # turns / chunks are generate calls the other ranks cannot foresee
        raise ValueError("[rollout.multi_turn_config] enable and [rollout] partial_rollout_chunk_tokens run with "
                         f"[rollout.parallelism] tp_size = 1 in the rollout job (got {tp}): use engines of one rank")
    # The trainer writes the demo assets (tiny configs) before it publishes: wait first, then check paths.
    waited = wait_for_trainer(queue, control, dis.wait_for_trainer_s, log, resuming=bool(cfg.train.resume))
    if tp > 1:  # the engines are built by every rank of the job or by none
        waited = all(cp.parallel.all_gather_object(waited))
    if not waited:
        log.info(f"[rollout] run {queue.stream!r} has finished ({control.stop_requested()}); nothing to do")
        return
    cfg = cp.config.check_runnable(cfg, config_path)
    cp.utils.seed_everything(cfg.train.seed + info.rank)

    # Listed as live from now on (the heartbeat thread runs while the engine loads and until the job dies):
    # one entry per engine, so a TP engine's other ranks are members of its first rank's job.
    registry = JobRegistry(url, cfg.redis.stream, ttl_s=dis.heartbeat_ttl_s)
    job_id = registry.join("rollout", host=socket.gethostname(), rank=info.rank, tp_size=tp) if lead else ""
    counts = {"weight_version": -1, "records_put": 0, "ranges": 0}
    if lead:
        registry.start_heartbeat(job_id, lambda: counts)
    processor = cp.policy.load_processor(cfg.policy.model_name_or_path)
    engine, engine_model = cp.rollout.build_rollout_engine(
        cfg.rollout, cfg.policy.model_name_or_path, processor, dtype=cfg.policy.dtype, device=info.device,
        seed=cfg.train.seed + info.rank, max_model_len=cfg.policy.model_max_length, colocated=False)
    # A TP engine's ranks act in lockstep (generate and weight loading are collectives over them): its first
    # rank decides each step and broadcasts it; every rank fetches the full weights as a member of its own.
    group = getattr(engine, "tp_group", None)
    if group is not None:
        tp_rank = info.rank % tp
        job_id = cp.parallel.broadcast_object(job_id, src=info.rank - tp_rank, group=group)
        member_id = job_id if lead else f"{job_id}-tp{tp_rank}"
    else:
        member_id = job_id
    # the HF engine's module is written in place; vLLM takes each bucket through update_weights
    client = WeightClient(engine_model if engine_model is not None else engine, url, cfg.redis.stream,
                          member_id=member_id, engine=engine if engine_model is not None else None,
                          timeout_s=dis.transfer_timeout_s, secret=secret)
    t0 = time.perf_counter()
    reason = fetch_in_step(client, group, control, log)
    if reason is not None:
        log.info(f"[rollout] {member_id}: run {queue.stream!r} finished before this job had weights; nothing to do")
        if lead:
            registry.leave(job_id)
        return
    counts["weight_version"] = client.weight_version
    log.info(f"[rollout] {member_id}: loaded weight version {client.weight_version} "
             f"({time.perf_counter() - t0:.2f}s)"
             f"{f'; TP rank {info.rank % tp} of {tp}, every tensor of its shard loaded' if group is not None else ''}")
    if lead:
        dataset = prompt_dataset(cfg.train.train_policy.dataset,
                                 prompt_column=cfg.train.train_policy.prompt_column_name,
                                 response_column=cfg.train.train_policy.response_column_name, processor=processor,
                                 setup_config=cfg)
        trainers = registry.live("trainer")
        trainer_ranks = int(next(iter(trainers.values())).get("ranks", 1)) if trainers else 1
        plan = plan_jobs(cfg, trainer_ranks)
        claims = PromptClaims(url, cfg.redis.stream, dataset_size=len(dataset), range_size=plan.prompts_per_rollout,
                              seed=cfg.train.seed, claim_ttl_s=dis.claim_ttl_s)
        bad = BadSampleTracker(cfg.train.train_policy.dataset.bad_sample_budget)
        rewards = cp.rewards.RewardSet.from_config(grpo)
        throttle = RolloutThrottle.from_config(queue, grpo, plan.records_per_step)
        claims.start_renewal(job_id)  # a daemon thread: the claims expire when the job dies
    env = load_environment(multi)  # None without [rollout.multi_turn_config] enable: one model turn
    waited_s, trainer_lost = 0.0, False
    while True:
        # one broadcast per step; the other ranks of a TP engine pass no prompts of their own to generate
        action, detail = next_action(client, control, throttle, trainer_lost, log) if lead else ("", None)
        claim, prompts, ids, params = None, [], [], None
        if action == "claim":  # damaged claims keys: "wait" (logged) until the trainer's audit resets them
            action, claim, prompts, ids = claim_prompts(claims, job_id, dataset, bad, log)
        if prompts:  # none: every epoch handed out, or the claim expired and went to another job meanwhile
            params = SamplingParams.from_config(cfg.rollout, grpo.num_samples_per_prompt,
                                                seed=cfg.train.seed * 1_000_003 + claim.range_id * 1009)
        if group is not None:
            action, detail, params = cp.parallel.broadcast_object((action, detail, params), src=info.rank - tp_rank,
                                                                  group=group)
        trainer_lost = action == "lost"
        if action == "stop":
            reason = detail
            break
        if action == "lost":
            time.sleep(1.0)
            continue
        if action == "fetched":
            if group is not None:  # the first rank has fetched: its group follows
                reason = fetch_in_step(client, group, control, log)
                if reason is not None:
                    break
            counts["weight_version"] = client.weight_version
            continue
        if action == "wait":
            time.sleep(dis.poll_s)
            waited_s += dis.poll_s
            continue
        t0 = time.perf_counter()
        records = []
        if params is not None:
            groups = generate_rollouts(engine, processor, prompts, params, env, multi=multi,
                                       max_response_length=cfg.rollout.max_response_length, chunk_tokens=partial,
                                       between_chunks=lambda: counts.update(  # partial rollouts
                                           weight_version=take_newer_weights(client, log)))
            if lead:  # an episode's record carries its loss masks (model tokens 1) and turn rewards
                scored, episodes = score_rollouts(groups, rewards, grpo, processor, multi_turn=env is not None,
                                                  max_response_length=cfg.rollout.max_response_length)
                records = records_from_scores(groups, scored, list(grpo.reward_function), record_ids=ids,
                                              meta={PRODUCER_KEY: job_id})
                queue.put_many(records)
        if not lead:
            continue
        late = finish_claim(claims, claim, job_id, log)  # it had expired and gone to another job
        counts["records_put"] += len(records)
        counts["ranges"] += 1
        log.info(f"[rollout] {job_id}: epoch {claim.epoch} range {claim.range_id}: {len(records)} records with "
                 f"weight version {client.weight_version}, {time.perf_counter() - t0:.1f}s"
                 f"{''.join(f', {k} {v:.2f}' for k, v in episodes.items()) if records else ''}"
                 f"{' (claim had expired: duplicates are trained once)' if late else ''}; "
                 f"waited {waited_s:.1f}s for the trainer so far")
    closeables = [client, control, queue]
    if lead:
        released = claims.release(job_id)
        log.info(f"[rollout] {job_id}: stopping ({reason}) after {counts['ranges']} ranges, {counts['records_put']} "
                 f"records, at weight version {client.weight_version}; {released} claims handed back, "
                 f"{bad.count} bad prompts")
        registry.leave(job_id)
        closeables = [registry, claims, *closeables]
    else:
        log.info(f"[rollout] {member_id}: stopping with its engine's first rank ({reason})")
    for closeable in closeables:
        closeable.close()
    cp.parallel.destroy_distributed()


if __name__ == "__main__":
    main()
