"""Activation memory measured on any device (the CPU included): what autograd keeps for backward, and
the peak bytes torch allocates while a function runs.

    with SavedTensorBytes(model) as saved:
        loss = model(x).pow(2).mean()
    saved.bytes        # activations held until loss.backward(); the model's own weights left out

    peak, end, _ = peak_allocated_bytes(lambda: model(x).pow(2).mean().backward())

Used to check activation checkpointing and to measure the per-token figures of the world-model
memory plan (``benchmarks/bench_wfm_memory.py``).

What :class:`SavedTensorBytes` sees: every tensor saved for backward outside a non-reentrant ``torch.utils.checkpoint``
region, counted once per storage (views and tensors saved by several ops count once). Inside a
checkpointed region the checkpoint's own hooks take the tensors (they are dropped and recomputed in
backward), but the region's inputs are saved by the checkpoint outside it, so they count: with
checkpointing, a block's input is what a block costs. Not counted: temporaries freed during the
forward, the output of the last op (held by the caller, not by autograd), and the storages of the
parameters and buffers of the modules given.
"""

from __future__ import annotations

from collections.abc import Callable
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


def peak_allocated_bytes(fn: Callable[[], Any]) -> tuple[int, int, Any]:
    """Run ``fn()`` under torch's profiler and return ``(peak, end, result)``: the most bytes allocated by
    torch above what was allocated when it started, the bytes still allocated above that at its end,
    and ``fn``'s result.

    Every allocation and free of torch's allocators is counted as it happens (on the CPU as on a GPU;
    no malloc or caching-allocator slack), so on the CPU this is the peak a GPU's
    ``max_memory_allocated`` would show for the same tensors, less what the device's own kernels
    allocate differently (e.g. cuDNN / cuBLAS workspaces).
    """
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    sizes = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation:
            sizes.append((node.start_time_ns, node.extra_fields.alloc_size))
    peak = current = 0
    for _, size in sorted(sizes):
        current += size
        peak = max(peak, current)
    return peak, current, result
