"""A thread-safe in-process rollout queue with the interface of :class:`RedisRolloutQueue`."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from threading import Condition

from cosmos_primitives.queue.base import wait_for_weight_version
from cosmos_primitives.queue.errors import QueueFullError
from cosmos_primitives.queue.record import RolloutRecord


class InMemoryRolloutQueue:
    """Rollout queue for one process (rollout and trainer in threads, or colocated loops).

    Same contract as :class:`~cosmos_primitives.queue.RedisRolloutQueue`: bounded by
    ``max_pending`` records enqueued and not acknowledged (``put`` waits), records delivered in
    enqueue order, a record id acknowledged once is never delivered again (a second copy is
    dropped and counted). Records are kept as objects (no encoding). Ids of acknowledged records
    are remembered for the life of the queue.

    Args:
        max_pending: back-pressure bound (records).
        put_timeout_s: default wait of ``put`` at the bound (seconds; None or <= 0: forever).
    """

    def __init__(self, max_pending: int = 256, put_timeout_s: float | None = 600.0) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending is {max_pending}; it must be >= 1 (records)")
        self.max_pending = max_pending
        self.put_timeout_s = put_timeout_s if put_timeout_s and put_timeout_s > 0 else None
        self._cond = Condition()
        self._ready: deque[RolloutRecord] = deque()
        self._delivered: dict[str, int] = {}  # record id -> copies delivered and not acknowledged
        self._done: set[str] = set()
        self.rejected: list[tuple[RolloutRecord, str]] = []  # what reject() set aside, with the reason
        self._version: int | None = None
        self._counts: dict[str, float] = {"put": 0, "put_wait_s": 0.0, "delivered": 0, "acked": 0,
                                          "duplicates_skipped": 0, "double_acked": 0, "malformed": 0,
                                          "dropped_stale": 0}

    def _pending_locked(self) -> int:
        return len(self._ready) + sum(self._delivered.values())

    def put(self, record: RolloutRecord, timeout: float | None = None) -> None:
        self.put_many([record], timeout)

    def put_many(self, records: Sequence[RolloutRecord], timeout: float | None = None) -> None:
        """Enqueue ``records`` in order, waiting while ``max_pending`` records are unacknowledged.

        Raises:
            QueueFullError: no room within ``timeout`` seconds (0: do not wait; default
                ``put_timeout_s``, None there meaning forever); the records before the one that did not
                fit were enqueued.
        """
        if timeout is None:
            timeout = self.put_timeout_s
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            for i, record in enumerate(records):
                while self._pending_locked() >= self.max_pending:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise QueueFullError(
                            f"in-memory rollout queue held {self.max_pending} unacknowledged records (max_pending) "
                            f"for {timeout}s; {i} of {len(records)} records were enqueued. Is the trainer "
                            "consuming and calling ack()?"
                        )
                    started = time.monotonic()
                    self._cond.wait(remaining)
                    self._counts["put_wait_s"] += time.monotonic() - started
                self._ready.append(record)
                self._counts["put"] += 1
                self._cond.notify_all()

    def get(self, n: int, timeout: float | None = None) -> list[RolloutRecord]:
        """Up to ``n`` records in enqueue order; waits up to ``timeout`` s for ``n`` (None: until ``n``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        out: list[RolloutRecord] = []
        with self._cond:
            while True:
                while self._ready and len(out) < n:
                    record = self._ready.popleft()
                    rid = record.record_id
                    if rid in self._done:
                        self._counts["duplicates_skipped"] += 1
                        self._cond.notify_all()
                        continue
                    if rid in self._delivered:  # a second copy while the first is still being trained on
                        self._delivered[rid] += 1
                        self._counts["duplicates_skipped"] += 1
                        continue
                    self._delivered[rid] = 1
                    out.append(record)
                remaining = None if deadline is None else deadline - time.monotonic()
                if len(out) >= n or (remaining is not None and remaining <= 0):
                    break
                self._cond.wait(remaining)
        self._counts["delivered"] += len(out)
        return out

    def ack(self, records: Sequence[RolloutRecord], *, dropped: bool = False) -> int:
        """Mark delivered records consumed; their ids are never delivered again (``dropped``: not trained,
        counted as ``queue/dropped_stale``).

        Raises:
            ValueError: a record that this queue did not deliver, or that was already acknowledged
                (nothing is acknowledged then).
        """
        with self._cond:
            unknown = [r.record_id for r in records if r.record_id not in self._delivered]
            if unknown:
                raise ValueError(
                    f"cannot acknowledge records {unknown[:5]}: they were not delivered by this queue's get() "
                    "or were acknowledged already"
                )
            acked = 0
            for record in records:
                rid = record.record_id
                if self._delivered.pop(rid, None) is None:
                    continue  # the same record twice in one ack call
                if rid in self._done:
                    self._counts["double_acked"] += 1
                self._done.add(rid)
                acked += 1
            self._counts["acked"] += acked
            self._counts["dropped_stale"] += acked if dropped else 0
            self._cond.notify_all()
        return acked

    def reject(self, records: Sequence[RolloutRecord], reason: str) -> int:
        """Set delivered records aside in :attr:`rejected` with ``reason``; their ids are never delivered again.

        Raises:
            ValueError: a record that this queue did not deliver, or that was acknowledged already.
        """
        with self._cond:
            unknown = [r.record_id for r in records if r.record_id not in self._delivered]
            if unknown:
                raise ValueError(f"cannot reject records {unknown[:5]}: they were not delivered by this queue's "
                                 "get() or were acknowledged already")
            for record in records:
                if self._delivered.pop(record.record_id, None) is not None:
                    self._done.add(record.record_id)
                    self.rejected.append((record, reason))
                    self._counts["malformed"] += 1
            self._cond.notify_all()
        return len(records)

    def pending(self) -> int:
        with self._cond:
            return self._pending_locked()

    def publish_weight_version(self, version: int) -> None:
        with self._cond:
            self._version = int(version)

    def weight_version(self) -> int | None:
        with self._cond:
            return self._version

    def wait_for_weight_version(self, min_version: int, timeout: float | None = None) -> int:
        """Block until the published version is ``>= min_version``; see :func:`wait_for_weight_version`."""
        return wait_for_weight_version(self, min_version, timeout)

    def metrics(self) -> dict[str, float]:
        with self._cond:
            return {f"queue/{k}": float(v) for k, v in self._counts.items()}

    def close(self) -> None:
        """Nothing to release; present for interface parity."""

    def __enter__(self) -> InMemoryRolloutQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
