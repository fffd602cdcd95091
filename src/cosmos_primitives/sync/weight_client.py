"""Rollout side of the weight transfer between jobs: fetch the trainer's newest snapshot.

One :class:`WeightClient` per rollout process (a *member*, named by ``member_id``). It finds the
serving trainer through ``<prefix>:weights:server`` in Redis; each ``fetch()`` marks itself live in
the trainer's store, pushes a request, and receives the newest snapshot in the round the trainer
assigns it to: a relay chain of the trainer and the members that asked at about the same time,
where this member passes each bucket on to the next one (see
:mod:`~cosmos_primitives.sync.weight_server` for the protocol and the failure semantics). The
plan arrives, and the transfer is checked bit for bit, on the first fetch and after any failure.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import msgspec
import redis
import torch
from torch import nn

from cosmos_primitives.models.name_maps import NameMapError
from cosmos_primitives.sync.broadcast import WeightReceiver
from cosmos_primitives.sync.checks import WeightMismatchError
from cosmos_primitives.sync.result import SyncResult
from cosmos_primitives.sync.run_auth import AuthError, RateLimitedLog, RunSecret
from cosmos_primitives.sync.snapshot import bucket_digest
from cosmos_primitives.sync.stateless_group import RelayGroup, connect_store, drop_group, relay_group, store_problem
from cosmos_primitives.sync.transfer_protocol import (
    ServerRecord,
    SnapshotDigests,
    TransferRequest,
    WeightTransferError,
    decode_record,
    digests_key,
    requests_key,
    server_key,
)
from cosmos_primitives.sync.weight_server import assignment_key, presence_key

log = logging.getLogger(__name__)


class WeightClient:
    """Rollout side; one per rollout process.

    Args:
        target: the engine's ``nn.Module`` or a ``RolloutEngine`` (as ``WeightReceiver`` takes them).
        redis_url: the run's Redis; prefix: the run's key prefix (the trainer's).
        member_id: this process's name among the members (e.g. ``f"{job}-{rank}"``); a restarted
            process may reuse it.
        engine: the engine whose ``weight_version`` follows a module ``target``.
        timeout_s: bound of every step of a fetch (store connection, waiting for its round,
            forming the round's group, each transfer operation).
        strict: every parameter of a module target must be fed.
        poll_s: how often ``wait_for_server`` looks at Redis.
        read_back: ``name -> tensor`` for the check of a ``RolloutEngine`` target's first transfer
            in each round that carries the plan (as ``WeightReceiver`` takes it).
        secret: the run secret (default: ``$COSMOS_RUN_SECRET`` / ``$COSMOS_RUN_SECRET_FILE``);
            the trainer's. Records, requests and digests are signed with it, and every bucket is
            checked against the trainer's signed SHA-256 before it is loaded.

    Raises:
        RunSecretError: no run secret given or in the environment.
    """

    def __init__(self, target: Any, redis_url: str, prefix: str, *, member_id: str, engine: Any = None,
                 timeout_s: float = 60.0, strict: bool = True, poll_s: float = 0.2,
                 read_back: Callable[[str], torch.Tensor] | None = None,
                 secret: RunSecret | str | None = None) -> None:
        if not isinstance(target, nn.Module) and not callable(getattr(target, "update_weights", None)):
            raise TypeError(f"target must be an nn.Module or a RolloutEngine with update_weights(); "
                            f"got {type(target).__name__}")
        if not member_id:
            raise ValueError("member_id must be a non-empty name for this rollout process")
        self._target, self._engine, self._strict, self._read_back = target, engine, strict, read_back
        self._secret = RunSecret.resolve(secret)
        self._warn = RateLimitedLog(log)
        self._digests: SnapshotDigests | None = None
        self._digests_key = ""
        self.prefix, self.member_id = prefix, member_id
        self.timeout_s, self.poll_s = float(timeout_s), float(poll_s)
        self._redis = redis.Redis.from_url(redis_url, socket_timeout=max(10.0, self.timeout_s))
        self._session: str | None = None
        self._store: Any = None
        self._receiver: WeightReceiver | None = None
        self._version = -1
        self._fetched_session: str | None = None
        self.fetches = 0

    @property
    def weight_version(self) -> int:
        """The version of the last fetched snapshot; -1 before the first and after a transfer that
        broke off part way (the engine may then hold parts of two versions)."""
        return self._version

    @property
    def session(self) -> str | None:
        """The serving session (a trainer's lifetime) of the last fetched snapshot; None before the first.
        With ``weight_version`` it names the weights held: a restarted trainer reuses version numbers."""
        return self._fetched_session

    def _record(self) -> ServerRecord | None:
        try:
            return decode_record(self._redis.get(server_key(self.prefix)), self._secret, self.prefix)
        except AuthError as exc:
            raise WeightTransferError(f"member '{self.member_id}': the weight server record "
                                      f"'{server_key(self.prefix)}' is not signed with this run's secret ({exc}); "
                                      "ignoring it (another run's trainer with the same name, or a forgery)") from exc
        except (redis.exceptions.RedisError, msgspec.DecodeError) as exc:
            raise WeightTransferError(f"member '{self.member_id}' cannot read the weight server record "
                                      f"'{server_key(self.prefix)}': {exc}") from exc

    def published_version(self) -> int | None:
        """The newest version on offer; ``None`` while no trainer serves."""
        record = self._record()
        return None if record is None else record.version

    def wait_for_server(self, timeout_s: float | None = None) -> int:
        """Block until a trainer serves under this prefix (its record is in Redis and its store
        answers); its newest version.

        Raises:
            WeightTransferError: none did within ``timeout_s`` (``None``: wait without bound).
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            try:
                record = self._record()
            except WeightTransferError as exc:
                if not isinstance(exc.__cause__, AuthError):
                    raise
                record = None  # a forged record is no trainer: keep waiting for a real one
                self._warn.warning("record", "%s", exc)
            # a killed trainer's record outlives it for a few seconds: it must also answer
            if record is not None and not store_problem(record.host, record.port, self.timeout_s):
                return record.version
            if deadline is not None and time.monotonic() >= deadline:
                raise WeightTransferError(f"member '{self.member_id}': no trainer serves weights under "
                                          f"'{self.prefix}' after {timeout_s:.0f}s; start the trainer job with "
                                          "the same Redis URL and run name")
            time.sleep(self.poll_s)

    def fetch(self) -> SyncResult:
        """Receive the newest snapshot (versions published since the last fetch are skipped).

        Afterwards ``weight_version`` (and the engine's) is that snapshot's version. When the kept
        store connection turns out to be gone before anything was received, the fetch is tried
        once more over a new one.

        Raises:
            WeightTransferError: no trainer serves, or the transfer failed or timed out (the
                trainer died or closed, or another member of the round did); names the prefix
                and member. The next call asks again. If it failed while receiving, the engine
                may hold a mix of two versions: ``weight_version`` (and the engine's) is then -1
                until a fetch succeeds.
            NameMapError / WeightMismatchError: the engine does not fit the trainer's weights.
        """
        record = self._current_record()
        reused = self._store is not None and self._session == record.session
        try:
            return self._fetch_once(record)
        except WeightTransferError:
            if not reused or (self._version == -1 and self._receiver is None):
                raise
            return self._fetch_once(self._current_record())

    def refresh(self) -> SyncResult | None:
        """``fetch()`` unless this member already holds the version on offer from the trainer
        serving now (``None`` then). A restarted trainer counts as new even at an equal or lower
        version: its weights may come from another checkpoint.

        Raises:
            WeightTransferError / NameMapError / WeightMismatchError: as ``fetch()``.
        """
        record = self._current_record()
        if record.session == self._fetched_session and record.version == self._version:
            return None
        return self.fetch()

    def _current_record(self) -> ServerRecord:
        record = self._record()
        if record is None:
            raise WeightTransferError(f"member '{self.member_id}': no trainer serves weights under '{self.prefix}' "
                                      "(call wait_for_server first, or the trainer has stopped)")
        return record

    def _fetch_once(self, record: ServerRecord) -> SyncResult:
        where = f"member '{self.member_id}' from trainer {record.hostname}:{record.pid} under '{self.prefix}'"
        receiving = False
        group: RelayGroup | None = None
        try:
            if self._store is None or self._session != record.session:
                self._drop()
                self._store = connect_store(record.host, record.port, self.timeout_s, self._secret)
                self._session = record.session
            nonce = uuid.uuid4().hex
            # live first, then ask: the trainer puts only members present in its store in a round
            self._store.set(presence_key(self.member_id, nonce), b"1")
            self._request(record, nonce, fresh=self._receiver is None)
            assigned = assignment_key(self.member_id, nonce)
            self._store.wait([assigned], timedelta(seconds=self.timeout_s + 1.0))
            key, rank, size = self._store.get(assigned).decode().split()
            nccl = record.backend == "nccl"
            group = relay_group(self._store, key, int(rank), int(size), device_type="cuda" if nccl else "cpu",
                                timeout_s=self.timeout_s, peer_host=record.host)
            if self._receiver is None:
                # gloo buckets land in CPU memory and are copied into the engine wherever it lives
                self._receiver = WeightReceiver(self._target, group, engine=self._engine, strict=self._strict,
                                                device=None if nccl else "cpu", read_back=self._read_back,
                                                check_bucket=self._check_bucket)
            else:
                self._receiver.group = group
            receiving = True
            result = self._receiver.sync()
            group.flush()  # what this member passes on down the chain has left before the group goes
        except (NameMapError, WeightMismatchError):
            self._drop()
            if receiving:  # buckets checked before this one were loaded
                self._mark_unknown()
            raise
        except Exception as exc:
            self._drop()
            if receiving:
                self._mark_unknown()
            raise WeightTransferError(f"weight transfer to {where} failed: {type(exc).__name__}: {exc}") from exc
        finally:
            drop_group(group)
        if result is None:
            self._drop()
            raise WeightTransferError(f"weight transfer to {where}: the trainer closed its weight server")
        self._version = result.version
        self._fetched_session = record.session
        self.fetches += 1
        return result

    def _mark_unknown(self) -> None:
        """After a transfer that broke off: some buckets may have been written."""
        self._version = -1
        holder = self._engine if isinstance(self._target, nn.Module) else self._target
        if holder is not None and hasattr(holder, "weight_version"):
            holder.weight_version = -1

    def _check_bucket(self, version: int, bucket: int, data: torch.Tensor) -> None:
        """Raise unless ``data`` is bucket ``bucket`` of ``version`` as the trainer signed it.

        A transfer error, not a mismatch of the engine: the next fetch starts over (a Redis-URL
        holder who deletes the digests can delay members, not crash them or feed them weights).
        """
        key = digests_key(self.prefix, self._session or "", version)
        if self._digests is None or self._digests_key != key:
            self._digests_key = key
            try:
                body = self._secret.open(key, self._redis.get(key) or b"", max_age_s=None)
                self._digests = msgspec.json.decode(body, type=SnapshotDigests)
            except (AuthError, msgspec.DecodeError, redis.exceptions.RedisError) as exc:
                raise WeightTransferError(f"member '{self.member_id}': no valid signed digest of version {version} "
                                          f"at '{key}' ({exc}); nothing of it is loaded") from exc
            if self._digests.version != version:
                raise WeightTransferError(f"member '{self.member_id}': the digests at '{key}' are for version "
                                          f"{self._digests.version}")
        expected = self._digests.buckets[bucket] if bucket < len(self._digests.buckets) else "<none>"
        if bucket_digest(data) != expected:
            raise WeightTransferError(f"member '{self.member_id}': bucket {bucket} of weight version {version} "
                                      "does not match the trainer's signed SHA-256; not loaded (altered in "
                                      "transit, or not sent by the trainer)")

    def _request(self, record: ServerRecord, nonce: str, *, fresh: bool) -> None:
        key = requests_key(self.prefix, record.session)
        request = self._secret.sign(key, msgspec.json.encode(TransferRequest(member=self.member_id, nonce=nonce,
                                                                             fresh=fresh)))
        pipe = self._redis.pipeline()
        pipe.rpush(key, request)
        pipe.expire(key, max(60, int(4 * self.timeout_s)))
        pipe.execute()

    def _drop(self) -> None:
        """Forget the store connection and the receiver (the next fetch gets the plan again)."""
        self._receiver = None
        self._store = None
        self._session = None

    def close(self) -> None:
        """Drop the store connection and the Redis connection."""
        self._drop()
        self._redis.close()
