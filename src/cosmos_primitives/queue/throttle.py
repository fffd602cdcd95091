"""Rollout-worker side: wait instead of generating records that would be too stale when trained on.

A record generated now with weights ``generating_version`` lands behind ``queued`` records. If the
trainer consumes ``records_per_step`` records per step and now holds ``trainer_version``, it will
reach the new record at step ``trainer_version + queued // records_per_step``, so its staleness
will be about

    expected = trainer_version + queued // records_per_step - generating_version

A worker that is ahead (the queue holds more than ``allowed_outdated_steps`` steps of records)
waits until the trainer catches up. ``queued`` counts records delivered to the trainer and not
acknowledged yet, which are the ones it is training on; so trainers should publish the new weight
version before acknowledging a step's records, or a worker may slip one stale batch in between.
"""

from __future__ import annotations

import time

from cosmos_primitives.config.grpo import GRPOConfig
from cosmos_primitives.queue.base import RolloutQueue


def expected_staleness(trainer_version: int, queued_records: int, records_per_step: int,
                       generating_version: int) -> int:
    """Staleness (steps) that a record generated now will have when the trainer reaches it."""
    return trainer_version + queued_records // records_per_step - generating_version


class RolloutThrottle:
    """Paces a rollout worker to the trainer through the queue's weight version and depth.

    Args:
        queue: the shared rollout queue (reads ``weight_version()`` and ``pending()``).
        allowed_outdated_steps: the trainer's staleness bound (steps).
        records_per_step: records the trainer consumes per optimizer step (all trainer ranks together).
        on_policy: bound 0, whatever ``allowed_outdated_steps`` says.
        poll_s: seconds between checks while waiting.

    Before the trainer published any version, it is assumed to hold ``generating_version``.
    """

    def __init__(self, queue: RolloutQueue, allowed_outdated_steps: int, records_per_step: int, *,
                 on_policy: bool = False, poll_s: float = 0.05) -> None:
        if records_per_step < 1:
            raise ValueError(f"records_per_step is {records_per_step}; it must be >= 1")
        if allowed_outdated_steps < 0:
            raise ValueError(f"allowed_outdated_steps is {allowed_outdated_steps}; it must be >= 0 (steps)")
        self.queue = queue
        self.max_staleness = 0 if on_policy else allowed_outdated_steps
        self.records_per_step = records_per_step
        self.poll_s = poll_s
        self.waits = 0
        self.wait_s = 0.0

    @classmethod
    def from_config(cls, queue: RolloutQueue, grpo: GRPOConfig, records_per_step: int) -> RolloutThrottle:
        """From ``[grpo] allowed_outdated_steps`` and ``[grpo] on_policy``."""
        return cls(queue, grpo.allowed_outdated_steps, records_per_step, on_policy=grpo.on_policy)

    def trainer_version(self, generating_version: int) -> int:
        """The trainer's published version (``generating_version`` when none was published)."""
        version = self.queue.weight_version()
        return generating_version if version is None else version

    def needs_new_weights(self, generating_version: int) -> bool:
        """True when ``generating_version`` alone is already beyond the bound: waiting cannot help, fetch weights."""
        return self.trainer_version(generating_version) - generating_version > self.max_staleness

    def ahead_by(self, generating_version: int) -> int:
        """How many steps over the bound a record generated now would be (<= 0: go ahead)."""
        queued = self.queue.pending()  # before the version, as in wait()
        trainer = self.trainer_version(generating_version)
        return expected_staleness(trainer, queued, self.records_per_step, generating_version) - self.max_staleness

    def wait(self, generating_version: int, timeout: float | None = None) -> int:
        """Block while a record generated now with ``generating_version`` would exceed the bound.

        Returns the trainer's published version once the worker may generate, or at once when the
        worker's own weights are the problem (:meth:`needs_new_weights`): compare the return value with
        ``generating_version`` and fetch newer weights first.

        Raises:
            TimeoutError: still ahead after ``timeout`` seconds (the trainer stopped consuming?).
        """
        start = time.monotonic()
        waited = False
        try:
            while True:
                # Depth first, version second: a trainer that publishes before it acknowledges can then
                # only make this estimate too high, never too low.
                queued = self.queue.pending()
                trainer = self.trainer_version(generating_version)
                if trainer - generating_version > self.max_staleness:
                    return trainer
                expected = expected_staleness(trainer, queued, self.records_per_step, generating_version)
                if expected <= self.max_staleness:
                    return trainer
                if timeout is not None and time.monotonic() - start >= timeout:
                    raise TimeoutError(
                        f"rollout worker still ahead of the trainer after {timeout}s: {queued} records queued "
                        f"({self.records_per_step} per step), trainer at version {trainer}, worker at "
                        f"{generating_version}, so new records would be {expected} steps stale "
                        f"(bound {self.max_staleness}). Is the trainer consuming?"
                    )
                waited = True
                time.sleep(self.poll_s)
        finally:
            if waited:
                self.waits += 1
                self.wait_s += time.monotonic() - start

    def metrics(self) -> dict[str, float]:
        """``throttle/waits`` (calls that had to wait) and ``throttle/wait_s`` (seconds waited), run totals."""
        return {"throttle/waits": float(self.waits), "throttle/wait_s": self.wait_s}
