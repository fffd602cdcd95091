"""What autograd keeps for backward: the bytes of the distinct storages saved inside a block of code.

    with SavedTensorBytes(model) as saved:
        loss = model(x).pow(2).mean()
    saved.bytes        # activations held until loss.backward(); the model's own weights left out

A device-independent count (it runs on the CPU as on a GPU), used to check
activation checkpointing and to measure the per-token activation figures of the memory plan.

What it sees: every tensor saved for backward outside a non-reentrant ``torch.utils.checkpoint``
region, counted once per storage (views and tensors saved by several ops count once). Inside a
checkpointed region the checkpoint's own hooks take the tensors (they are dropped and recomputed in
backward), but the region's inputs are saved by the checkpoint outside it, so they count: with
checkpointing, a block's input is what a block costs. Not counted: temporaries freed during the
forward, the output of the last op (held by the caller, not by autograd), and the storages of the
parameters and buffers of the modules given.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import torch
from torch.autograd.graph import saved_tensors_hooks


class SavedTensorBytes:
    """Context manager counting the distinct storages autograd saves inside it.

    Args:
        exclude: modules whose parameters and buffers are not activations (weights saved by a
            linear layer for its input gradient).

    Attributes (read after the block):
        bytes: the saved storages' total size in bytes.
        by_dtype: the same, per dtype of the first tensor seen on each storage.
    """

    def __init__(self, *exclude: torch.nn.Module) -> None:
        self._skip = {t.untyped_storage().data_ptr() for m in exclude for t in (*m.parameters(), *m.buffers())}
        # strong references: a storage freed and reallocated at the same address must not be mistaken for
        # one already counted (the graph keeps them anyway until backward)
        self._storages: dict[int, Any] = {}
        self.by_dtype: dict[torch.dtype, int] = {}
        self._hooks: saved_tensors_hooks | None = None

    @property
    def bytes(self) -> int:
        return sum(self.by_dtype.values())

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key and key not in self._skip and key not in self._storages:
            self._storages[key] = storage
            self.by_dtype[tensor.dtype] = self.by_dtype.get(tensor.dtype, 0) + storage.nbytes()
        return tensor

    def __enter__(self) -> SavedTensorBytes:
        self._hooks = saved_tensors_hooks(self._pack, lambda tensor: tensor)
        self._hooks.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        assert self._hooks is not None
        self._hooks.__exit__(exc_type, exc, tb)
        self._storages.clear()  # the counts stay; the graph holds what it needs
