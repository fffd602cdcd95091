"""Find the places where code on a GPU would make the host wait for the device, on a CPU.

A host sync (``tensor.item()``, ``int(t)``, ``if t.any():``, boolean-mask indexing, ``nonzero``,
``masked_select``, a copy to the CPU) stalls the host until the GPU has finished everything queued
before it, so the GPU then idles while the host queues the next kernels. To catch them in a CPU test,
run the model on the ``meta`` device (tensors with shapes and no values) and keep the host-side
inputs (the loader's batch) on the CPU: every op that needs a device value on the host is then an op
on a meta tensor, which :class:`HostSyncCounter` records. Meta tensors have no values to give, so
on a meta tensor it raises :class:`HostSyncError` at the first one, naming the op and the calling
code; on a real GPU it only counts.
"""

from __future__ import annotations

import traceback
from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

aten = torch.ops.aten

SYNC_OPS = (aten._local_scalar_dense, aten.nonzero, aten.masked_select, aten.masked_scatter, aten.is_nonzero,
            aten.equal, aten.item)
"""Ops that read device values on the host (``_local_scalar_dense`` is ``item()`` / ``int()`` /
``float()`` / ``bool()``), or whose output shape depends on them."""

_MASK_INDEX_OPS = (aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_)
_COPY_OPS = (aten._to_copy, aten.copy_, aten._copy_from, aten._copy_from_and_resize)


class HostSyncError(AssertionError):
    """An op that needs a device value on the host ran on a ``meta`` tensor."""


def _on_device(tensors: list[torch.Tensor]) -> bool:
    return any(t.device.type != "cpu" for t in tensors)


def _sync_kind(func: Any, args: Any, kwargs: dict[str, Any]) -> str | None:
    """The name of the host sync ``func(*args, **kwargs)`` makes, or None."""
    packet = func.overloadpacket
    tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    if packet in SYNC_OPS and _on_device(tensors):
        return str(packet.__name__)
    if packet in _MASK_INDEX_OPS and len(args) > 1:
        indices = [i for i in tree_leaves(args[1]) if isinstance(i, torch.Tensor)]
        if any(i.dtype in (torch.bool, torch.uint8) and i.device.type != "cpu" for i in indices):
            return f"{packet.__name__} with a boolean mask"
    if packet in _COPY_OPS:
        if packet in (aten._to_copy,):
            source, target = args[0], kwargs.get("device") or args[0].device
        elif packet is aten.copy_:
            source, target = args[1], args[0].device
        else:
            source, target = args[0], args[1].device
        if isinstance(source, torch.Tensor) and source.device.type != "cpu" and torch.device(target).type == "cpu":
            return "device-to-host copy"
    return None


def _caller() -> str:
    """The innermost frames outside torch: where the sync was asked for."""
    frames = [f for f in traceback.extract_stack()[:-3] if "/torch/" not in f.filename]
    return "\n".join(f"  {f.filename}:{f.lineno} in {f.name}: {f.line}" for f in frames[-4:])


class HostSyncCounter(TorchDispatchMode):
    """Counts host syncs by kind while active (a ``TorchDispatchMode``)::

        with HostSyncCounter() as syncs:
            loss = step(model_on_meta, cpu_batch)
            loss.backward()
        assert not syncs.counts

    Counted: :data:`SYNC_OPS` on a non-CPU tensor, ``index`` / ``index_put`` with a boolean mask
    on a non-CPU device, and copies from a non-CPU device to the CPU. Work on CPU tensors (the host's
    own: a loader's labels, index computations) is not a sync and is not counted.

    Attributes:
        counts: ``Counter`` of the kinds seen (e.g. ``{"nonzero": 2}``).
        places: where each was asked for (the innermost frames outside torch), in order.
    """

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        self.places: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        kind = _sync_kind(func, args, kwargs)
        if kind is not None:
            self.counts[kind] += 1
            self.places.append(f"{kind}:\n{_caller()}")
            if any(t.device.type == "meta" for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)):
                raise HostSyncError(f"host sync on a meta tensor: {self.places[-1]}")
        return func(*args, **kwargs)
