"""Trainer side of the weight transfer between jobs: publish snapshots, serve them to whoever asks.

The trainer and each rollout job are separate ``torchrun`` jobs, joined only by a Redis URL and
a key prefix. Every trainer rank builds a :class:`WeightServer`; ``publish(version)`` is
collective over them (gathering FSDP2 shards is) and leaves a snapshot on the sending rank (rank
0 of ``process_group``): the weights at that version, cast to the wire dtype and packed into the
buckets of the in-job broadcast. It returns without waiting for any rollout job.

Serving (sending rank, background threads):

- the sender hosts a :class:`~cosmos_primitives.sync.pair_store.PairStoreServer` (``port=0``: a
  free port) listening on ``host`` / ``$COSMOS_TRANSFER_HOST`` / this machine's address only, open
  to holders of the run secret, and keeps ``<prefix>:weights:server`` in Redis (session id,
  address, newest version; signed) alive with a heartbeat (expiry ``max(5 s, 5 * heartbeat_s)``);
- each publish stores the SHA-256 of every bucket, signed, under
  ``<prefix>:weights:digests:<session>:<version>``; members check each bucket before loading it;
- a member's ``fetch()`` sets a presence key in the store (it is connected: *live*) and pushes a
  signed request (member id, nonce, whether it lacks the plan) to
  ``<prefix>:weights:requests:<session>``; a dispatcher thread pops it and drops it unless it is
  signed with the run secret, recent and never seen before;
- a round thread gathers the live requests into a *round* (when every member of the last
  successful rounds has asked, or ``max_members`` have, or ``gather_s`` after the oldest), tells
  each member its rank in the store, and forms one process group of the trainer (rank 0) and the
  round's members (gloo on CPU, NCCL on CUDA) over ``PrefixStore(round/<id>)`` of the store (a
  view of the store's table in this process); the group is a relay chain
  (:class:`~cosmos_primitives.sync.stateless_group.RelayGroup`): each bucket leaves the trainer
  once and every member passes it on to the next, so the trainer's sends per version do not grow
  with the members;
- each round carries the newest snapshot, in the broadcast wire protocol (the plan and a checksum
  round when a member of the round lacks the plan), so a member that fell behind skips the
  versions in between.

Failure semantics: every round operation, formation included, is bounded by ``timeout_s``. A
round that fails (a member died, even mid-transfer, or stalled) ends for all its members, who ask
again; rounds run on threads of their own, so other rounds keep being served. A request whose
member never shows up in the store joins no round and expires after ``timeout_s``. ``publish``
never waits for a member: it waits at most ``timeout_s`` for rounds still reading the snapshot
before the current one (whose buffers it reuses: two snapshots at most, double buffering); past
that it allocates fresh buffers. ``close()`` lets rounds under way end, removes the Redis record
and stops the store (a member still waiting for its round gets an error:
:class:`~cosmos_primitives.sync.transfer_protocol.WeightTransferError`).

Memory on the sender: two snapshots (the model in wire dtype, on the trainer's device) plus one
gathered full parameter at a time during ``publish``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import traceback
import uuid
from collections import OrderedDict
from typing import Any

import msgspec
import redis
import torch
import torch.distributed as dist
from torch import nn

from cosmos_primitives.sync.pair_store import LocalPairStore
from cosmos_primitives.sync.result import SyncResult
from cosmos_primitives.sync.run_auth import AuthError, RateLimitedLog, ReplayGuard, RunSecret
from cosmos_primitives.sync.send_plan import DEFAULT_BUCKET_BYTES, SendPlan
from cosmos_primitives.sync.snapshot import WeightSnapshot, send_snapshot, snapshot_digests, take_snapshot
from cosmos_primitives.sync.stateless_group import drop_group, relay_group, serve_store, transfer_host
from cosmos_primitives.sync.transfer_protocol import (
    ServerRecord,
    SnapshotDigests,
    TransferRequest,
    decode_record,
    digests_key,
    requests_key,
    server_key,
)

log = logging.getLogger(__name__)


class _Waiting(msgspec.Struct):
    """A member's request, waiting for a round (``deadline``: when it is dropped unless its member
    has shown up in the store)."""

    request: TransferRequest
    arrived: float
    deadline: float


def presence_key(member: str, nonce: str) -> str:
    """The store key a member sets before it asks: it is connected and waits (it is live)."""
    return f"present/{member}/{nonce}"


def assignment_key(member: str, nonce: str) -> str:
    """The store key where the trainer tells a member its round: ``b"<round> <rank> <size>"``."""
    return f"assign/{member}/{nonce}"


class WeightServer:
    """Trainer side; construct on every trainer rank.

    Args:
        model: the trainer's model (plain or FSDP2); the plan is built from it on every rank.
        redis_url: the run's Redis.
        prefix: the run's key prefix (e.g. its stream name, ``"cosmos:myrun"``).
        process_group: the trainer ranks (default: the default world, or none when
            ``torch.distributed`` is not initialised); its rank 0 sends.
        layout, family, bucket_bytes, transfer_dtype: as for ``WeightBroadcaster``.
        host: the address members connect to (default ``$COSMOS_TRANSFER_HOST``, else this
            machine's); port: the store's port (0: a free one).
        timeout_s: bound of every round operation (formation included), of a request's wait for
            its member to show up, and of ``publish``'s wait for old transfers.
        heartbeat_s: how often the Redis record is renewed; it expires after 5 of them, at least
            5 s (so a trainer gone without ``close()`` stops being offered after that long).
        gather_s: how long a round waits for more members after the first live request, unless
            it is complete before (every member of the last successful rounds asks, or
            ``max_members`` do).
        backend: ``"gloo"`` (snapshots in CPU memory; the default for a CPU model) or ``"nccl"``
            (snapshots on the GPU; the default for a CUDA model). ``"gloo"`` for a CUDA model
            trades GPU memory and speed for members without GPUs or without NCCL reachability.
        secret: the run secret (default: ``$COSMOS_RUN_SECRET`` / ``$COSMOS_RUN_SECRET_FILE``, see
            :class:`~cosmos_primitives.sync.run_auth.RunSecret`); every member must hold the same one.
        max_members: members in one round, and requests waiting at once; a request from one more
            is dropped (logged at most every 10 s) until one is served or expires.

    Raises:
        RunSecretError: no run secret given or in the environment.
    """

    def __init__(self, model: nn.Module, redis_url: str, prefix: str, *, process_group: Any = None,
                 layout: str = "hf", family: str | None = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 transfer_dtype: torch.dtype | None = None, host: str | None = None, port: int = 0,
                 timeout_s: float = 60.0, heartbeat_s: float = 1.0, gather_s: float = 0.2,
                 backend: str | None = None, secret: RunSecret | str | None = None, max_members: int = 64) -> None:
        if min(timeout_s, heartbeat_s) <= 0 or gather_s < 0:
            raise ValueError(f"timeout_s and heartbeat_s must be > 0 and gather_s >= 0, got {timeout_s}, "
                             f"{heartbeat_s}, {gather_s}")
        if max_members < 1:
            raise ValueError(f"max_members must be >= 1, got {max_members}")
        self._secret = RunSecret.resolve(secret)
        self.max_members = int(max_members)
        self._plan = SendPlan(model, layout=layout, family=family, bucket_bytes=bucket_bytes,
                              transfer_dtype=transfer_dtype)
        on_cuda = self._plan.device.type == "cuda"
        self.backend = backend or ("nccl" if on_cuda else "gloo")
        if self.backend not in ("gloo", "nccl") or (self.backend == "nccl" and not on_cuda):
            raise ValueError(f"backend must be 'gloo' or, for a CUDA model, 'nccl'; got {backend!r} for a "
                             f"{self._plan.device.type} model")
        self._snapshot_device = self._plan.device if self.backend == "nccl" else torch.device("cpu")
        self.prefix = prefix
        self.timeout_s = float(timeout_s)
        self.heartbeat_s = float(heartbeat_s)
        self.gather_s = float(gather_s)
        self.record_ttl_s = max(5.0, 5 * self.heartbeat_s)
        self.rank = dist.get_rank(process_group) if dist.is_available() and dist.is_initialized() else 0
        if self.rank < 0:
            raise ValueError("this rank is not in process_group: build the WeightServer on the trainer ranks only")
        self.is_sender = self.rank == 0
        self.weight_version: int | None = None
        self.session = uuid.uuid4().hex
        self._lock = threading.Condition()
        self._current: WeightSnapshot | None = None
        self._previous: WeightSnapshot | None = None
        self._waiting: OrderedDict[str, _Waiting] = OrderedDict()  # member -> its newest request
        self._in_rounds = 0  # members in rounds being served
        self._known: set[str] = set()  # members whose last round succeeded
        self._lingering: list[tuple[float, Any]] = []  # (drop after, group) of rounds members may still relay in
        self._replays = ReplayGuard()
        self._warn = RateLimitedLog(log)
        self._digests: dict[int, list[str]] = {}
        self._closed = False
        self._stats = {"publish_s": 0.0, "transfers": 0.0, "transfer_failures": 0.0, "transfer_s": 0.0,
                       "bytes_served": 0.0, "serve_s": 0.0, "serve_cpu_s": 0.0, "rounds": 0.0,
                       "publish_waits_timed_out": 0.0, "rejected_requests": 0.0, "members_refused": 0.0}
        self.last_failure: str | None = None
        self._dispatcher: threading.Thread | None = None
        self._former: threading.Thread | None = None
        self._redis: redis.Redis | None = None
        self._store: Any = None
        if self.is_sender:
            self._redis = redis.Redis.from_url(redis_url, socket_timeout=max(10.0, 5 * self.heartbeat_s))
            self.host = transfer_host(host)
            self._store = serve_store(self.host, port, self._secret, max_connections=self.max_members + 16)
            self.port = int(self._store.port)

    # publishing --------------------------------------------------------------------------------

    def publish(self, version: int) -> SyncResult:
        """Snapshot the weights as ``version`` and offer them. Collective over the trainer ranks.

        Returns without waiting for any member (see the module docstring for the one bounded
        wait). ``bytes_moved``: bytes packed into the snapshot (0 off the sender).

        Raises:
            ValueError: ``version`` < 0 or below the last published one.
            RuntimeError: the server was closed.
        """
        if self._closed:
            raise RuntimeError(f"WeightServer for '{self.prefix}' is closed")
        if version < 0 or (self.weight_version is not None and version < self.weight_version):
            raise ValueError(f"weight versions are >= 0 and never go back: got {version} after "
                             f"{self.weight_version}")
        start = time.perf_counter()
        reuse = self._free_buffers() if self.is_sender else None
        snapshot = take_snapshot(self._plan, version, is_src=self.is_sender, device=self._snapshot_device,
                                 reuse=reuse)
        if snapshot is not None:
            try:  # the digests go first: a member checks what it receives against them
                self._write_digests(version, snapshot_digests(snapshot))
            except redis.exceptions.RedisError as exc:  # members reject this version until the next publish
                log.warning("weight server for '%s': could not store the digests of version %d (%s)", self.prefix,
                            version, exc)
            with self._lock:
                self._previous, self._current = self._current, snapshot
            try:
                self._write_record()
            except redis.exceptions.RedisError as exc:  # training goes on; the heartbeat writes it later
                log.warning("weight server for '%s': could not advertise version %d (%s); retrying with the "
                            "heartbeat", self.prefix, version, exc)
            if self._dispatcher is None:
                self._dispatcher = threading.Thread(target=self._dispatch, name="weights-dispatch", daemon=True)
                self._dispatcher.start()
                self._former = threading.Thread(target=self._form_rounds, name="weights-rounds", daemon=True)
                self._former.start()
        self.weight_version = version
        seconds = time.perf_counter() - start
        self._stats["publish_s"] = seconds
        return SyncResult(version=version, seconds=seconds, bytes_moved=snapshot.nbytes if snapshot else 0,
                          num_copied=len(self._plan.target_names),
                          num_buckets=len(self._plan.active_buckets) if snapshot else 0)

    def _free_buffers(self) -> list[torch.Tensor] | None:
        """The previous snapshot's buffers once no transfer reads them (waits at most ``timeout_s``)."""
        with self._lock:
            old = self._previous
            if old is None:
                return None
            if not self._lock.wait_for(lambda: old.users == 0, timeout=self.timeout_s):
                self._stats["publish_waits_timed_out"] += 1
                self._previous = None
                return None
            self._previous = None
            return old.buffers

    def _acquire(self) -> WeightSnapshot:
        with self._lock:
            assert self._current is not None
            self._current.users += 1
            return self._current

    def _release(self, snapshot: WeightSnapshot) -> None:
        with self._lock:
            snapshot.users -= 1
            self._lock.notify_all()

    # serving -----------------------------------------------------------------------------------

    def _record(self) -> bytes:
        assert self.weight_version is not None or self._current is not None
        version = self._current.version if self._current is not None else -1
        return msgspec.json.encode(ServerRecord(
            session=self.session, host=self.host, port=self.port, backend=self.backend,
            version=version, pid=os.getpid(), hostname=socket.gethostname()))

    def _write_record(self) -> None:
        assert self._redis is not None
        signed = self._secret.sign(server_key(self.prefix), self._record())
        self._redis.set(server_key(self.prefix), signed, px=int(1000 * self.record_ttl_s))

    def _write_digests(self, version: int, digests: list[str]) -> None:
        """Sign and store the bucket digests of ``version`` (before the record offers it); drop
        those of the version before the previous one (no transfer sends it any more)."""
        assert self._redis is not None
        key = digests_key(self.prefix, self.session, version)
        body = msgspec.json.encode(SnapshotDigests(version=version, buckets=digests))
        pipe = self._redis.pipeline()
        pipe.set(key, self._secret.sign(key, body), ex=7 * 24 * 3600)
        for old in [v for v in self._digests if v < version][:-1]:
            pipe.delete(digests_key(self.prefix, self.session, old))
            del self._digests[old]
        self._digests[version] = digests
        pipe.execute()

    def _dispatch(self) -> None:
        """Pop requests, queue them for a round; renew the record between them."""
        assert self._redis is not None
        key = requests_key(self.prefix, self.session)
        next_beat = 0.0
        while not self._closed:
            try:
                now = time.monotonic()
                if now >= next_beat:
                    self._write_record()
                    next_beat = now + self.heartbeat_s
                popped = self._redis.blpop([key], timeout=self.heartbeat_s)  # fractional: Redis >= 6
                if popped is None or self._closed:
                    continue
                body = self._secret.open(key, popped[1], guard=self._replays)
                request = msgspec.json.decode(body, type=TransferRequest)
            except redis.exceptions.RedisError as exc:
                self._warn.warning("redis", "weight server for '%s': Redis unreachable (%s); retrying",
                                   self.prefix, exc)
                time.sleep(self.heartbeat_s)
                continue
            except (AuthError, msgspec.DecodeError) as exc:
                self._count("rejected_requests")
                self._warn.warning("reject", "weight server for '%s': dropped a transfer request that failed "
                                   "authentication (%s)", self.prefix, exc)
                continue
            try:
                self._route(request)
            except Exception:  # e.g. no thread could be started: this request is lost, the next one may not be
                self._warn.warning("route", "weight server for '%s': could not serve member '%s' (%s)", self.prefix,
                                   request.member, traceback.format_exc(limit=3))

    def _route(self, request: TransferRequest) -> None:
        with self._lock:
            if self._closed:
                return
            if request.member not in self._waiting and len(self._waiting) >= self.max_members:
                self._stats["members_refused"] += 1
                self._warn.warning("full", "weight server for '%s': refused member '%s': %d requests wait "
                                   "(max_members); they are served or expire within %.0fs", self.prefix,
                                   request.member, self.max_members, self.timeout_s)
                return
            old = self._waiting.pop(request.member, None)
            if old is not None and self._store is not None:  # superseded: that fetch has given up
                self._store.table.delete(presence_key(old.request.member, old.request.nonce))
            now = time.monotonic()
            self._waiting[request.member] = _Waiting(request, now, now + self.timeout_s)

    def _form_rounds(self) -> None:
        """Group the live waiting requests into rounds and start serving each on a thread of its own.

        A request is live once its member has set its presence key in the store (it is connected
        and waiting); one whose member never shows up within ``timeout_s`` is dropped. A round
        starts when ``max_members`` live requests wait, or when every member of the last
        successful rounds is among them, or ``gather_s`` after the oldest of them arrived.
        """
        while not self._closed:
            time.sleep(0.005)
            now = time.monotonic()
            gone: list[_Waiting] = []
            chosen: list[_Waiting] = []
            with self._lock:
                for entry in list(self._waiting.values()):
                    if self._store is not None and self._store.table.check(
                            [presence_key(entry.request.member, entry.request.nonce)]):
                        chosen.append(entry)
                    elif now > entry.deadline:
                        gone.append(self._waiting.pop(entry.request.member))
                members = {e.request.member for e in chosen}
                ready = chosen and self._current is not None and (
                    len(chosen) >= self.max_members or (self._known and self._known <= members)
                    or now - min(e.arrived for e in chosen) >= self.gather_s)
                if ready:
                    chosen = chosen[:self.max_members]
                    for entry in chosen:
                        del self._waiting[entry.request.member]
                    self._in_rounds += len(chosen)
                stale = [g for t, g in self._lingering if t <= now]
                self._lingering = [(t, g) for t, g in self._lingering if t > now]
            for group in stale:
                drop_group(group)
            for entry in gone:
                self._count_failure([entry.request.member], TimeoutError(
                    f"asked for weights and never showed up in the store within {self.timeout_s:.0f}s"))
            if ready:
                try:
                    threading.Thread(target=self._serve_round, args=(chosen,), name="weights-round",
                                     daemon=True).start()
                except Exception:  # e.g. no thread could be started: its members ask again
                    self._end_round(chosen, "")
                    self._warn.warning("round", "weight server for '%s': could not start a round (%s)",
                                       self.prefix, traceback.format_exc(limit=3))

    def _serve_round(self, entries: list[_Waiting]) -> None:
        """Form the relay chain of the trainer and ``entries``' members and send the newest snapshot
        down it: each bucket leaves the trainer once, whatever the number of members."""
        members = [e.request.member for e in entries]
        cpu_start = time.thread_time()
        key = uuid.uuid4().hex
        group = None
        snapshot: WeightSnapshot | None = None
        try:
            if self._snapshot_device.type == "cuda":  # a new thread starts on GPU 0
                torch.cuda.set_device(self._snapshot_device)
            # a view of the server's table in this process: no socket or file descriptor per round,
            # and a blocking read here holds up no other round
            store = LocalPairStore(self._store, self.timeout_s)
            for rank, entry in enumerate(entries, start=1):
                store.set(assignment_key(entry.request.member, entry.request.nonce),
                          f"{key} {rank} {len(entries) + 1}".encode())
            group = relay_group(store, key, 0, len(entries) + 1, device_type=self._snapshot_device.type,
                                timeout_s=self.timeout_s, peer_host=self.host)
            # a member without the plan (its first fetch, or after a failure) gets it, and the
            # checked transfer, with everyone in its round
            fresh = any(e.request.fresh for e in entries)
            snapshot = self._acquire()
            result = send_snapshot(snapshot, self._plan, group, with_plan=fresh, verify=fresh)
            self._release(snapshot)
            snapshot = None
            with self._lock:
                self._stats["rounds"] += 1
                self._stats["transfers"] += len(entries)
                self._stats["transfer_s"] = result.seconds
                self._stats["serve_s"] += result.seconds
                self._stats["bytes_served"] += result.bytes_moved
                self._stats["serve_cpu_s"] += time.thread_time() - cpu_start
                self._known.update(members)
                # the members may still relay what they received: the trainer's side of the chain
                # stays open until they had the time to
                self._lingering.append((time.monotonic() + self.timeout_s, group))
            group = None
        except Exception as exc:  # the round's members ask again (a new round)
            with self._lock:
                self._known.difference_update(members)
            self._count_failure(members, exc)
        finally:
            if snapshot is not None:  # counted as failed before a waiting publish() goes on
                self._release(snapshot)
            drop_group(group)
            self._end_round(entries, key)

    def _end_round(self, entries: list[_Waiting], key: str) -> None:
        with self._lock:
            self._in_rounds -= len(entries)
            self._lock.notify_all()
        if self._store is None:
            return
        table = self._store.table  # keys of a round that ended are never read again
        for entry in entries:
            table.delete(presence_key(entry.request.member, entry.request.nonce))
            table.delete(assignment_key(entry.request.member, entry.request.nonce))
        if key:
            table.delete_prefix(f"round/{key}/")

    def _count(self, what: str) -> None:
        with self._lock:
            self._stats[what] += 1

    def _count_failure(self, members: list[str], exc: BaseException) -> None:
        with self._lock:
            self._stats["transfer_failures"] += 1
            names = ", ".join(f"'{m}'" for m in members)
            self.last_failure = f"member{'s' if len(members) > 1 else ''} {names}: {type(exc).__name__}: {exc}"
        self._warn.warning("round", "weight server for '%s': a transfer round failed for %s", self.prefix,
                           self.last_failure)

    # reporting / shutdown ----------------------------------------------------------------------

    def metrics(self, prefix: str = "sync/") -> dict[str, float]:
        """``sync/publish_s`` (last publish), ``sync/rounds`` (rounds served), ``sync/transfers``
        (members served, summed over rounds), ``sync/transfer_failures`` (failed rounds and requests
        whose member never showed up), ``sync/transfer_s`` (the trainer's send time in the last
        round), ``sync/serve_s`` (its send time, summed), ``sync/serve_cpu_s`` (the CPU time of the
        threads that served the rounds, group set-up included, summed; a transport's own I/O threads,
        gloo's, are not in it: the trainer process's CPU time covers those), ``sync/bytes_served`` (bytes that left the
        trainer: one snapshot per round), ``sync/members`` (waiting or in a round),
        ``sync/published_version``, ``sync/publish_waits_timed_out``, ``sync/rejected_requests``,
        ``sync/members_refused``."""
        with self._lock:
            out = {f"{prefix}{k}": float(v) for k, v in self._stats.items()}
            out[f"{prefix}members"] = float(len(self._waiting) + self._in_rounds)
        out[f"{prefix}published_version"] = float(self.weight_version if self.weight_version is not None else -1)
        return out

    def close(self) -> None:
        """Stop serving: rounds under way end (each within its ``timeout_s``), the Redis record goes,
        the store stops (a member still waiting for its round gets an error)."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            self._waiting.clear()
            self._lock.wait_for(lambda: self._in_rounds == 0, timeout=self.timeout_s)
            lingering, self._lingering = self._lingering, []
        for _, group in lingering:
            drop_group(group)
        for thread in (self._dispatcher, self._former):
            if thread is not None:
                thread.join(timeout=max(2.0, 2 * self.heartbeat_s))
        if self._redis is not None:
            try:
                record = decode_record(self._redis.get(server_key(self.prefix)), self._secret, self.prefix)
                if record is not None and record.session == self.session:
                    self._redis.delete(server_key(self.prefix))
                self._redis.delete(requests_key(self.prefix, self.session),
                                   *(digests_key(self.prefix, self.session, v) for v in self._digests))
            except (AuthError, msgspec.DecodeError):  # not ours: leave it
                pass
            except redis.exceptions.RedisError as exc:
                log.warning("weight server for '%s': could not remove its Redis record (%s)", self.prefix, exc)
            self._redis.close()
        if self._store is not None:
            self._store.close()
        self._store = None
        with self._lock:
            self._current = self._previous = None
