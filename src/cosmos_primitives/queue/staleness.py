"""Trainer-side staleness filter: drop records sampled with weights too old to train on, and count them.

``staleness = trainer_step - record.weight_version``, where ``trainer_step`` is the weight version
the trainer holds now (the number of optimizer steps taken). A record is trained on when
``0 <= staleness <= allowed_outdated_steps`` (on-policy mode: ``staleness == 0``). Records from a
version newer than the trainer's (a trainer resumed from an older checkpoint) are dropped too and
counted apart.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Sequence

from cosmos_primitives.config.grpo import GRPOConfig
from cosmos_primitives.queue.record import RolloutRecord

log = logging.getLogger("cosmos.queue")


def record_staleness(record: RolloutRecord, trainer_step: int) -> int:
    """``trainer_step - record.weight_version`` (steps)."""
    return trainer_step - record.weight_version


class StalenessFilter:
    """Keep records within the staleness bound, count the rest, and report the staleness distribution.

    Args:
        allowed_outdated_steps: largest staleness trained on (steps, >= 0).
        on_policy: train only on records of the current version (staleness 0), whatever
            ``allowed_outdated_steps`` says.

    :meth:`metrics` returns, for the records seen since its last call: ``staleness/p50``,
    ``staleness/max`` (steps), ``staleness/kept``, ``staleness/dropped`` (too old),
    ``staleness/dropped_ahead`` (newer than the trainer); and ``staleness/dropped_total`` over the run.
    """

    def __init__(self, allowed_outdated_steps: int = 4, on_policy: bool = False) -> None:
        if allowed_outdated_steps < 0:
            raise ValueError(f"allowed_outdated_steps is {allowed_outdated_steps}; it must be >= 0 (steps)")
        self.allowed_outdated_steps = allowed_outdated_steps
        self.on_policy = on_policy
        self.dropped_total = 0
        self.kept_total = 0
        self._window: list[int] = []
        self._kept = 0
        self._dropped = 0
        self._dropped_ahead = 0

    @classmethod
    def from_config(cls, grpo: GRPOConfig) -> StalenessFilter:
        """From ``[grpo] allowed_outdated_steps`` and ``[grpo] on_policy``."""
        return cls(grpo.allowed_outdated_steps, grpo.on_policy)

    @property
    def max_staleness(self) -> int:
        """The largest staleness that is trained on (0 in on-policy mode)."""
        return 0 if self.on_policy else self.allowed_outdated_steps

    def split(self, records: Sequence[RolloutRecord], trainer_step: int) -> tuple[list[RolloutRecord],
                                                                                  list[RolloutRecord]]:
        """``(kept, dropped)``, each in input order. Acknowledge the dropped ones on the queue too."""
        kept: list[RolloutRecord] = []
        dropped: list[RolloutRecord] = []
        ahead = 0
        for record in records:
            s = record_staleness(record, trainer_step)
            self._window.append(s)
            if 0 <= s <= self.max_staleness:
                kept.append(record)
            else:
                dropped.append(record)
                ahead += s < 0
        if ahead:
            log.warning("dropped %d records sampled with weight versions newer than the trainer's step %d "
                        "(was the trainer resumed from an older checkpoint?)", ahead, trainer_step)
        self._kept += len(kept)
        self._dropped += len(dropped) - ahead
        self._dropped_ahead += ahead
        self.kept_total += len(kept)
        self.dropped_total += len(dropped)
        return kept, dropped

    def filter(self, records: Sequence[RolloutRecord], trainer_step: int) -> list[RolloutRecord]:
        """The records to train on at ``trainer_step``; the others are counted as dropped."""
        return self.split(records, trainer_step)[0]

    def metrics(self) -> dict[str, float]:
        """Staleness of the records seen since the last call (then the window restarts); see the class doc."""
        window = self._window
        out = {
            "staleness/kept": float(self._kept),
            "staleness/dropped": float(self._dropped),
            "staleness/dropped_ahead": float(self._dropped_ahead),
            "staleness/dropped_total": float(self.dropped_total),
        }
        if window:
            out["staleness/p50"] = float(statistics.median(window))
            out["staleness/max"] = float(max(window))
        self._window = []
        self._kept = self._dropped = self._dropped_ahead = 0
        return out
