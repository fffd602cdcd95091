"""GRPO rollout job: generates for a trainer job it shares only a Redis URL and a run name with.

    torchrun --nproc_per_node 1 examples/grpo_rollout_job.py --config examples/configs/grpo_tiny_jobs.toml \\
        --run my_run --redis redis://HOST:6379/0

Start as many as you like, on any node, before or after the trainer job (``examples/grpo_trainer_job.py``,
whose docstring shows the pair); kill one (even with SIGKILL) and start another at any time. Every rank
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

It stops when the trainer sets the run's stop flag, handing back the claims it holds. Records of a
range in flight when the job dies are never put (a record is one Redis entry: whole or absent).
"""

from __future__ import annotations

import socket
import time

import cosmos_primitives as cp
from cosmos_primitives.data import (
    BadSampleError,
    BadSampleTracker,
    SamplingParams,
    bad_sample_boundary,
    prompt_dataset,
)
from cosmos_primitives.queue import RedisRolloutQueue, RolloutThrottle, records_from_scores
from cosmos_primitives.queue.disaggregated_plan import plan_jobs
from cosmos_primitives.queue.job_registry import JobRegistry
from cosmos_primitives.queue.prompt_claims import PromptClaims
from cosmos_primitives.queue.record_metrics import PRODUCER_KEY
from cosmos_primitives.queue.run_control import RunControl
from cosmos_primitives.sync import WeightClient, WeightTransferError


def wait_for_trainer(queue: RedisRolloutQueue, control: RunControl, timeout_s: float, log) -> bool:
    """Block until the run's trainer has published a weight version; False when the run has finished."""
    deadline = time.monotonic() + timeout_s if timeout_s > 0 else None
    logged = False
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


def fetch_weights(client: WeightClient, control: RunControl, log) -> bool:
    """Load the newest weights the trainer serves, retrying while it (re)starts; False when the run has finished."""
    while control.stop_requested() is None:
        if client.published_version() is not None:
            try:
                client.fetch()
                return True
            except WeightTransferError as error:  # the trainer restarting, or a transfer cut off
                log.warning(f"[rollout] {client.member_id}: weight fetch failed ({error}); retrying")
        time.sleep(0.5)
    return False


def main() -> None:
    cfg, config_path = cp.config.load_recipe_config(__doc__, plugins=True, jobs=True)  # + --run, --redis
    info = cp.parallel.init_distributed()
    log = cp.logging.get_logger()
    dis, grpo = cfg.disaggregated, cfg.grpo
    url = cp.queue.resolve_redis_url(config=cfg.redis)
    queue = RedisRolloutQueue(cfg.redis, url=url)
    control = RunControl(queue)
    # The trainer writes the demo assets (tiny configs) before it publishes: wait first, then check paths.
    if not wait_for_trainer(queue, control, dis.wait_for_trainer_s, log):
        log.info(f"[rollout] run {queue.stream!r} has finished ({control.stop_requested()}); nothing to do")
        return
    cfg = cp.config.check_runnable(cfg, config_path)
    cp.utils.seed_everything(cfg.train.seed + info.rank)

    # Listed as live from now on (the heartbeat thread runs while the engine loads and until the job dies).
    registry = JobRegistry(url, cfg.redis.stream, ttl_s=dis.heartbeat_ttl_s)
    job_id = registry.join("rollout", host=socket.gethostname(), rank=info.rank)
    counts = {"weight_version": -1, "records_put": 0, "ranges": 0}
    registry.start_heartbeat(job_id, lambda: counts)
    processor = cp.policy.load_processor(cfg.policy.model_name_or_path)
    engine, engine_model = cp.rollout.build_rollout_engine(
        cfg.rollout, cfg.policy.model_name_or_path, processor, dtype=cfg.policy.dtype, device=info.device,
        seed=cfg.train.seed + info.rank, max_model_len=cfg.policy.model_max_length, colocated=False)
    # the HF engine's module is written in place; vLLM takes each bucket through update_weights
    client = WeightClient(engine_model if engine_model is not None else engine, url, cfg.redis.stream,
                          member_id=job_id, engine=engine if engine_model is not None else None,
                          timeout_s=dis.transfer_timeout_s)
    t0 = time.perf_counter()
    if not fetch_weights(client, control, log):
        log.info(f"[rollout] {job_id}: run {queue.stream!r} finished before this job had weights; nothing to do")
        registry.leave(job_id)
        return
    counts["weight_version"] = client.weight_version
    log.info(f"[rollout] {job_id}: loaded weight version {client.weight_version} ({time.perf_counter() - t0:.2f}s)")

    dataset = prompt_dataset(cfg.train.train_policy.dataset, cfg, processor)
    trainers = registry.live("trainer")
    trainer_ranks = int(next(iter(trainers.values())).get("ranks", 1)) if trainers else 1
    plan = plan_jobs(cfg, trainer_ranks)
    claims = PromptClaims(url, cfg.redis.stream, dataset_size=len(dataset), range_size=plan.prompts_per_rollout,
                          seed=cfg.train.seed, claim_ttl_s=dis.claim_ttl_s)
    bad = BadSampleTracker(cfg.train.train_policy.dataset.bad_sample_budget)
    rewards = cp.rewards.RewardSet.from_config(grpo)
    throttle = RolloutThrottle.from_config(queue, grpo, plan.records_per_step)
    claims.start_renewal(job_id)  # a daemon thread: the claims expire when the job dies
    waited_s, trainer_lost = 0.0, False
    while True:
        reason = control.stop_requested()
        if reason is not None:
            break
        try:  # newer weights, or a restarted trainer's (even at a lower version: another checkpoint)
            fresh = client.refresh()
        except WeightTransferError as error:  # the trainer restarting, or gone
            if not trainer_lost:
                log.warning(f"[rollout] {job_id}: cannot fetch weights ({error}); retrying until a trainer serves")
                trainer_lost = True
            time.sleep(1.0)
            continue
        trainer_lost = False
        if fresh is not None:
            counts["weight_version"] = client.weight_version
            continue
        if throttle.ahead_by(client.weight_version) > 0:  # the trainer has enough records queued
            time.sleep(dis.poll_s)
            waited_s += dis.poll_s
            continue
        claim = claims.claim(job_id)
        if claim is None:
            break
        t0 = time.perf_counter()
        prompts, ids = [], []
        for index in claim.indices:
            try:
                with bad_sample_boundary(f"sample {index}"):  # one bad row skips that row
                    prompts.append(dataset[index])
                ids.append(claims.record_id(claim, index))
            except BadSampleError as error:
                bad.record(error, sample=index)
        records = []
        if prompts and claims.holds(claim):  # else the claim expired and went to another job while we waited
            params = SamplingParams.from_config(cfg.rollout, grpo.num_samples_per_prompt,
                                                seed=cfg.train.seed * 1_000_003 + claim.range_id * 1009)
            groups = engine.generate(prompts, params)
            scored = cp.rewards.score_groups(groups, rewards, grpo, cfg.rollout.max_response_length)
            records = records_from_scores(groups, scored, list(grpo.reward_function), record_ids=ids,
                                          meta={PRODUCER_KEY: job_id})
            queue.put_many(records)
        late = not claims.complete(claim)  # the claim had expired and gone to another job
        counts["records_put"] += len(records)
        counts["ranges"] += 1
        log.info(f"[rollout] {job_id}: epoch {claim.epoch} range {claim.range_id}: {len(records)} records with "
                 f"weight version {client.weight_version}, {time.perf_counter() - t0:.1f}s"
                 f"{' (claim had expired: duplicates are trained once)' if late else ''}; "
                 f"waited {waited_s:.1f}s for the trainer so far")
    released = claims.release(job_id)
    log.info(f"[rollout] {job_id}: stopping ({reason}) after {counts['ranges']} ranges, {counts['records_put']} "
             f"records, at weight version {client.weight_version}; {released} claims handed back, "
             f"{bad.count} bad prompts")
    registry.leave(job_id)
    for closeable in (registry, claims, client, control, queue):
        closeable.close()
    cp.parallel.destroy_distributed()


if __name__ == "__main__":
    main()
