"""``[redis]``: the Redis server used by the disaggregated rollout queue."""

from __future__ import annotations

from cosmos_primitives.config.base import Section


class RedisConfig(Section):
    """``[redis]``. ``url`` may also come from the ``COSMOS_REDIS_URL`` environment variable."""

    url: str = ""
