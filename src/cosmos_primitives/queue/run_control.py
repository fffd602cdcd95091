"""Job-wide control next to a Redis rollout stream: a stop flag, and clearing what an earlier run left.

Keys (``S`` = the queue's stream): ``S:stop`` holds the reason once the trainer asked the rollout
workers to stop. :meth:`RunControl.clear_stream` deletes ``S`` (records and the consumer group),
``S:done``, ``S:owners``, ``S:dead``, ``S:stats``, ``S:weight_version``, ``S:producers`` (rollout
workers' resume state), ``S:stop``, the prompt claims ``S:claims:*`` and the job registry ``S:jobs``
and ``S:jobs:<id>``.
"""

from __future__ import annotations

import logging

from cosmos_primitives.queue.job_registry import clear_jobs
from cosmos_primitives.queue.prompt_claims import claim_keys
from cosmos_primitives.queue.redis_link import RedisLink
from cosmos_primitives.queue.redis_queue import RedisRolloutQueue
from cosmos_primitives.sync.run_auth import AuthError, RateLimitedLog, RunSecret

log = logging.getLogger(__name__)


class RunControl:
    """The stop flag of a disaggregated job, shared through the Redis server of its rollout queue.

    The trainer calls :meth:`request_stop` when it has taken its last step; rollout workers poll
    :meth:`stop_requested` between generations. Lost connections are retried with the queue's
    back-off (``[redis] reconnect_*``), then :class:`QueueConnectionError` names the URL.

    With a run secret (``secret``, else ``$COSMOS_RUN_SECRET`` / ``$COSMOS_RUN_SECRET_FILE``; the
    independent jobs require one) the flag is signed (HMAC-SHA256, bound to the stream's key), and
    a flag that is not, written by anyone else who reaches the Redis server, is ignored with a
    warning at most every 10 s. Without a secret (one job with its own Redis) the flag is plain text.

    Args:
        queue: the job's :class:`RedisRolloutQueue` (its URL, stream name and reconnect settings are used;
            this object opens its own connection).
        secret: the run secret (default: from the environment, if set there).
    """

    def __init__(self, queue: RedisRolloutQueue, secret: RunSecret | str | None = None) -> None:
        self._secret = RunSecret.resolve(secret) if secret is not None else RunSecret.from_env(required=False)
        self._warn = RateLimitedLog(log)
        self.stream = queue.stream
        self.stop_key = f"{queue.stream}:stop"
        self.keys = (queue.stream, queue.done_key, queue.owners_key, queue.dead_key, queue.stats_key,
                     queue.version_key, queue.producers_key, self.stop_key, *claim_keys(queue.stream).values(),
                     queue.steps_key)
        self._link = RedisLink(queue.url, queue.config)
        self.safe_url = self._link.safe_url
        self._redis = self._link.client
        self._run = self._link.call

    def request_stop(self, reason: str = "trainer finished") -> None:
        """Ask every rollout worker of the job to stop (sets ``<stream>:stop`` to ``reason``)."""
        value = reason.encode() if self._secret is None else self._secret.sign(self.stop_key, reason.encode())
        self._run("request stop", lambda: self._redis.set(self.stop_key, value))

    def stop_requested(self) -> str | None:
        """The reason given to :meth:`request_stop`, or None while the job runs (or when the flag
        is not signed with the run secret)."""
        raw = self._run("read stop flag", lambda: self._redis.get(self.stop_key))
        if raw is None:
            return None
        if self._secret is not None:
            try:  # set once per run, read for as long as it lasts: no age bound; a fresh secret per run
                raw = self._secret.open(self.stop_key, raw, max_age_s=None)
            except AuthError as exc:
                self._warn.warning("stop", "ignoring the stop flag '%s': not signed with this run's secret (%s)",
                                   self.stop_key, exc)
                return None
        return raw.decode(errors="replace")

    def clear_stop(self) -> bool:
        """Remove a stop flag an earlier run left; returns whether there was one."""
        return bool(self._run("clear stop flag", lambda: self._redis.delete(self.stop_key)))

    def clear_stream(self) -> int:
        """Delete the stream, its consumer group, trained ids, dead letters, weight version, producer
        states, stop flag, prompt claims (position included) and registered jobs.

        For a fresh run only (a resumed run may want the records still queued and the claims
        position). Returns how many of those keys existed.
        """
        return int(self._run("clear stream", lambda: self._redis.delete(*self.keys)
                             + clear_jobs(self._redis, self.stream)))

    def close(self) -> None:
        self._redis.close()

    def __enter__(self) -> RunControl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
