"""Asynchronous client of the remote reward service (REFERENCE.md section 5).

One :meth:`RemoteRewardClient.score` call sends the whole batch in one enqueue, then polls the
fetch URL for every configured reward at once (HTTP 400 = not ready: wait with back-off) and
combines the replies per sample::

    total[i] = scale * sum_r weight_r * clip_r(score_r[i])
    score_r[i] = sum of the reply's score keys named by score_key_r ("a+b" sums keys a and b)

Items the service failed to score arrive as -1.0 (the service's convention) and are combined like
any other score. Use :meth:`~RemoteRewardClient.enqueue` and :meth:`~RemoteRewardClient.collect`
separately to overlap the service's work with your own, or :meth:`~RemoteRewardClient.score_sync`
from a loop that is not ``async``.

Retries: a request that timed out is sent again, so a batch whose enqueue reply was lost can be
scored twice by the service (the orphan copy is never fetched and expires there).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cosmos_primitives.config.remote_reward import RemoteRewardConfig, RemoteRewardTerm
from cosmos_primitives.rewards.remote_errors import (
    RemoteRewardAuthError,
    RemoteRewardBadReply,
    RemoteRewardBusy,
    RemoteRewardError,
    RemoteRewardRejected,
    RemoteRewardTimeout,
    RemoteRewardUnreachable,
)
from cosmos_primitives.rewards.remote_protocol import (
    ENQUEUE_PATH,
    ENV_ENQUEUE_URL,
    ENV_FETCH_URL,
    FETCH_PATH,
    SEED_ENV_ENQUEUE_URL,
    SEED_ENV_FETCH_URL,
    SEED_ENV_TOKEN,
    ProtocolError,
    check_media,
    encode_enqueue_body,
    parse_json,
    split_score_key,
)
from cosmos_primitives.utils.async_bridge import run_sync
from cosmos_primitives.utils.extras import require

log = logging.getLogger(__name__)

_PROTOCOL_KEYS = ("prompts", "reward_fn", "media_type", "video_infos")


@dataclass(frozen=True)
class RewardJob:
    """A batch accepted by the service: what :meth:`RemoteRewardClient.collect` needs to fetch it."""

    uuid: str
    batch_size: int
    reward_names: tuple[str, ...]
    replica_id: str | None = None


@dataclass
class RemoteRewardResult:
    """Scores of one batch.

    Attributes:
        total: [B] float32, ``scale * sum(weight * clip(score))`` over the configured rewards.
        per_reward: {reward name: [B] float32}, each reward's score after summing its score keys,
            before clipping and weighting (what to log).
        replies: {reward name: the service's reply as sent} (``scores``, ``input_info``, ``duration``,
            ``type``).
        uuid: the service's id of the batch.
    """

    total: np.ndarray
    per_reward: dict[str, np.ndarray]
    replies: dict[str, dict[str, Any]] = field(default_factory=dict)
    uuid: str = ""


def _terms_from(rewards: dict[str, float] | list[RemoteRewardTerm]) -> list[RemoteRewardTerm]:
    if isinstance(rewards, dict):
        return [RemoteRewardTerm(name=name, weight=float(w)) for name, w in rewards.items()]
    return list(rewards)


def _message_of(body: bytes) -> str:
    """The server's explanation in an error reply: its JSON ``error`` field, else the text."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        payload = parse_json(body, "the reply", allow_nonfinite=True)
    except ProtocolError:
        return text[:500] or "<empty body>"
    if isinstance(payload, dict):
        for key in ("error", "message", "detail"):
            if key in payload:
                return str(payload[key])
    return text[:500]


class RemoteRewardClient:
    """Scores batches of media with a remote reward service.

    Args:
        config: the ``[remote_reward]`` section (defaults when None).
        enqueue_url / fetch_url: override the config; when both are empty the environment variables
            ``REMOTE_REWARD_ENQUEUE_URL`` / ``REMOTE_REWARD_FETCH_URL`` are used. A missing fetch URL
            is derived from an enqueue URL ending in ``/api/reward/enqueue``.
        token: bearer token; by default read from the environment variable ``config.token_env``
            (``REMOTE_REWARD_TOKEN``) when the client is built.
        rewards: override ``config.rewards``: a list of :class:`RemoteRewardTerm`, or
            ``{name: weight}`` (no clip, default score key).

    Raises:
        ValueError: no URL, no reward, or a reward named twice.
        MissingExtraError: ``aiohttp`` is not installed (extra ``wfm``).
    """

    def __init__(
        self,
        config: RemoteRewardConfig | None = None,
        *,
        enqueue_url: str | None = None,
        fetch_url: str | None = None,
        token: str | None = None,
        rewards: dict[str, float] | list[RemoteRewardTerm] | None = None,
    ) -> None:
        self._aiohttp = require("aiohttp", "the remote reward client")
        # aiohttp >= 3.10 tells a connect timeout (server down) from a read timeout (server hung)
        self._connect_timeout = getattr(self._aiohttp, "ConnectionTimeoutError", ())
        self.config = config if config is not None else RemoteRewardConfig()
        cfg = self.config
        self.enqueue_url = (enqueue_url or cfg.enqueue_url or os.environ.get(ENV_ENQUEUE_URL)
                            or os.environ.get(SEED_ENV_ENQUEUE_URL, ""))
        self.fetch_url = (fetch_url or cfg.fetch_url or os.environ.get(ENV_FETCH_URL)
                          or os.environ.get(SEED_ENV_FETCH_URL, ""))
        if not self.enqueue_url:
            raise ValueError(
                f"no reward-service enqueue URL: set [remote_reward].enqueue_url or the environment variable "
                f"{ENV_ENQUEUE_URL} (e.g. http://host:8080{ENQUEUE_PATH})"
            )
        if not self.fetch_url and self.enqueue_url.rstrip("/").endswith(ENQUEUE_PATH):
            self.fetch_url = self.enqueue_url.rstrip("/")[: -len(ENQUEUE_PATH)] + FETCH_PATH
        if not self.fetch_url:
            raise ValueError(
                f"no reward-service fetch URL: set [remote_reward].fetch_url or the environment variable "
                f"{ENV_FETCH_URL} (e.g. http://host:8080{FETCH_PATH})"
            )
        if token is None:
            token = os.environ.get(cfg.token_env) or os.environ.get(SEED_ENV_TOKEN)
        self.token = token or None
        self.terms = _terms_from(rewards if rewards is not None else cfg.rewards)
        if not self.terms:
            raise ValueError(
                "no rewards to request: add [[remote_reward.rewards]] tables (name, weight, score_key, clip) "
                "or pass rewards={'name': weight}"
            )
        names = [t.name for t in self.terms]
        duplicated = sorted({n for n in names if names.count(n) > 1})
        if duplicated:
            raise ValueError(f"rewards named more than once in [[remote_reward.rewards]]: {duplicated}")
        for term in self.terms:
            if term.score_key is not None:
                split_score_key(term.score_key)
            if term.clip is not None and term.clip[0] > term.clip[1]:
                raise ValueError(f"reward {term.name!r}: clip {list(term.clip)} has low > high")

    # ------------------------------------------------------------------ HTTP

    def _session(self) -> Any:
        cfg = self.config
        timeout = self._aiohttp.ClientTimeout(total=cfg.request_timeout_s, sock_connect=cfg.connect_timeout_s)
        return self._aiohttp.ClientSession(timeout=timeout)

    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = dict(extra or {})
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def _auth_error(self, url: str, body: bytes) -> RemoteRewardAuthError:
        env = self.config.token_env
        if self.token:
            hint = f"the token sent was refused: set the environment variable {env} to the server's token"
        else:
            hint = f"no token was sent because the environment variable {env} is not set: set it to the server's token"
        return RemoteRewardAuthError(f"reward service at {url} answered HTTP 401 ({_message_of(body)}); {hint}",
                                     url=url, status=401)

    async def _post(self, session: Any, url: str, what: str, data: Any, headers: dict[str, str]) -> tuple[int, bytes]:
        """POST with retries on connection errors, timeouts and 5xx; returns the first other reply."""
        cfg = self.config
        aiohttp = self._aiohttp
        attempts = 1 + max(0, cfg.max_retries)
        last: str = ""
        last_status: int | None = None
        kind = ""
        for attempt in range(attempts):
            if attempt:
                await asyncio.sleep(min(cfg.retry_backoff_s * 2 ** (attempt - 1), cfg.retry_max_backoff_s))
            try:
                async with session.post(url, data=data, headers=headers) as resp:
                    status, body = resp.status, await self._read_reply(resp, url, what)
            except asyncio.TimeoutError as exc:
                if isinstance(exc, self._connect_timeout):
                    kind, last = "connect", f"no connection within connect_timeout_s={cfg.connect_timeout_s}"
                else:
                    kind, last = "timeout", f"no reply within request_timeout_s={cfg.request_timeout_s}"
                log.warning("%s: %s (attempt %d/%d) at %s", what, last, attempt + 1, attempts, url)
                continue
            except aiohttp.ClientConnectionError as exc:
                kind, last = "connect", f"{type(exc).__name__}: {exc}"
                log.warning("%s: %s (attempt %d/%d) at %s", what, last, attempt + 1, attempts, url)
                continue
            if status == 401:
                raise self._auth_error(url, body)
            if status == 503 and not cfg.retry_on_queue_full:
                raise RemoteRewardBusy(
                    f"{what}: reward service at {url} is full (HTTP 503: {_message_of(body)}); retry later, "
                    f"set [remote_reward].retry_on_queue_full = true, or raise the server's max_pending",
                    url=url, status=503,
                )
            if status >= 500 and status != 501:
                kind, last, last_status = "server", f"HTTP {status}: {_message_of(body)}", status
                log.warning("%s: %s (attempt %d/%d) at %s", what, last, attempt + 1, attempts, url)
                continue
            return status, body
        tried = f"{attempts} attempt(s) (max_retries={cfg.max_retries}, retry_backoff_s={cfg.retry_backoff_s})"
        if kind == "timeout":
            raise RemoteRewardTimeout(
                f"{what}: reward service at {url} did not answer in {tried}: {last}; it is overloaded or hung "
                f"(if it is only slow, raise [remote_reward].request_timeout_s)", url=url,
            )
        if kind == "connect":
            raise RemoteRewardUnreachable(
                f"{what}: reward service at {url} is unreachable after {tried}: {last}; check that the server is "
                f"running and the URL ([remote_reward] or {ENV_ENQUEUE_URL} / {ENV_FETCH_URL})", url=url,
            )
        if last_status == 503:
            raise RemoteRewardBusy(
                f"{what}: reward service at {url} stayed full after {tried} ({last}); raise the server's "
                f"max_pending or [remote_reward].max_retries", url=url, status=503,
            )
        raise RemoteRewardRejected(f"{what}: reward service at {url} failed after {tried}: {last}",
                                   url=url, status=last_status)

    async def _read_reply(self, resp: Any, url: str, what: str) -> bytes:
        """The reply's body, refused (never read whole) when over ``max_reply_bytes``."""
        limit = self.config.max_reply_bytes
        too_large = (f"{what}: the reply from {url} is over [remote_reward].max_reply_bytes={limit} "
                     f"(HTTP {resp.status}); is the URL the reward service? Raise max_reply_bytes if it is")
        if resp.content_length is not None and resp.content_length > limit:
            raise RemoteRewardBadReply(f"{too_large} (Content-Length {resp.content_length})", url=url,
                                       status=resp.status)
        body = bytearray()
        async for chunk in resp.content.iter_chunked(1 << 16):
            body += chunk
            if len(body) > limit:
                raise RemoteRewardBadReply(too_large, url=url, status=resp.status)
        return bytes(body)

    @staticmethod
    def _json(body: bytes, url: str, what: str) -> dict[str, Any]:
        try:
            payload = parse_json(body, f"reply from {url}", allow_nonfinite=True)
        except ProtocolError as exc:
            raise RemoteRewardBadReply(f"{what}: {exc.message}: {body[:200]!r}", url=url, status=200) from None
        if not isinstance(payload, dict):
            raise RemoteRewardBadReply(f"{what}: reply from {url} is not a JSON object: {body[:200]!r}",
                                       url=url, status=200)
        return payload

    # ------------------------------------------------------------------ protocol

    async def enqueue(
        self,
        prompts: list[str],
        media: np.ndarray,
        media_type: str,
        video_fps: float | None = None,
        *,
        extra: dict[str, Any] | None = None,
        session: Any = None,
    ) -> RewardJob:
        """Send one batch; returns the job to :meth:`collect`.

        Args:
            prompts: B prompts, one per item.
            media: ``video`` uint8 [B, C, T, H, W], ``image`` uint8 [B, H, W, C], or ``latent``
                float [B, C, T, H, W].
            media_type: ``"video"``, ``"image"`` or ``"latent"``.
            video_fps: frames per second, sent as ``video_infos`` (one entry per item); omitted when None.
            extra: more JSON fields some rewards read (e.g. GenEval's ``tag`` / ``include``).
            session: an open ``aiohttp.ClientSession`` to reuse (one is opened per call otherwise).

        Raises:
            ValueError: media or prompts that the service would refuse (checked before sending).
            RemoteRewardError: see :mod:`cosmos_primitives.rewards.remote_errors`.
        """
        media = np.asarray(media)
        try:
            check_media(media, media_type)
        except ProtocolError as exc:
            raise ValueError(f"RemoteRewardClient: {exc.message}") from None
        if not isinstance(prompts, (list, tuple)) or not all(isinstance(p, str) for p in prompts):
            raise ValueError("RemoteRewardClient: prompts must be a list of str, one per item")
        if len(prompts) != media.shape[0]:
            raise ValueError(
                f"RemoteRewardClient: {len(prompts)} prompts for a batch of {media.shape[0]} items "
                f"(media shape {list(media.shape)}); give one prompt per item"
            )
        clash = sorted(set(extra or {}) & set(_PROTOCOL_KEYS))
        if clash:
            raise ValueError(f"RemoteRewardClient: extra fields {clash} would overwrite protocol fields")
        meta: dict[str, Any] = {
            **(extra or {}),
            "prompts": list(prompts),
            "reward_fn": {t.name: t.weight for t in self.terms},
            "media_type": media_type,
        }
        if video_fps is not None and not (np.isfinite(video_fps) and video_fps > 0):
            raise ValueError(f"RemoteRewardClient: video_fps must be a positive finite number, got {video_fps!r}")
        if video_fps is not None:
            meta["video_infos"] = [{"video_fps": float(video_fps)}] * len(prompts)
        if session is None:
            async with self._session() as own:
                return await self.enqueue(prompts, media, media_type, video_fps, extra=extra, session=own)
        # encoding copies the whole batch: keep it off the event loop
        body = await asyncio.get_running_loop().run_in_executor(None, encode_enqueue_body, meta, media)
        headers = self._headers({"Content-Type": "application/octet-stream"})
        url = self.enqueue_url
        status, reply = await self._post(session, url, "enqueue", body, headers)
        if status != 200:
            raise RemoteRewardRejected(
                f"enqueue of {len(prompts)} items ({media_type} {list(media.shape)} {media.dtype}) refused by {url} "
                f"with HTTP {status}: {_message_of(reply)}", url=url, status=status,
            )
        payload = self._json(reply, url, "enqueue")
        if not isinstance(payload.get("uuid"), str) or not payload["uuid"]:
            raise RemoteRewardBadReply(f"enqueue: reply from {url} has no 'uuid': {payload}", url=url, status=200)
        replica = payload.get("replica_id")
        return RewardJob(
            uuid=payload["uuid"],
            batch_size=len(prompts),
            reward_names=tuple(t.name for t in self.terms),
            replica_id=None if replica is None else str(replica),
        )

    async def _fetch_one(self, session: Any, job: RewardJob, name: str) -> dict[str, Any]:
        cfg = self.config
        url = self.fetch_url
        extra = {cfg.replica_header: job.replica_id} if job.replica_id and cfg.replica_header else None
        headers = self._headers(extra)
        what = f"fetch of reward {name!r} for job {job.uuid}"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + cfg.poll_timeout_s
        interval = cfg.poll_interval_s
        polls = 0
        while True:
            status, body = await self._post(session, url, what, {"uuid": job.uuid, "type": name}, headers)
            polls += 1
            if status == 200:
                return self._json(body, url, what)
            if status != 400:
                raise RemoteRewardRejected(f"{what} refused by {url} with HTTP {status}: {_message_of(body)}",
                                           url=url, status=status)
            if loop.time() + interval > deadline:
                raise RemoteRewardTimeout(
                    f"{what}: not ready after {cfg.poll_timeout_s}s ({polls} polls) at {url}; the service is slow "
                    f"or stuck, or raise [remote_reward].poll_timeout_s", url=url, status=400,
                )
            await asyncio.sleep(interval)
            interval = min(interval * cfg.poll_backoff, cfg.poll_max_interval_s)

    def _scores(self, term: RemoteRewardTerm, reply: dict[str, Any], batch_size: int) -> np.ndarray:
        url = self.fetch_url
        scores = reply.get("scores")
        if not isinstance(scores, dict) or not scores:
            raise RemoteRewardBadReply(f"reply for reward {term.name!r} from {url} has no 'scores' table: "
                                       f"{str(reply)[:300]}", url=url, status=200)
        if term.score_key is not None:
            keys = split_score_key(term.score_key)
        elif term.name in scores:
            keys = [term.name]
        elif len(scores) == 1:
            keys = list(scores)
        else:
            raise RemoteRewardBadReply(
                f"reward {term.name!r} from {url} returned several score keys {sorted(scores)}: choose with "
                f"score_key in its [[remote_reward.rewards]] table (keys may be summed, e.g. 'a+b')",
                url=url, status=200,
            )
        total = np.zeros(batch_size, dtype=np.float64)
        for key in keys:
            if key not in scores:
                raise RemoteRewardBadReply(
                    f"reward {term.name!r} from {url} has no score key {key!r}; keys in the reply: {sorted(scores)}",
                    url=url, status=200,
                )
            try:
                values = np.asarray(scores[key], dtype=np.float64)
            except (TypeError, ValueError) as exc:
                raise RemoteRewardBadReply(
                    f"reward {term.name!r} score key {key!r} from {url} is not numeric: {str(scores[key])[:200]}",
                    url=url, status=200,
                ) from exc
            if values.shape != (batch_size,):
                raise RemoteRewardBadReply(
                    f"reward {term.name!r} score key {key!r} from {url} has shape {list(values.shape)}, expected "
                    f"one score per item [{batch_size}]", url=url, status=200,
                )
            bad = np.flatnonzero(~np.isfinite(values))
            if bad.size:
                raise RemoteRewardBadReply(
                    f"reward {term.name!r} score key {key!r} from {url} has non-finite scores at items "
                    f"{bad[:8].tolist()} ({values[bad[:8]].tolist()}); the service must send -1.0 for items it "
                    f"could not score", url=url, status=200,
                )
            total += values
        return total.astype(np.float32)

    async def collect(self, job: RewardJob, *, session: Any = None) -> RemoteRewardResult:
        """Poll every reward of ``job`` until ready (concurrently) and combine the scores."""
        if session is None:
            async with self._session() as own:
                return await self.collect(job, session=own)
        tasks = [asyncio.ensure_future(self._fetch_one(session, job, name)) for name in job.reward_names]
        try:
            replies = await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        by_name = dict(zip(job.reward_names, replies))
        per_reward: dict[str, np.ndarray] = {}
        total = np.zeros(job.batch_size, dtype=np.float64)
        for term in self.terms:
            score = self._scores(term, by_name[term.name], job.batch_size)
            per_reward[term.name] = score
            clipped = score.astype(np.float64)
            if term.clip is not None:
                clipped = np.clip(clipped, term.clip[0], term.clip[1])
            total += term.weight * clipped
        return RemoteRewardResult(
            total=(self.config.scale * total).astype(np.float32),
            per_reward=per_reward,
            replies=by_name,
            uuid=job.uuid,
        )

    async def score(
        self,
        prompts: list[str],
        media: np.ndarray,
        media_type: str,
        video_fps: float | None = None,
        *,
        extra: dict[str, Any] | None = None,
    ) -> RemoteRewardResult:
        """Enqueue one batch and wait for its scores. Arguments as :meth:`enqueue`.

        Returns:
            :class:`RemoteRewardResult` with ``total`` [B] float32 and ``per_reward`` {name: [B]}.
        """
        async with self._session() as session:
            job = await self.enqueue(prompts, media, media_type, video_fps, extra=extra, session=session)
            return await self.collect(job, session=session)

    def score_sync(
        self,
        prompts: list[str],
        media: np.ndarray,
        media_type: str,
        video_fps: float | None = None,
        *,
        extra: dict[str, Any] | None = None,
    ) -> RemoteRewardResult:
        """:meth:`score` for code that is not ``async`` (blocks until the scores are in)."""
        return run_sync(self.score(prompts, media, media_type, video_fps, extra=extra))


def reward_client(remote: RemoteRewardConfig, *, start_server: bool = False,
                  stack: contextlib.ExitStack | None = None) -> RemoteRewardClient:
    """The client of ``[remote_reward]``; with ``start_server`` (``[wfm] start_reward_server``) the
    reference reward server runs on loopback until ``stack`` closes, with the token of
    ``$<token_env>`` (or a local one)."""
    if not start_server:
        return RemoteRewardClient(remote)
    if stack is None:
        raise ValueError("reward_client(start_server=True) needs stack: the server stops when it closes")
    from cosmos_primitives.rewards.server import RewardServer

    token = os.environ.get(remote.token_env) or "wfm-rl-local"
    server = stack.enter_context(RewardServer(host="127.0.0.1", port=0, token=token))
    return RemoteRewardClient(remote, enqueue_url=server.enqueue_url, fetch_url=server.fetch_url, token=token)


__all__ = [
    "RemoteRewardClient",
    "RemoteRewardError",
    "RemoteRewardResult",
    "RewardJob",
    "reward_client",
]
