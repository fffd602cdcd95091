"""The interface every rollout queue offers (Redis Streams and in-memory), and waiting on a weight version."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from cosmos_primitives.queue.record import RolloutRecord


@runtime_checkable
class RolloutQueue(Protocol):
    """What rollout workers (producers) and trainers (consumers) call.

    Delivery contract: ``put`` is at-least-once (a retried put may store a record twice); a
    ``record_id`` is handed to one consumer at a time however many copies were put, and records
    that were acknowledged (or rejected) are never handed out again, so a record is trained on once
    as long as the trainer acknowledges what it trained on (``ack``) before the claim time of the
    queue runs out. Entries that are not valid records never reach the caller: they are set aside
    with their reason and counted (``queue/malformed``).
    """

    def put(self, record: RolloutRecord, timeout: float | None = None) -> None:
        """Enqueue one record; wait (up to ``timeout`` s) while the queue is at its bound."""
        ...

    def put_many(self, records: Sequence[RolloutRecord], timeout: float | None = None) -> None:
        """Enqueue records in order; wait while the queue is at its bound. Raises ``QueueFullError``."""
        ...

    def get(self, n: int, timeout: float | None = None) -> list[RolloutRecord]:
        """Up to ``n`` records in enqueue order, waiting up to ``timeout`` s (None: until ``n`` arrived)."""
        ...

    def ack(self, records: Sequence[RolloutRecord], *, dropped: bool = False) -> int:
        """Mark delivered records as consumed (trained on, or with ``dropped`` not trained: stale, counted
        apart); returns how many were acknowledged."""
        ...

    def reject(self, records: Sequence[RolloutRecord], reason: str) -> int:
        """Set aside delivered records that cannot be trained on (dead-lettered with ``reason``, counted
        as ``queue/malformed``); they are never delivered again. Returns how many."""
        ...

    def pending(self) -> int:
        """Records enqueued and not acknowledged yet (the quantity bounded by back-pressure)."""
        ...

    def publish_weight_version(self, version: int) -> None:
        """Trainer side: announce the weight version the trainer now holds."""
        ...

    def weight_version(self) -> int | None:
        """The last announced weight version, None before the first announcement."""
        ...

    def metrics(self) -> dict[str, float]:
        """Counters under ``queue/`` (malformed, redelivered, duplicates skipped, reconnects, ...)."""
        ...

    def close(self) -> None:
        ...


def wait_for_weight_version(queue: RolloutQueue, min_version: int, timeout: float | None = None,
                            poll_s: float = 0.05) -> int:
    """Block until ``queue.weight_version() >= min_version``; return that version.

    Raises:
        TimeoutError: naming the version waited for and the last one seen, after ``timeout`` s.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        current = queue.weight_version()
        if current is not None and current >= min_version:
            return current
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(
                f"waited {timeout}s for the trainer to publish weight version >= {min_version}; the last "
                f"published version is {current} (is the trainer running and calling publish_weight_version?)"
            )
        time.sleep(poll_s)
