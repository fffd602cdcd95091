"""The reference server's memory budget: bytes of request bodies, pending batches and finished
results not yet expired, counted."""

from __future__ import annotations

from collections.abc import Callable


class ByteBudget:
    """One budget of bytes for everything a client makes the server hold.

    Every request body takes bytes from it while it is being read (its declared ``Content-Length``
    up front, or chunk by chunk when none is declared), and an accepted batch keeps its bytes until
    every reward is computed; then its encoded replies hold their bytes until fetched-or-expired
    (``result_ttl_s``) or evicted. When a reservation would go over ``capacity``, ``reclaim(nbytes)``
    (if set) may free finished results first; a request that still does not fit is refused (503)
    before its bytes are read. Used from the server's event-loop thread only (no locking).
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"the memory budget must be >= 1 byte, got {capacity}")
        self.capacity = capacity
        self.used = 0
        self.peak = 0
        self.reclaim: Callable[[int], None] | None = None

    def reserve(self, nbytes: int) -> bool:
        """Take ``nbytes``; False (nothing taken) when that would exceed the capacity."""
        if nbytes < 0:
            raise ValueError(f"cannot reserve {nbytes} bytes")
        if self.used + nbytes > self.capacity and self.reclaim is not None:
            self.reclaim(nbytes)
        if self.used + nbytes > self.capacity:
            return False
        self.used += nbytes
        self.peak = max(self.peak, self.used)
        return True

    def release(self, nbytes: int) -> None:
        self.used -= nbytes
        if self.used < 0:  # pragma: no cover - a bookkeeping bug, never a client's doing
            raise RuntimeError(f"memory budget released {-self.used} bytes more than it reserved")
