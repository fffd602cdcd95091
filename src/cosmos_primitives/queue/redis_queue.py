"""The rollout queue between processes: Redis Streams with a consumer group.

Keys (``S`` = ``[redis] stream``): ``S`` holds one entry per record (field ``record``: msgpack);
``S:done`` the ids of trained records; ``S:owners`` which entry carries each record id being
trained (then which consumer acknowledged it); ``S:dead`` rejected entries (with their reason);
``S:stats`` group-wide counters; ``S:trained_step`` the trainer step that trained each id (when the
trainer gives it, so that a resume can roll trained ids back); ``S:weight_version`` the trainer's current
weight version;
``S:producers`` a hash of each rollout worker's resume state.

Life of a record: ``put`` appends it (a Lua script refuses while ``S`` holds ``max_pending``
entries, so producers wait instead of trimming); ``get`` reads it with XREADGROUP (or takes it
over with XAUTOCLAIM from a consumer that stopped renewing it for ``claim_idle_s``), validates it
(:func:`~cosmos_primitives.queue.record.decode_record`; a bad entry goes to ``S:dead``) and takes
it by record id in one script (``S:owners``): a copy whose id was trained already, or whose id
another live entry carries, is acknowledged and deleted instead of delivered, for every consumer
of the group at once. ``ack`` adds the id to ``S:done`` and XACKs + XDELs its entry in one
script. So a record is trained once however often it was put, and a consumer that dies before
``ack`` hands its records to another consumer, which trains them (the dead one's training died
with it).

Persistence: the no-loss promise needs a server that keeps what it acknowledged: AOF
(``appendonly yes``) with ``appendfsync always``, and ``maxmemory-policy noeviction`` (an evicted
stream key loses records silently). With ``everysec`` a killed redis-server process loses nothing
it acknowledged (its writes reached the kernel), but a crash of its machine loses up to the last
~2 s of puts and acks: lost acks are retrained once, lost puts are gone unless the producer
re-sends them with the same ids. :class:`RedisServer` starts a server with ``always``.
Without persistence a restart loses everything: the clients reconnect, recreate the group and
republish the weight version, and carry on with the records put after the restart.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from cosmos_primitives.config.redis import RedisConfig
from cosmos_primitives.config.secrets import redact_url
from cosmos_primitives.queue import redis_scripts
from cosmos_primitives.queue.base import wait_for_weight_version
from cosmos_primitives.queue.errors import MalformedRecordError, QueueConnectionError, QueueFullError
from cosmos_primitives.queue.record import RolloutRecord, decode_record, encode_record
from cosmos_primitives.sync.run_auth import AuthError, RateLimitedLog, RunSecret

REDIS_URL_ENV = "COSMOS_REDIS_URL"
RECORD_FIELD = b"record"
# a signed payload: this prefix, HMAC-SHA256(secret, purpose | stream | record bytes), the record bytes
SEALED_RECORD_PREFIX = b"cp-sealed-record-v1:"
# records per script call, keeping one Redis command's arguments to a few MB
_CHUNK = 64

log = logging.getLogger("cosmos.queue")
T = TypeVar("T")


def resolve_redis_url(url: str | None = None, config: RedisConfig | None = None) -> str:
    """The Redis URL: ``url`` if given, else ``[redis] url``, else ``$COSMOS_REDIS_URL``.

    Raises:
        ValueError: none of them is set, or the URL is not ``redis://``, ``rediss://`` or ``unix://``.
    """
    resolved = url or (config.url if config is not None else "") or os.environ.get(REDIS_URL_ENV, "")
    if not resolved:
        raise ValueError(
            f"no Redis URL for the rollout queue: set [redis] url = \"redis://host:6379/0\" in the config "
            f"or the {REDIS_URL_ENV} environment variable"
        )
    if urlsplit(resolved).scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"Redis URL {redact_url(resolved)!r} must start with redis://, rediss:// or unix://")
    return resolved


def _check_config(cfg: RedisConfig) -> None:
    problems = []
    if cfg.max_pending < 1:
        problems.append(f"max_pending = {cfg.max_pending} must be >= 1 (records)")
    if cfg.block_s <= 0:
        problems.append(f"block_s = {cfg.block_s} must be > 0 (seconds)")
    if cfg.socket_timeout_s <= cfg.block_s:
        problems.append(f"socket_timeout_s = {cfg.socket_timeout_s} must exceed block_s = {cfg.block_s}")
    if cfg.claim_idle_s <= 0:
        problems.append(f"claim_idle_s = {cfg.claim_idle_s} must be > 0 (seconds)")
    if cfg.reconnect_timeout_s < 0 or cfg.reconnect_initial_backoff_s <= 0 or cfg.reconnect_max_backoff_s <= 0:
        problems.append("reconnect_timeout_s must be >= 0 and the reconnect back-offs > 0 (seconds)")
    if not cfg.stream or not cfg.group:
        problems.append("stream and group must be non-empty names")
    if problems:
        raise ValueError("invalid [redis] settings for the rollout queue: " + "; ".join(problems))


def _entries(reply: Any) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """Entries of an XREADGROUP reply for one stream (RESP2 list form); [] when it timed out."""
    if not reply:
        return []
    return list(reply[0][1])


class RedisRolloutQueue:
    """Rollout records over Redis Streams, shared by rollout workers (``put``) and trainers (``get`` / ``ack``).

    Every trainer process is one consumer of ``[redis] group``; records are spread over the
    consumers. A consumer renews its delivered-but-unacknowledged entries every ``claim_idle_s / 3``
    from a background thread, so a live consumer keeps its records however long a step takes,
    and the records of a consumer that died (SIGKILL, lost node) are taken over by another consumer
    ``claim_idle_s`` after its last renewal. Lost connections are retried with exponential back-off
    for ``reconnect_timeout_s``, then :class:`QueueConnectionError` names the URL; after a
    reconnect this consumer renews its entries at once and takes over none for ``claim_idle_s``,
    nor while the server has been up for less than ``claim_idle_s`` (entries age while the server
    is away, when nobody can renew them; a consumer that starts after a restart waits too).

    ``put`` and ``get`` / ``ack`` may run in different threads; one object should not ``get`` from
    two threads at once.

    Args:
        config: ``[redis]``; its ``url`` may be empty (then ``url`` or ``$COSMOS_REDIS_URL``).
        url: overrides ``config.url``.
        consumer: this consumer's name in the group; default ``<host>-<pid>-<6 hex>``.
        vocab_size: the trainer's vocabulary (embedding rows); records holding a token id at or
            above it are dead-lettered at :meth:`get`. None: only negative ids are refused.
        max_tokens: the trainer's sequence length (``[policy] model_max_length``); records with a
            prompt + completion longer than it are dead-lettered at :meth:`get`. None: no bound.
        max_bytes: entries whose payload is larger are dead-lettered at :meth:`get` without being
            decoded (:func:`~cosmos_primitives.queue.record.record_byte_limit`). None: no bound.
        secret: the run secret (:class:`~cosmos_primitives.sync.run_auth.RunSecret`). Given, every
            record :meth:`put` writes is sealed (``RunSecret.seal``: encrypted with a SHAKE-256
            keystream of a fresh nonce, then ``HMAC-SHA256(secret, "rollout-record" | stream | nonce |
            ciphertext)``), so a holder of the Redis URL can neither read nor forge one, and
            :meth:`get` dead-letters an entry without a valid seal (written by someone holding the
            Redis URL but not the secret, or moved from another run's stream) before decoding it.
            None: records are written in the clear and unsigned; a sealed one is dead-lettered.
    """

    def __init__(self, config: RedisConfig | None = None, *, url: str | None = None,
                 consumer: str | None = None, vocab_size: int | None = None, max_tokens: int | None = None,
                 max_bytes: int | None = None, secret: RunSecret | None = None) -> None:
        self.config = config or RedisConfig()
        self._secret = secret
        self._unsigned_log = RateLimitedLog(log)
        self._last_signed_version: int | None = None
        _check_config(self.config)
        self.url = resolve_redis_url(url, self.config)
        self.safe_url = redact_url(self.url)
        self.stream = self.config.stream
        self.group = self.config.group
        self.vocab_size = vocab_size
        self.max_tokens = max_tokens
        self.max_bytes = max_bytes
        self.done_key = f"{self.stream}:done"
        self.owners_key = f"{self.stream}:owners"
        self.stats_key = f"{self.stream}:stats"
        self.dead_key = f"{self.stream}:dead"
        self.steps_key = f"{self.stream}:trained_step"
        self.version_key = f"{self.stream}:weight_version"
        self.producers_key = f"{self.stream}:producers"
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._redis = redis.Redis.from_url(
            self.url,
            protocol=2,
            retry=Retry(NoBackoff(), 0),  # this class retries with its own bound and back-off
            socket_timeout=self.config.socket_timeout_s,
            socket_connect_timeout=min(5.0, self.config.socket_timeout_s),
            redis_connect_func=self._on_connect,
        )
        self._put_script = self._redis.register_script(redis_scripts.BOUNDED_PUT)
        self._accept_script = self._redis.register_script(redis_scripts.ACCEPT)
        self._ack_script = self._redis.register_script(redis_scripts.ACK_TRAINED)
        self._dead_script = self._redis.register_script(redis_scripts.DEAD_LETTER)
        self._renew_script = self._redis.register_script(redis_scripts.RENEW)
        self._return_script = self._redis.register_script(redis_scripts.RETURN)
        self._untrain_script = self._redis.register_script(redis_scripts.UNTRAIN)
        self._lock = threading.Lock()
        self._reconnected = threading.Event()
        self._outstanding: dict[str, list[str]] = {}  # record id -> its entry delivered here, not acked
        self._lost: set[str] = set()  # entry ids another consumer took over
        self._group_ready = False
        self._claim_cursor = "0-0"
        self._last_claim_scan = -float("inf")
        self._claim_not_before = -float("inf")
        self._published_version: int | None = None
        self._renewer: threading.Thread | None = None
        self._stop = threading.Event()
        self.rejected: deque[MalformedRecordError] = deque(maxlen=100)
        self._counts = dict.fromkeys(
            ("put", "put_wait_s", "delivered", "acked", "dropped_stale", "redelivered", "duplicates_skipped",
             "double_acked", "malformed", "reconnects", "groups_recreated", "lost_claims"), 0)

    # -- connection handling -------------------------------------------------------------------

    def _on_connect(self, connection: redis.connection.AbstractConnection) -> None:
        # redis-py re-opens a pooled connection that the server closed without raising, so a server
        # restart is noticed here: a connection object that connects for the second time.
        connection.on_connect()
        if getattr(connection, "_cp_connected_before", False):
            self._reconnected.set()
        connection._cp_connected_before = True

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Run one Redis operation, reconnecting with back-off and recreating a vanished group."""
        cfg = self.config
        first_failure: float | None = None
        delay = cfg.reconnect_initial_backoff_s
        attempts = 0
        recreated = False
        while True:
            try:
                result = fn()
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                now = time.monotonic()
                if first_failure is None:
                    first_failure = now
                    log.warning("lost connection to Redis at %s during %s (%s); retrying for up to %ss",
                                self.safe_url, what, exc, cfg.reconnect_timeout_s)
                attempts += 1
                elapsed = now - first_failure
                if elapsed >= cfg.reconnect_timeout_s:
                    raise QueueConnectionError(
                        f"Redis at {self.safe_url} unreachable during {what} for {elapsed:.1f}s ({attempts} attempts; "
                        f"last error: {exc}); gave up after [redis] reconnect_timeout_s = {cfg.reconnect_timeout_s}. "
                        f"Check that redis-server runs at that address ([redis] url or ${REDIS_URL_ENV})."
                    ) from exc
                time.sleep(min(delay, cfg.reconnect_timeout_s - elapsed))
                delay = min(2 * delay, cfg.reconnect_max_backoff_s)
                continue
            except redis.exceptions.ResponseError as exc:
                if "NOGROUP" in str(exc) and not recreated:
                    recreated = True
                    self._create_group(recreating=self._group_ready)
                    continue
                raise
            if first_failure is not None:
                log.warning("reconnected to Redis at %s after %.1fs", self.safe_url, time.monotonic() - first_failure)
            if self._reconnected.is_set():
                self._reconnected.clear()
                self._counts["reconnects"] += 1
                self._after_reconnect()
            return result

    def _after_reconnect(self) -> None:
        # Pending entries kept ageing while the server was away, and no live consumer could renew
        # them: take none over for claim_idle_s, the time every live consumer gets to renew its own
        # (this one at once), so that an outage longer than claim_idle_s does not hand records that
        # are still being trained to a second trainer.
        self._claim_not_before = time.monotonic() + self.config.claim_idle_s
        self.renew()
        # A server restarted without persistence forgot the weight version; put back the one this
        # process published (NX: a persisted or newer value wins).
        if self._published_version is not None:
            self._call("republish weight version",
                       lambda: self._redis.set(self.version_key, self._version_value(self._published_version), nx=True))

    def _create_group(self, recreating: bool = False) -> None:
        # Starting at id 0 hands the group every record already in the stream, including those put
        # before the first trainer started or between a server restart and this call.
        try:
            self._call("XGROUP CREATE", lambda: self._redis.xgroup_create(self.stream, self.group, id="0",
                                                                          mkstream=True))
            if recreating:
                self._counts["groups_recreated"] += 1
                log.warning("consumer group %r of stream %r at %s was gone (server restarted without "
                            "persistence?); recreated it", self.group, self.stream, self.safe_url)
        except redis.exceptions.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    # -- producer side -------------------------------------------------------------------------

    def put(self, record: RolloutRecord, timeout: float | None = None) -> None:
        """Enqueue one record; see :meth:`put_many`."""
        self.put_many([record], timeout)

    def put_many(self, records: Sequence[RolloutRecord], timeout: float | None = None) -> None:
        """Enqueue ``records`` in order, waiting while the stream holds ``max_pending`` unacknowledged records.

        Args:
            timeout: seconds to wait for room (0: do not wait); default ``[redis] put_timeout_s``, where
                a value <= 0 means forever.

        Raises:
            QueueFullError: no room within ``timeout``; the records before the first that did not fit
                were enqueued.
            QueueConnectionError: Redis unreachable past ``reconnect_timeout_s``.
        """
        payloads = [self._signed(encode_record(r)) for r in records]
        if timeout is None and self.config.put_timeout_s > 0:
            timeout = self.config.put_timeout_s
        deadline = None if timeout is None else time.monotonic() + timeout
        done = 0
        delay = 0.002
        while done < len(payloads):
            chunk = payloads[done:done + _CHUNK]
            added = int(self._call("put", lambda chunk=chunk: self._put_script(
                keys=[self.stream], args=[self.config.max_pending, *chunk])))
            done += added
            self._counts["put"] += added
            if added:
                delay = 0.002
                continue
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise QueueFullError(
                    f"rollout stream {self.stream!r} at {self.safe_url} held [redis] max_pending = "
                    f"{self.config.max_pending} unacknowledged records for {timeout}s; {done} of {len(payloads)} "
                    f"records were enqueued. Is a trainer consuming group {self.group!r} and calling ack()?"
                )
            pause = delay if deadline is None else min(delay, deadline - now)
            time.sleep(pause)
            self._counts["put_wait_s"] += pause
            delay = min(2 * delay, 0.1)

    # -- consumer side -------------------------------------------------------------------------

    def get(self, n: int, timeout: float | None = None) -> list[RolloutRecord]:
        """Up to ``n`` records, oldest first: first those taken over from dead consumers, then new ones.

        Waits until ``n`` records arrived or ``timeout`` seconds passed (None: until ``n``; 0: no
        waiting). Malformed entries are moved to ``<stream>:dead``, counted, logged and kept in
        :attr:`rejected`; records already trained on are acknowledged and skipped.
        """
        if n < 1:
            raise ValueError(f"get(n={n}): n must be >= 1")
        if not self._group_ready:
            self._create_group()
        self._start_renewer()
        deadline = None if timeout is None else time.monotonic() + timeout
        out: list[RolloutRecord] = []
        while True:
            out += self._accept(self._claim_stale(n - len(out)), redelivered=True)
            want = n - len(out)
            if want <= 0:
                break
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                block_ms = None
            else:
                block_ms = max(1, int(1000 * min(self.config.block_s, remaining or self.config.block_s)))
            reply = self._call("XREADGROUP", lambda want=want, block_ms=block_ms: self._redis.xreadgroup(
                self.group, self.consumer, {self.stream: ">"}, count=want, block=block_ms))
            out += self._accept(_entries(reply), redelivered=False)
            if len(out) >= n or (deadline is not None and time.monotonic() >= deadline):
                break
        self._counts["delivered"] += len(out)
        return out

    def _claim_stale(self, count: int) -> list[tuple[bytes, dict[bytes, bytes]]]:
        """Entries idle for ``claim_idle_s`` (their consumer stopped renewing them), taken over by this one."""
        now = time.monotonic()
        if count <= 0 or now < self._claim_not_before or (
                self._claim_cursor == "0-0" and now - self._last_claim_scan < self.config.claim_idle_s / 4):
            return []
        # A server that restarted less than claim_idle_s ago holds entries that aged while it was down
        # and whose live consumers may not have renewed them yet; this also notices our own reconnect.
        if self._server_uptime_s() < self.config.claim_idle_s or time.monotonic() < self._claim_not_before:
            return []
        reply = self._call("XAUTOCLAIM", lambda: self._redis.xautoclaim(
            self.stream, self.group, self.consumer, min_idle_time=int(1000 * self.config.claim_idle_s),
            start_id=self._claim_cursor, count=count))
        cursor = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
        self._claim_cursor = cursor
        if cursor == "0-0":
            self._last_claim_scan = now
        return [(eid, fields) for eid, fields in reply[1] if fields]

    def _server_uptime_s(self) -> float:
        try:
            info = self._call("INFO server", lambda: self._redis.info("server"))
        except redis.exceptions.ResponseError:  # INFO refused (a managed server): rely on the reconnect grace
            return float("inf")
        return float(info.get("uptime_in_seconds", float("inf")))

    def _signed(self, payload: bytes) -> bytes:
        """With a secret, the record sealed (encrypted, then MACed) for this stream: readable and valid
        only to a job of this run."""
        if self._secret is None:
            return payload
        return SEALED_RECORD_PREFIX + self._secret.seal(b"rollout-record", self.stream.encode(), payload)

    def _verified(self, payload: bytes, entry_id: str) -> bytes:
        """The record bytes of an entry's payload; with a secret, only when it was sealed with this run's
        secret for this stream."""
        if self._secret is None:
            if payload.startswith(SEALED_RECORD_PREFIX):
                raise MalformedRecordError(entry_id, "the record is sealed with a run secret and this queue has "
                                           "none: start every job of the run with the same $COSMOS_RUN_SECRET")
            return payload
        if not payload.startswith(SEALED_RECORD_PREFIX):
            raise MalformedRecordError(entry_id, "the record is not signed with the run secret: a job of this "
                                       "run seals every record it puts (someone holding only the Redis URL wrote "
                                       "it, or a rollout job started without $COSMOS_RUN_SECRET)")
        body = self._secret.unseal(b"rollout-record", self.stream.encode(), payload[len(SEALED_RECORD_PREFIX):])
        if body is None:
            raise MalformedRecordError(entry_id, "the record's signature does not match (another run secret, "
                                       "another run's stream, or altered bytes)")
        return body

    def _accept(self, entries: list[tuple[bytes, dict[bytes, bytes]]], redelivered: bool) -> list[RolloutRecord]:
        decoded: list[tuple[str, RolloutRecord]] = []
        for raw_id, fields in entries:
            entry_id = raw_id.decode()
            payload = fields.get(RECORD_FIELD)
            if payload is None:
                names = sorted(k.decode(errors="replace") for k in fields)
                self._reject(entry_id, fields, MalformedRecordError(
                    entry_id, f"the entry has no 'record' field (its fields: {names})"))
                continue
            try:
                payload = self._verified(payload, entry_id)
                decoded.append((entry_id, decode_record(payload, entry_id, self.vocab_size,
                                                             max_tokens=self.max_tokens, max_bytes=self.max_bytes)))
            except MalformedRecordError as err:
                self._reject(entry_id, fields, err)
        if not decoded:
            return []
        args = [self.group] + [x for entry_id, record in decoded for x in (record.record_id, entry_id)]
        codes = self._call("take records", lambda: self._accept_script(
            keys=[self.stream, self.done_key, self.owners_key], args=args))
        fresh: list[RolloutRecord] = []
        skipped = 0
        with self._lock:
            for (entry_id, record), code in zip(decoded, codes):
                if code != b"new":  # trained already, or another entry of this id is being trained
                    skipped += 1
                    continue
                held = self._outstanding.setdefault(record.record_id, [])
                if entry_id in held:  # taken back from this consumer itself
                    continue
                held.append(entry_id)
                fresh.append(record)
        if skipped:
            self._counts["duplicates_skipped"] += skipped
            log.info("skipped %d delivered copies of records that were trained or are being trained", skipped)
        if redelivered:
            self._counts["redelivered"] += len(fresh)
        return fresh

    def _reject(self, entry_id: str, fields: Mapping[bytes, bytes], err: MalformedRecordError,
                record_id: str = "") -> None:
        self._counts["malformed"] += 1
        self.rejected.append(err)
        log.error("%s; moved it to %r", err, self.dead_key)
        args: list[Any] = [self.group, entry_id, self.config.dead_letter_maxlen, record_id,
                           "entry_id", entry_id, "reason", err.reason, "consumer", self.consumer]
        if record_id:
            args += ["record_id", record_id]
        for key, value in fields.items():
            args += [b"field:" + key, value]
        self._call("dead-letter", lambda: self._dead_script(
            keys=[self.stream, self.dead_key, self.owners_key], args=args))

    def _check_outstanding(self, records: Sequence[RolloutRecord], action: str) -> None:
        """ValueError unless every record was delivered by this consumer and not acknowledged yet
        (caller holds ``self._lock``)."""
        unknown = [r.record_id for r in records if r.record_id not in self._outstanding]
        if unknown:
            raise ValueError(f"cannot {action} records {unknown[:5]} on consumer {self.consumer!r}: they were not "
                             "delivered by this queue's get() or were acknowledged already")

    def reject(self, records: Sequence[RolloutRecord], reason: str) -> int:
        """Move delivered records that cannot be trained on to ``<stream>:dead`` with ``reason``; counted
        as ``queue/malformed`` and kept in :attr:`rejected`. Returns how many were moved.

        For a trainer that finds a record unusable after :meth:`get` (its prompt does not re-encode
        to its token ids, ...): the record leaves the stream instead of being redelivered forever.

        Raises:
            ValueError: a record this consumer did not deliver or acknowledged already.
        """
        with self._lock:
            self._check_outstanding(records, "reject")
            held = {r.record_id: (r, self._outstanding.pop(r.record_id)) for r in records}
        for rid, (record, entry_ids) in held.items():
            for entry_id in entry_ids:
                self._reject(entry_id, {RECORD_FIELD: encode_record(record)},
                             MalformedRecordError(entry_id, f"record {rid}: {reason}"), record_id=rid)
        return len(held)

    def _ack_entries(self, items: Sequence[tuple[str, list[str]]], step: int | None = None,
                     dropped: bool = False) -> list[str]:
        """Mark record ids trained and XACK + XDEL their entries; returns ids that were trained before."""
        already: list[str] = []
        keys = [self.stream, self.done_key, self.owners_key, self.stats_key, self.steps_key]
        for start in range(0, len(items), 8 * _CHUNK):
            args: list[Any] = [self.group, time.time(), self.config.done_retention_s, self.consumer,
                               "" if step is None else int(step), "dropped" if dropped else "trained"]
            for rid, entry_ids in items[start:start + 8 * _CHUNK]:
                args += [rid, len(entry_ids), *entry_ids]
            reply = self._call("ack", lambda args=args: self._ack_script(keys=keys, args=args))
            already += [r.decode() if isinstance(r, bytes) else str(r) for r in reply]
        return already

    def ack(self, records: Sequence[RolloutRecord], *, step: int | None = None, dropped: bool = False) -> int:
        """Mark delivered records as consumed (trained on, or dropped as stale) in one atomic step each.

        Their ids go to ``<stream>:done`` (so no copy of them is delivered again) and their entries
        are acknowledged and deleted, which frees room for producers. Returns how many records were
        acknowledged.

        Args:
            step: the trainer step that trained them, kept in ``<stream>:trained_step`` so that a
                trainer resumed from an older checkpoint can take their training back
                (:meth:`trained_after`, :meth:`untrain`).
            dropped: they were not trained (stale): counted as ``dropped_stale`` in
                :meth:`group_counters`, apart from the trained ones.

        Raises:
            ValueError: a record this consumer did not deliver or acknowledged already (nothing is
                acknowledged then).
        """
        with self._lock:
            self._check_outstanding(records, "acknowledge")
            items = [(rid, list(self._outstanding[rid])) for rid in dict.fromkeys(r.record_id for r in records)]
        already = self._ack_entries(items, step, dropped)
        with self._lock:
            for rid, entry_ids in items:
                self._outstanding.pop(rid, None)
                self._lost.difference_update(entry_ids)
        self._counts["acked"] += len(items)
        self._counts["dropped_stale"] += len(items) if dropped else 0
        if already:
            self._counts["double_acked"] += len(already)
            log.error("records %s had been acknowledged by another consumer already: they were trained twice. "
                      "A consumer stalled for longer than [redis] claim_idle_s = %ss; raise it",
                      already[:5], self.config.claim_idle_s)
        return len(items)

    def return_records(self, records: Sequence[RolloutRecord], counter: str = "returned") -> int:
        """Hand delivered records back unconsumed: their entries are acknowledged and deleted, but their ids
        are not marked trained, so a copy put again (the prompt generated again) is delivered and
        trained. Counted under ``counter`` in :meth:`group_counters`. Returns how many records.

        For records the trainer must not train and whose prompts must not be lost: sampled with weights
        newer than its own (it resumed from an older checkpoint) or older than the staleness bound; the
        caller has their prompts generated again (``PromptClaims.reissue``) before returning them.

        Raises:
            ValueError: a record this consumer did not deliver or acknowledged already.
        """
        with self._lock:
            self._check_outstanding(records, "return")
            items = [(rid, self._outstanding.pop(rid)) for rid in dict.fromkeys(r.record_id for r in records)]
        for start in range(0, len(items), 8 * _CHUNK):
            args: list[Any] = [self.group, counter]
            for rid, entry_ids in items[start:start + 8 * _CHUNK]:
                args += [rid, len(entry_ids), *entry_ids]
            self._call("return records", lambda args=args: self._return_script(
                keys=[self.stream, self.owners_key, self.stats_key], args=args))
        return len(items)

    def trained_after(self, step: int) -> list[str]:
        """The ids acknowledged with a trainer step (``ack(step=...)``) greater than ``step``."""
        raw = self._call("read trained steps", lambda: self._redis.zrangebyscore(self.steps_key, f"({int(step)}",
                                                                                 "+inf"))
        return [r.decode() if isinstance(r, bytes) else str(r) for r in raw]

    def untrain(self, record_ids: Sequence[str]) -> int:
        """Forget that ``record_ids`` were trained (a trainer resumed from a checkpoint older than the step
        that trained them): a copy put again is delivered and trained. Counted as ``rolled_back``.
        Returns how many of them were marked trained."""
        n = 0
        ids = list(record_ids)
        for start in range(0, len(ids), 8 * _CHUNK):
            chunk = ids[start:start + 8 * _CHUNK]
            n += int(self._call("untrain", lambda chunk=chunk: self._untrain_script(
                keys=[self.done_key, self.steps_key, self.owners_key, self.stats_key], args=chunk)))
        return n

    # -- renewal of delivered entries ----------------------------------------------------------

    def _start_renewer(self) -> None:
        if self._renewer is None:
            self._renewer = threading.Thread(target=self._renew_loop, name=f"cp-queue-renew-{self.consumer}",
                                             daemon=True)
            self._renewer.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.config.claim_idle_s / 3):
            self.renew()

    def renew(self) -> int:
        """Reset the idle time of this consumer's delivered, unacknowledged entries; returns how many.

        Runs every ``claim_idle_s / 3`` in a background thread once :meth:`get` was called. Entries
        another consumer took over in the meantime are counted as ``queue/lost_claims``.
        """
        with self._lock:
            ids = [e for held in self._outstanding.values() for e in held if e not in self._lost]
        if not ids:
            return 0
        try:
            reply = self._renew_script(keys=[self.stream], args=[self.group, self.consumer, *ids])
        except redis.exceptions.RedisError as exc:  # the next round retries; get / ack report lasting failures
            log.debug("renewing %d entries failed: %s", len(ids), exc)
            return 0
        lost = [r.decode() if isinstance(r, bytes) else str(r) for r in reply]
        if lost:
            with self._lock:
                self._lost.update(lost)
            self._counts["lost_claims"] += len(lost)
            log.warning("%d delivered records are no longer held by consumer %r (taken over by another consumer "
                        "after claim_idle_s, or the server restarted without persistence)", len(lost), self.consumer)
        return len(ids) - len(lost)

    # -- weight version ------------------------------------------------------------------------

    def publish_weight_version(self, version: int) -> None:
        """Trainer side: store ``version`` under ``<stream>:weight_version`` for rollout workers to read."""
        version = int(version)
        self._call("publish weight version", lambda: self._redis.set(self.version_key, self._version_value(version)))
        self._published_version = version

    def _version_value(self, version: int) -> bytes | int:
        """What is stored under ``version_key``: the version, signed when the queue has the run secret."""
        return version if self._secret is None else self._secret.sign(self.version_key, str(version).encode())

    def weight_version(self) -> int | None:
        """The trainer's last published weight version, None if none was published (since a restart).

        With the run secret, a value not signed with it (written by someone holding only the Redis
        URL) is ignored with a rate-limited warning, and the last signed value read is returned."""
        raw = self._call("read weight version", lambda: self._redis.get(self.version_key))
        if raw is None:
            return None
        if self._secret is not None:
            try:  # lives as long as the run: no age bound
                raw = self._secret.open(self.version_key, raw, max_age_s=None)
            except AuthError as exc:
                self._unsigned_log.warning("version", "ignoring the weight version under %r: not signed with this "
                                           "run's secret (%s)", self.version_key, exc)
                return self._last_signed_version
        try:
            version = int(raw)
        except ValueError as exc:
            raise ValueError(f"Redis key {self.version_key!r} at {self.safe_url} holds {raw!r}, not an integer "
                             "weight version; only publish_weight_version() should write it") from exc
        if self._secret is not None:
            self._last_signed_version = version
        return version

    def wait_for_weight_version(self, min_version: int, timeout: float | None = None) -> int:
        """Block until the published version is ``>= min_version``; see :func:`wait_for_weight_version`."""
        return wait_for_weight_version(self, min_version, timeout)

    # -- producer resume state ------------------------------------------------------------------

    def save_producer_state(self, producer: str, state: Mapping[str, Any]) -> None:
        """Store ``state`` (JSON-serialisable) for ``producer`` in the hash ``<stream>:producers``.

        A rollout worker saves where it is (e.g. its prompt sampler's position) after each put, so
        that a resumed run, which keeps the queued records, goes on from the prompts after them.
        """
        payload = json.dumps(dict(state), sort_keys=True)
        self._call("save producer state", lambda: self._redis.hset(self.producers_key, producer, payload))

    def producer_state(self, producer: str) -> dict[str, Any] | None:
        """What :meth:`save_producer_state` last stored for ``producer``, None if nothing (fresh stream)."""
        raw = self._call("read producer state", lambda: self._redis.hget(self.producers_key, producer))
        if raw is None:
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise ValueError(f"Redis hash {self.producers_key!r} field {producer!r} at {self.safe_url} holds "
                             f"{raw[:80]!r}, not JSON; only save_producer_state() should write it") from exc

    # -- inspection ----------------------------------------------------------------------------

    def pending(self) -> int:
        """Records in the stream: enqueued and not acknowledged (the quantity ``max_pending`` bounds)."""
        return int(self._call("XLEN", lambda: self._redis.xlen(self.stream)))

    def dead_letters(self, count: int = 100) -> list[dict[str, str]]:
        """The newest rejected entries of ``<stream>:dead`` (entry id, reason, consumer), newest first."""
        reply = self._call("XREVRANGE", lambda: self._redis.xrevrange(self.dead_key, count=count))
        out = []
        for _, fields in reply:
            out.append({k.decode(): v.decode(errors="replace") for k, v in fields.items()
                        if k in (b"entry_id", b"reason", b"consumer")})
        return out

    def group_counters(self) -> dict[str, int]:
        """Counters kept in Redis for the whole group (``<stream>:stats``), which outlive any consumer:
        ``double_acked`` (records acknowledged as trained twice), ``dropped_stale`` (acknowledged
        untrained, :meth:`ack` with ``dropped``), the counters of :meth:`return_records` and
        ``rolled_back`` (:meth:`untrain`) when non-zero, and ``dead_letters`` (entries in
        ``<stream>:dead``, up to its ``dead_letter_maxlen`` cap)."""
        raw = self._call("read group counters", lambda: self._redis.hgetall(self.stats_key))
        out = {k.decode(): int(v) for k, v in raw.items()}
        out.setdefault("double_acked", 0)
        out["dead_letters"] = int(self._call("XLEN", lambda: self._redis.xlen(self.dead_key)))
        return out

    def metrics(self) -> dict[str, float]:
        """This process's counters under ``queue/`` (no Redis round trip)."""
        return {f"queue/{k}": float(v) for k, v in self._counts.items()}

    def close(self) -> None:
        """Stop renewing and close the connections. Unacknowledged records go to another consumer later."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=5)
        self._redis.close()

    def __enter__(self) -> RedisRolloutQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
