"""Errors of the rollout queue."""

from __future__ import annotations


class QueueError(Exception):
    """Base class of the rollout-queue errors."""


class MalformedRecordError(QueueError, ValueError):
    """A queue entry that is not a valid rollout record.

    ``entry_id`` is the stream entry id (or ``"<memory>"`` / ``"<bytes>"`` outside a stream) and
    ``reason`` says what is wrong with it.
    """

    def __init__(self, entry_id: str, reason: str) -> None:
        self.entry_id = entry_id
        self.reason = reason
        super().__init__(f"malformed rollout record in queue entry {entry_id}: {reason}")


class QueueFullError(QueueError, TimeoutError):
    """``put`` waited ``timeout`` seconds at the back-pressure bound and nobody made room."""


class QueueConnectionError(QueueError, ConnectionError):
    """The Redis server stayed unreachable for longer than the configured reconnect bound."""
