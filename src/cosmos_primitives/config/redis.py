"""``[redis]``: the Redis server and stream used by the disaggregated rollout queue (``cp.queue``)."""

from __future__ import annotations

from cosmos_primitives.config.base import Section


class RedisConfig(Section):
    """``[redis]``: where rollouts travel from rollout workers to the trainer, and how patiently.

    ``url`` (``redis://[:password@]host:port/db``) left empty is taken from the ``COSMOS_REDIS_URL``
    environment variable; a URL set here wins over the variable.

    The stream ``stream`` carries one entry per rollout record. Next to it live, under names derived
    from it: ``<stream>:dead`` (rejected malformed entries), ``<stream>:done`` (ids of records already
    trained on, kept ``done_retention_s`` seconds) and ``<stream>:weight_version`` (the trainer's
    current weight version).
    """

    url: str = ""
    stream: str = "cosmos:rollouts"
    # consumer group of the trainer processes; every trainer consumer of one run uses the same group
    group: str = "trainer"
    # back-pressure: put() waits while the stream holds this many unacknowledged records (records)
    max_pending: int = 256
    # how long put() waits for room before raising QueueFullError (seconds; <= 0: wait forever)
    put_timeout_s: float = 600.0
    # longest single blocking read (XREADGROUP BLOCK); get() loops over these until its own timeout (seconds)
    block_s: float = 1.0
    # an entry delivered to a consumer that has not renewed it for this long is handed to another
    # consumer (XAUTOCLAIM); live consumers renew their entries every claim_idle_s / 3 (seconds)
    claim_idle_s: float = 60.0
    # lost connections are retried with exponential back-off (initial -> max interval) for at most
    # reconnect_timeout_s, then a QueueConnectionError naming the URL is raised (seconds)
    reconnect_timeout_s: float = 60.0
    reconnect_initial_backoff_s: float = 0.05
    reconnect_max_backoff_s: float = 2.0
    # socket read timeout for non-blocking commands (seconds); a hung server counts as a lost connection
    socket_timeout_s: float = 30.0
    # approximate cap on <stream>:dead (entries)
    dead_letter_maxlen: int = 10_000
    # how long the ids of trained records are remembered for de-duplication (seconds)
    done_retention_s: float = 7 * 24 * 3600.0


RUN_STREAM_PREFIX = "cosmos:"


def run_stream(run_name: str) -> str:
    """The ``[redis] stream`` of the run named ``run_name`` (``cosmos:<run_name>``): the trainer job and the
    rollout jobs of one run meet under it (records, claims, live jobs, weight transfer keys).

    Raises:
        ValueError: an empty name or one with whitespace or ``:`` (it is part of every key of the run).
    """
    if not run_name or any(c.isspace() for c in run_name) or ":" in run_name:
        raise ValueError(f"run name {run_name!r}: give a non-empty name without spaces or ':' (e.g. --run grpo_7b_a)")
    return f"{RUN_STREAM_PREFIX}{run_name}"
