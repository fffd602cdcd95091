"""``[remote_reward]``: the remote reward service client (REFERENCE.md section 5).

Example::

    [remote_reward]
    enqueue_url = "http://127.0.0.1:8080/api/reward/enqueue"   # or env REMOTE_REWARD_ENQUEUE_URL
    fetch_url = "http://127.0.0.1:8080/api/reward/pull"        # or env REMOTE_REWARD_FETCH_URL
    scale = 1.0

    [[remote_reward.rewards]]
    name = "dance_grpo"
    weight = 1.0
    score_key = "vq_reward+mq_reward"
    clip = [-5.0, 5.0]
"""

from __future__ import annotations

import msgspec

from cosmos_primitives.config.base import Section


class RemoteRewardTerm(Section):
    """``[[remote_reward.rewards]]``: how one reward of the service enters the total.

    ``name`` is the reward's name on the service (a key of the enqueue's ``reward_fn``).
    ``score_key`` names the key of the reply's ``scores`` table to use; ``"a+b"`` sums keys ``a``
    and ``b`` per item. Left unset, the reward's own name is used when the reply has that key, else
    the reply's only key. ``clip = [low, high]`` clips the (summed) score before weighting; use
    ``inf`` / ``-inf`` for a one-sided clip.
    """

    name: str
    weight: float = 1.0
    score_key: str | None = None
    clip: tuple[float, float] | None = None


class RemoteRewardConfig(Section):
    """``[remote_reward]``. Per sample: ``total = scale * sum(weight * clip(score))`` over ``rewards``.

    Empty URLs are read from ``REMOTE_REWARD_ENQUEUE_URL`` / ``REMOTE_REWARD_FETCH_URL`` (else the
    guide's ``WFM_REWARD_ENQUEUE_URL`` / ``WFM_REWARD_FETCH_URL``); the bearer token always comes from
    the environment variable named by ``token_env`` (else ``WFM_REWARD_TOKEN``; tokens do not belong
    in config files). Times are in seconds.
    """

    enqueue_url: str = ""
    fetch_url: str = ""
    token_env: str = "REMOTE_REWARD_TOKEN"
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 60.0
    # retries of one HTTP request after a connection error, a timeout or a 5xx reply
    max_retries: int = 3
    # wait before retry k (k = 1, 2, ...): min(retry_backoff_s * 2 ** (k - 1), retry_max_backoff_s)
    retry_backoff_s: float = 0.5
    retry_max_backoff_s: float = 10.0
    # a 503 (server queue full) is retried like the above when true, reported at once when false
    retry_on_queue_full: bool = True
    # polling for a result: HTTP 400 means "not ready yet"
    poll_interval_s: float = 0.05
    poll_backoff: float = 1.5
    poll_max_interval_s: float = 5.0
    poll_timeout_s: float = 600.0
    # header carrying the enqueue reply's replica_id on fetches (routing of the hosted service)
    replica_header: str = "X-Lepton-Replica-Target"
    # largest reply read from the service (bytes); a larger one is refused, not read whole
    max_reply_bytes: int = 32 << 20
    scale: float = 1.0
    rewards: list[RemoteRewardTerm] = msgspec.field(default_factory=list)
