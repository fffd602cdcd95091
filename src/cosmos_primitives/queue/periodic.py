"""A daemon thread that calls a function every few seconds and outlives the function's failures."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("cosmos.queue")


class Periodic:
    """Calls ``fn()`` every ``interval_s`` from a daemon thread until :meth:`stop`.

    An exception from ``fn`` (Redis away past its reconnect bound, a callback raising) is logged as
    a warning naming ``what`` and the next round tries again: a missed heartbeat or renewal must
    never take the job down.
    """

    def __init__(self, what: str, interval_s: float, fn: Callable[[], object]) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval of {what} is {interval_s}; it must be > 0 (seconds)")
        self.what = what
        self.interval_s = float(interval_s)
        self.failures = 0
        self._fn = fn
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"cp-{what}".replace(" ", "-"), daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._fn()
            except Exception as exc:  # the job outlives a missed round
                self.failures += 1
                log.warning("%s failed (%s: %s); trying again in %.1fs", self.what, type(exc).__name__, exc,
                            self.interval_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop after the current round (waits up to ``timeout_s`` for it)."""
        self._stop.set()
        self._thread.join(timeout=timeout_s)
