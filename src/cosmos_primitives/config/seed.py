"""``[train] seed`` left unset (cosmos-rl's default): one seed drawn at start-up, the same on every rank."""

from __future__ import annotations

import logging
import os
import secrets
import zlib

import msgspec

from cosmos_primitives.config.root import Config


def _shared_draw() -> int:
    """A fresh seed in [0, 2**31) that every rank of the launch agrees on: rank 0's draw broadcast over
    the process group when there is one; before the group is joined, one derived from what torchrun
    gives every rank of a launch alike (its rendezvous address and run id)."""
    seed = secrets.randbelow(2**31)
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a core dependency
        return seed
    if dist.is_available() and dist.is_initialized():
        holder = [seed]
        dist.broadcast_object_list(holder, src=0)
        return int(holder[0])
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        launch = ":".join(os.environ.get(k, "") for k in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"))
        return zlib.crc32(launch.encode()) % 2**31
    return seed


def resolve_seed(config: Config) -> Config:
    """``config`` with ``[train] seed`` drawn (:func:`_shared_draw`) and logged when it is None, else as
    it is. A cosmos-rl file leaves it None (cosmos-rl's default: no seed); the recipes run this through
    ``check_runnable`` and dump the seed they drew, so the run can be repeated."""
    if config.train.seed is not None:
        return config
    seed = _shared_draw()
    logging.getLogger("cosmos").info(f"train.seed unset (cosmos-rl's default): this run draws seed {seed}; "
                                     f"set train.seed = {seed} to repeat it")
    return msgspec.structs.replace(config, train=msgspec.structs.replace(config.train, seed=seed))
