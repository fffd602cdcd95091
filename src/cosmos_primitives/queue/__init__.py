"""Rollout transport between rollout workers and trainers, with weight versions and staleness filtering.

- :class:`RolloutRecord`: one GRPO group (completions, token ids, log-probs, rewards, advantages,
  weight version, media references), msgpack-encoded with :func:`encode_record` / :func:`decode_record`;
  :func:`record_from_group` builds one from a ``cp.data`` ``RolloutGroup``, :func:`group_from_record`
  rebuilds the group (media re-read) and :func:`collate_records` the trainer's batch.
- :class:`RedisRolloutQueue` (Redis Streams, consumer group, back-pressure, redelivery, exactly-once
  training by record id) and :class:`InMemoryRolloutQueue` (one process) share one interface.
- :class:`StalenessFilter` (trainer) drops records over ``allowed_outdated_steps``;
  :class:`RolloutThrottle` (worker) waits instead of producing them.
- :class:`RedisServer`: a private ``redis-server`` on a free loopback port for a run or a test.
- Runs of independent jobs (all keys under ``cp.config.run_stream(run)``): :class:`PromptClaims` hands
  epoch-ordered prompt ranges (:class:`Claim`) to rollout jobs, :class:`JobRegistry` tracks live jobs
  by heartbeat; ``python -m cosmos_primitives.queue.status`` shows a run.

Trainer (one consumer per process that reads; ``step`` = weight version it holds)::

    queue = cp.queue.RedisRolloutQueue(cfg.redis, consumer=f"trainer-{rank}")
    stale = cp.queue.StalenessFilter.from_config(cfg.grpo)
    queue.publish_weight_version(step)
    while step < total_steps:
        records = queue.get(records_per_step, timeout=600)
        kept, dropped = stale.split(records, trainer_step=step)
        queue.ack(dropped)                      # consumed: never delivered again
        ...                                     # train on kept, then sync weights to the rollout ranks
        step += 1
        queue.publish_weight_version(step)      # before acknowledging (see RolloutThrottle)
        queue.ack(kept)
        tracker.log_metrics({**stale.metrics(), **queue.metrics()}, step)

Rollout worker::

    queue = cp.queue.RedisRolloutQueue(cfg.redis)
    throttle = cp.queue.RolloutThrottle.from_config(queue, cfg.grpo, records_per_step)
    while True:
        if throttle.wait(engine.weight_version) > engine.weight_version:
            ...                                 # receive the newer weights
        groups = engine.generate(prompts, params)
        queue.put_many([cp.queue.record_from_group(g, r, a) for g, r, a in zip(groups, rewards, advantages)])
"""

from __future__ import annotations

from cosmos_primitives.queue.base import RolloutQueue, wait_for_weight_version
from cosmos_primitives.queue.errors import MalformedRecordError, QueueConnectionError, QueueError, QueueFullError
from cosmos_primitives.queue.memory_queue import InMemoryRolloutQueue
from cosmos_primitives.queue.record import (
    RolloutRecord,
    check_record,
    check_record_size,
    check_token_range,
    decode_record,
    encode_record,
    media_references,
    record_byte_limit,
    record_from_group,
)
from cosmos_primitives.queue.redis_queue import REDIS_URL_ENV, RedisRolloutQueue, resolve_redis_url
from cosmos_primitives.queue.staleness import StalenessFilter, record_staleness
from cosmos_primitives.queue.throttle import RolloutThrottle, expected_staleness
from cosmos_primitives.utils.lazy_module import lazy_exports

__all__ = [  # the public surface (tests/test_public_surface.py); the rest by module path
    "PromptClaims", "RedisRolloutQueue", "RolloutThrottle", "StalenessFilter", "fetch_records",
    "record_advantages", "records_from_scores", "resolve_redis_url",
]

# Names that import torch (and the media readers) load on first use, so that a process that only
# moves records (``import cosmos_primitives.queue``) stays light.
_LAZY = {
    "Claim": "prompt_claims",
    "JobRegistry": "job_registry",
    "PromptClaims": "prompt_claims",
    "RedisServer": "local_redis",
    "check_trainable": "record_groups",
    "collate_records": "record_groups",
    "dead_letter_on_nonfinite": "record_groups",
    "fetch_records": "record_groups",
    "group_from_record": "record_groups",
    "record_advantages": "record_groups",
    "record_rewards": "record_groups",
    "records_from_scores": "record_groups",
}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, eager=tuple(__all__))
