"""Seeding, capture / restore of every RNG a training loop touches, and seeds derived from keys."""

from __future__ import annotations

import hashlib
import random
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and all CUDA devices)."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def derived_seed(*keys: int | str) -> int:
    """A seed in ``[0, 2**63)`` that depends on ``keys`` alone, e.g. ``(seed, step, rank, "sde_window")``.

    Hash-derived (BLAKE2 of the keys' ``repr``), so neighbouring keys give unrelated streams and the
    same keys give the same seed in every process and run. A loop that draws each step's randomness
    from seeds derived from its step counter replays the same draws after a resume from that step,
    whatever else consumed the global RNGs meanwhile.
    """
    digest = hashlib.blake2b(repr(keys).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def derived_generator(*keys: int | str, device: str | torch.device = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with :func:`derived_seed` of ``keys``."""
    return torch.Generator(device=device).manual_seed(derived_seed(*keys))


def capture_rng_state() -> dict[str, Any]:
    """Snapshot of the python, numpy, torch CPU and CUDA RNG states (picklable, tensors on CPU)."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng_state`."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
