"""One Redis connection for the job-wide keys of a run (stop flag, claims, job registry).

Lost connections are retried by redis-py with the ``[redis] reconnect_*`` back-off; past
``reconnect_timeout_s`` the caller gets a :class:`QueueConnectionError` naming the (redacted) URL.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from cosmos_primitives.config.redis import RedisConfig
from cosmos_primitives.config.secrets import redact_url
from cosmos_primitives.queue.errors import QueueConnectionError
from cosmos_primitives.queue.redis_queue import REDIS_URL_ENV, resolve_redis_url

T = TypeVar("T")


class RedisLink:
    """A retrying Redis client whose failures name the server.

    Args:
        url: ``redis://``, ``rediss://`` or ``unix://`` URL; empty: ``config.url``, then ``$COSMOS_REDIS_URL``.
        config: ``[redis]`` (only the reconnect and socket settings are used); default ``RedisConfig()``.
    """

    def __init__(self, url: str | None, config: RedisConfig | None = None) -> None:
        cfg = config or RedisConfig()
        self.url = resolve_redis_url(url, cfg)
        self.safe_url = redact_url(self.url)
        self._timeout_s = cfg.reconnect_timeout_s
        retries = max(1, math.ceil(cfg.reconnect_timeout_s / cfg.reconnect_max_backoff_s))
        self.client = redis.Redis.from_url(
            self.url,
            protocol=2,
            retry=Retry(ExponentialBackoff(cap=cfg.reconnect_max_backoff_s, base=cfg.reconnect_initial_backoff_s),
                        retries),
            retry_on_error=[redis.exceptions.ConnectionError, redis.exceptions.TimeoutError],
            socket_timeout=cfg.socket_timeout_s,
            socket_connect_timeout=min(5.0, cfg.socket_timeout_s),
        )

    def call(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()``, with a lasting connection failure raised as :class:`QueueConnectionError` about ``what``."""
        try:
            return fn()
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            raise QueueConnectionError(
                f"Redis at {self.safe_url} unreachable during {what} (retried for about {self._timeout_s}s: {exc}); "
                f"check that redis-server runs at that address ([redis] url or ${REDIS_URL_ENV})"
            ) from exc

    def close(self) -> None:
        self.client.close()
