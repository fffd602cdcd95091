"""The reference server's job table: a bounded set of pending batches and their finished replies."""

from __future__ import annotations

import time
import uuid as uuid_lib
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cosmos_primitives.rewards.server_memory import ByteBudget


@dataclass
class Job:
    """One enqueued batch. Once every reward is computed only ``replies`` (and what names them) is
    kept: ``media``, ``prompts`` and ``video_infos`` are dropped and ``held_bytes`` go back to the budget."""

    uuid: str
    media: np.ndarray | None
    media_type: str
    prompts: list[str] | None
    video_infos: list[dict[str, Any]] | None
    rewards: tuple[str, ...]
    input_info: dict[str, Any]
    held_bytes: int = 0
    replies: dict[str, dict[str, Any]] = field(default_factory=dict)
    finished_at: float | None = None

    @property
    def done(self) -> bool:
        return self.finished_at is not None


class JobTable:
    """Jobs by uuid. Used from the server's event loop thread only (no locking).

    ``max_pending`` bounds the jobs not finished yet (queued or running): :meth:`full` tells the
    server to answer 503 instead of accepting more. A job holds its body's bytes of ``budget`` until
    it finishes. Finished jobs keep only their replies, ``result_ttl_s`` seconds for fetching, then
    are forgotten.
    """

    def __init__(self, max_pending: int, result_ttl_s: float, budget: ByteBudget) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.max_pending = max_pending
        self.budget = budget
        self.result_ttl_s = result_ttl_s
        self._jobs: dict[str, Job] = {}
        self._pending = 0
        # (finish time, uuid) in finishing order, so expiry pops from the left
        self._finished: deque[tuple[float, str]] = deque()

    @property
    def pending(self) -> int:
        return self._pending

    def full(self) -> bool:
        return self._pending >= self.max_pending

    def add(self, media: np.ndarray, media_type: str, prompts: list[str], video_infos: list[dict[str, Any]],
            rewards: tuple[str, ...], input_info: dict[str, Any], held_bytes: int = 0) -> Job:
        self.expire()
        job = Job(
            uuid=str(uuid_lib.uuid4()),
            media=media,
            media_type=media_type,
            prompts=prompts,
            video_infos=video_infos,
            rewards=rewards,
            input_info=input_info,
            held_bytes=held_bytes,
        )
        self._jobs[job.uuid] = job
        self._pending += 1
        return job

    def finish(self, job: Job) -> None:
        if job.done:
            return
        job.finished_at = time.monotonic()
        job.media = job.prompts = job.video_infos = None
        self.budget.release(job.held_bytes)
        job.held_bytes = 0
        self._pending -= 1
        self._finished.append((job.finished_at, job.uuid))

    def get(self, uuid: str) -> Job | None:
        self.expire()
        return self._jobs.get(uuid)

    def expire(self) -> None:
        """Forget finished jobs older than ``result_ttl_s``."""
        cutoff = time.monotonic() - self.result_ttl_s
        while self._finished and self._finished[0][0] < cutoff:
            self._jobs.pop(self._finished.popleft()[1], None)
