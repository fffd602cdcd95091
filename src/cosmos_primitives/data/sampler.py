"""A distributed sampler whose position inside an epoch is saved and restored exactly."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


class ResumableDistributedSampler:
    """Indices of this rank's share of a dataset, reshuffled every epoch, resumable mid-epoch.

    Epoch ``e`` uses the permutation of ``torch.randperm(num_samples)`` seeded with ``seed + e``
    (identity order when ``shuffle=False``); rank ``r`` of ``W`` takes positions ``r, r + W, ...``.
    Without ``drop_last`` the order is padded by wrapping around so every rank gets
    ``ceil(num_samples / W)`` indices; with it, truncated to ``floor(num_samples / W)`` each.

    Iterating yields the indices from the current position on; each yielded index advances the
    position, so :meth:`state_dict` taken between two yields and given to :meth:`load_state_dict`
    (of a sampler built with the same arguments) makes it yield exactly the remaining indices.
    :meth:`set_epoch` with a new epoch starts that epoch at position 0.
    """

    def __init__(self, num_samples: int, rank: int = 0, world_size: int = 1, seed: int = 0, shuffle: bool = True,
                 drop_last: bool = False) -> None:
        if num_samples <= 0:
            raise ValueError(f"num_samples must be positive, got {num_samples}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        if drop_last and num_samples < world_size:
            raise ValueError(f"drop_last with {num_samples} samples leaves nothing for {world_size} ranks")
        self.num_samples = num_samples
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.epoch = 0
        self.position = 0

    def __len__(self) -> int:
        """Indices per rank per epoch."""
        if self.drop_last:
            return self.num_samples // self.world_size
        return -(-self.num_samples // self.world_size)

    def epoch_indices(self, epoch: int | None = None) -> list[int]:
        """This rank's whole index list for ``epoch`` (default: the current one)."""
        epoch = self.epoch if epoch is None else epoch
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + epoch)
            order = torch.randperm(self.num_samples, generator=generator).tolist()
        else:
            order = list(range(self.num_samples))
        total = len(self) * self.world_size
        if total > len(order):
            order = (order * (total // len(order) + 1))[:total]
        return order[:total][self.rank::self.world_size]

    def set_epoch(self, epoch: int) -> None:
        """Move to ``epoch`` (from position 0) unless already in it."""
        if epoch != self.epoch:
            self.epoch = epoch
            self.position = 0

    @property
    def remaining(self) -> int:
        return len(self) - self.position

    def __iter__(self) -> Iterator[int]:
        indices = self.epoch_indices()
        while self.position < len(indices):
            index = indices[self.position]
            self.position += 1
            yield index

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "num_samples": self.num_samples,
                "world_size": self.world_size, "rank": self.rank, "seed": self.seed, "shuffle": self.shuffle,
                "drop_last": self.drop_last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the epoch and position.

        Raises:
            ValueError: the saved sampler saw a different dataset size, world size, rank, seed or
                order settings (its remaining indices would not be the same).
        """
        for key in ("num_samples", "world_size", "rank", "seed", "shuffle", "drop_last"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(f"sampler state was saved with {key}={state[key]!r} but this sampler has "
                                 f"{key}={getattr(self, key)!r}; resume with the same dataset, world size and "
                                 f"seed, or start a fresh epoch")
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        if not 0 <= self.position <= len(self):
            raise ValueError(f"sampler position {self.position} is outside 0..{len(self)}")
