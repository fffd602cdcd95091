"""A background thread that uploads finished folders, retrying each piece with exponential back-off.

The training loop only enqueues (``submit``); a failure past the retries is logged and kept in
``failures`` (``close()`` returns them) and never touches the local files. Targets (S3, the Hub)
split a folder into independently retried units: one file for S3, the whole folder for the Hub.
"""

from __future__ import annotations

import atexit
import queue
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import attrs

from cosmos_primitives.logging.console import get_logger

UploadUnit = tuple[str, Callable[[], None]]  # (description for logs, the action)


class UploadTarget(Protocol):
    """Where folders go. ``plan`` runs on the upload thread and may do I/O (listing files, opening clients)."""

    def describe(self, dest: str) -> str:
        """Human-readable destination, e.g. ``s3://bucket/prefix/run/safetensors/final``."""
        ...

    def plan(self, local_dir: Path, dest: str) -> list[UploadUnit]:
        """The units that together upload ``local_dir`` to ``dest``; each is retried on its own."""
        ...


@attrs.frozen
class UploadFailure:
    """An upload that still failed after every retry. ``local_path`` is intact on disk."""

    destination: str
    local_path: Path
    unit: str
    attempts: int
    error: str


@attrs.frozen
class _Job:
    target: UploadTarget
    local_dir: Path
    dest: str


class Uploader:
    """Runs uploads one after another on a daemon thread.

    Args:
        retries: extra attempts per unit after the first failure.
        backoff_s: wait before the first retry; doubles at each further retry.

    ``close()`` is also registered with ``atexit`` so that a script that forgets it still waits
    for its uploads when the interpreter exits normally.
    """

    def __init__(self, retries: int = 3, backoff_s: float = 2.0) -> None:
        if retries < 0:
            raise ValueError(f"upload retries must be >= 0, got {retries}")
        self.retries = retries
        self.backoff_s = backoff_s
        self.failures: list[UploadFailure] = []
        self.completed: list[str] = []
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._pending: dict[Path, int] = {}
        self._idle = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._log = get_logger("cosmos.upload")
        atexit.register(_close_at_exit, weakref.ref(self))

    def submit(self, target: UploadTarget, local_dir: str | Path, dest: str) -> None:
        """Queue ``local_dir`` for upload to ``dest`` of ``target``; returns at once."""
        if self._closed:
            raise RuntimeError("Uploader.submit() after close(): create a new Uploader")
        local_dir = Path(local_dir)
        with self._idle:  # the training thread and a background checkpoint commit may both submit
            self._pending[local_dir] = self._pending.get(local_dir, 0) + 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="cosmos-upload", daemon=True)
                self._thread.start()
        self._queue.put(_Job(target, local_dir, dest))
        self._log.info("Queued upload of %s to %s", local_dir, target.describe(dest))

    def pending(self) -> set[Path]:
        """Local folders queued or being uploaded (rotation must not delete these yet)."""
        with self._idle:
            return set(self._pending)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the queue is empty; False when ``timeout_s`` passed first."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._idle:
            while self._pending:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True

    def close(self, timeout_s: float | None = None) -> list[UploadFailure]:
        """Wait for queued uploads, stop the thread, and return the failures (also logged)."""
        if self._closed:
            return list(self.failures)
        finished = self.wait(timeout_s)
        self._closed = True
        if self._thread is not None:
            self._queue.put(None)
            if finished:
                self._thread.join()
        if not finished:
            self._log.error("Uploads still running after %.0f s at close: %s", timeout_s or 0.0,
                            ", ".join(str(p) for p in self.pending()))
        if self.failures:
            self._log.error(
                "%d upload(s) failed after %d retries; the local copies are kept:\n%s",
                len(self.failures), self.retries,
                "\n".join(f"  {f.local_path} -> {f.destination}: {f.error}" for f in self.failures),
            )
        return list(self.failures)

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                self._upload(job)
            finally:
                with self._idle:
                    left = self._pending.get(job.local_dir, 1) - 1
                    if left:
                        self._pending[job.local_dir] = left
                    else:
                        self._pending.pop(job.local_dir, None)
                    self._idle.notify_all()

    def _upload(self, job: _Job) -> None:
        destination = job.target.describe(job.dest)
        units = self._attempt(job, destination, "listing files", lambda: job.target.plan(job.local_dir, job.dest))
        if units is None:
            return
        ok = True
        for name, action in units:
            ok = self._attempt(job, destination, name, action) is not None and ok
        if ok:
            self.completed.append(destination)
            self._log.info("Uploaded %s to %s", job.local_dir, destination)

    def _attempt(self, job: _Job, destination: str, unit: str, action: Callable[[], object]) -> object | None:
        """Run ``action`` with retries; its result (None is mapped to True) or None after the last failure."""
        for attempt in range(self.retries + 1):
            try:
                result = action()
                return True if result is None else result
            except Exception as exc:
                if attempt == self.retries:
                    error = f"{type(exc).__name__}: {exc}"
                    failure = UploadFailure(destination, job.local_dir, unit, attempt + 1, error)
                    self.failures.append(failure)
                    self._log.error("Upload of %s (%s) to %s failed after %d attempts: %s; the local copy is kept",
                                    job.local_dir, unit, destination, attempt + 1, failure.error)
                    return None
                delay = self.backoff_s * 2**attempt
                self._log.warning("Upload of %s (%s) to %s failed (attempt %d of %d): %s; retrying in %.1f s",
                                  job.local_dir, unit, destination, attempt + 1, self.retries + 1, exc, delay)
                time.sleep(delay)
        return None


def _close_at_exit(ref: weakref.ReferenceType[Uploader]) -> None:
    uploader = ref()
    if uploader is not None and not uploader._closed:
        uploader.close()
