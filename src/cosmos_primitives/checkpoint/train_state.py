"""The loop's own state saved beside the weights: step, epoch, weight version, per-rank RNG and sampler.

These values have free-form structure (a sampler's ``state_dict``, a user's ``extra`` dict), while DCP
needs a template of the same structure to load into. So each is stored as one opaque byte string
(``torch.save`` of the object) under a fixed key, and decoded after loading.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import attrs
import torch


@attrs.define
class TrainState:
    """Where the loop was when the checkpoint was taken.

    Attributes:
        step: optimizer steps completed (the checkpoint is ``step_<step>``).
        epoch: epoch counter of the loop.
        weight_version: version of the policy weights (for rollout staleness); defaults to ``step``.
        extra: the caller's own values (JSON-like or tensors), identical on every rank.
        world_size: number of ranks that wrote the checkpoint.
        path: the checkpoint folder it was read from (None before the first save).
    """

    step: int = 0
    epoch: int = 0
    weight_version: int = 0
    extra: dict[str, Any] = attrs.field(factory=dict)
    world_size: int = 1
    path: Path | None = None

    def to_record(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "epoch": self.epoch,
            "weight_version": self.weight_version,
            "extra": self.extra,
            "world_size": self.world_size,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any], path: Path | None) -> TrainState:
        return cls(
            step=int(record["step"]),
            epoch=int(record["epoch"]),
            weight_version=int(record["weight_version"]),
            extra=dict(record.get("extra") or {}),
            world_size=int(record["world_size"]),
            path=path,
        )


def encode(obj: Any) -> bytes:
    """One opaque value for DCP (tensors inside are copied, so later in-place updates do not leak in)."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def decode(blob: bytes) -> Any:
    """Inverse of :func:`encode`.

    Uses pickle: only for checkpoints this library wrote (DCP's own metadata file is a pickle too),
    so resume only from checkpoint folders you trust.
    """
    return torch.load(io.BytesIO(blob), weights_only=False)
