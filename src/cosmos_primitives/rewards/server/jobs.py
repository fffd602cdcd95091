"""The reference server's job table: a bounded set of pending batches and their finished replies."""

from __future__ import annotations

import json
import time
import uuid as uuid_lib
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cosmos_primitives.logging.console import get_logger
from cosmos_primitives.rewards.server.memory import ByteBudget

RESULT_OVERHEAD_BYTES = 1024
"""Charged per finished batch besides its encoded replies: the job record, its uuid and table entries."""
_EVICTED_REMEMBERED = 65_536


@dataclass
class Job:
    """One enqueued batch. Once every reward is computed only ``replies`` (and what names them) is
    kept, each encoded as the JSON bytes a fetch sends: ``media``, ``prompts``, ``video_infos`` and
    ``input_info`` are dropped, ``held_bytes`` go back to the budget and ``result_bytes`` are taken."""

    uuid: str
    media: np.ndarray | None
    media_type: str
    prompts: list[str] | None
    video_infos: list[dict[str, Any]] | None
    rewards: tuple[str, ...]
    input_info: dict[str, Any]
    held_bytes: int = 0
    replies: dict[str, dict[str, Any] | bytes] = field(default_factory=dict)
    result_bytes: int = 0
    finished_at: float | None = None

    @property
    def done(self) -> bool:
        return self.finished_at is not None


class JobTable:
    """Jobs by uuid. Used from the server's event loop thread only (no locking).

    ``max_pending`` bounds the jobs not finished yet (queued or running): :meth:`full` tells the
    server to answer 503 instead of accepting more. A job holds its body's bytes of ``budget`` until
    it finishes. Finished jobs keep only their encoded replies, charged to ``budget`` too, for
    ``result_ttl_s`` seconds, then are forgotten; when the budget is needed for a new body sooner,
    the oldest finished results are evicted first (:meth:`evicted` tells a fetch so).
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
        self._evicted: OrderedDict[str, None] = OrderedDict()
        self.results_bytes = 0
        self.results_evicted = 0
        budget.reclaim = self._evict

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
        job.input_info = {}
        self.budget.release(job.held_bytes)
        job.held_bytes = 0
        self._pending -= 1
        job.replies = {name: json.dumps(reply).encode() if isinstance(reply, dict) else reply
                       for name, reply in job.replies.items()}
        nbytes = RESULT_OVERHEAD_BYTES + sum(len(b) for b in job.replies.values())
        if not self.budget.reserve(nbytes):
            # only when a reply outweighs its own request body and nothing finished is left to evict
            get_logger("cosmos_primitives.rewards").warning(
                "reward server: batch %s's results (%d bytes) go over the memory budget (%d of %d bytes held)",
                job.uuid, nbytes, self.budget.used, self.budget.capacity)
            self.budget.used += nbytes
            self.budget.peak = max(self.budget.peak, self.budget.used)
        job.result_bytes = nbytes
        self.results_bytes += nbytes
        self._finished.append((job.finished_at, job.uuid))

    def _forget(self, uuid: str) -> None:
        job = self._jobs.pop(uuid, None)
        if job is not None:
            self.budget.release(job.result_bytes)
            self.results_bytes -= job.result_bytes
            job.result_bytes = 0

    def _evict(self, nbytes: int) -> None:
        """Forget finished results, oldest first, until ``nbytes`` more fit in the budget (or none is left)."""
        self.expire()
        evicted = 0
        while self._finished and self.budget.used + nbytes > self.budget.capacity:
            uuid = self._finished.popleft()[1]
            self._forget(uuid)
            self._evicted[uuid] = None
            evicted += 1
        while len(self._evicted) > _EVICTED_REMEMBERED:
            self._evicted.popitem(last=False)
        if evicted:
            self.results_evicted += evicted
            get_logger("cosmos_primitives.rewards").warning(
                "reward server: evicted the unfetched results of %d finished batch(es) to fit a new request in the "
                "memory budget (%d bytes); clients should fetch sooner or the server needs a larger max_memory_bytes",
                evicted, self.budget.capacity)

    def evicted(self, uuid: str) -> bool:
        """True when ``uuid``'s results were evicted for room in the memory budget before being fetched."""
        return uuid in self._evicted

    def get(self, uuid: str) -> Job | None:
        self.expire()
        return self._jobs.get(uuid)

    def expire(self) -> None:
        """Forget finished jobs older than ``result_ttl_s``."""
        cutoff = time.monotonic() - self.result_ttl_s
        while self._finished and self._finished[0][0] < cutoff:
            self._forget(self._finished.popleft()[1])
