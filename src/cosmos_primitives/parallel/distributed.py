"""Process-group setup that works the same under ``torchrun`` and in a plain single process."""

from __future__ import annotations

import datetime
import os
import socket
from typing import Any

import attrs
import torch
import torch.distributed as dist


@attrs.frozen
class DistInfo:
    """Facts about this process: ``rank`` / ``world_size`` are global, ``local_rank`` per node."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pick_backend(device_type: str) -> str:
    # gloo alongside nccl so that CPU tensors (object collectives, sampler state) also work on GPU.
    return "cpu:gloo,cuda:nccl" if device_type == "cuda" else "gloo"


def init_distributed(backend: str | None = None, timeout_s: float = 1800.0) -> DistInfo:
    """Initialise the default process group (once) and return this process's :class:`DistInfo`.

    Under ``torchrun`` the usual ``RANK`` / ``WORLD_SIZE`` / ``MASTER_ADDR`` / ``MASTER_PORT``
    variables are read. In a plain ``python`` process a one-rank group is created on a free
    loopback port, so the same code (FSDP2, DCP, collectives) runs unchanged.

    Args:
        backend: force a backend (``"gloo"``, ``"nccl"``, ...); default: nccl (+gloo for CPU
            tensors) when CUDA is available, else gloo. ``COSMOS_BACKEND`` overrides too.
        timeout_s: collective timeout.
    """
    use_cuda = torch.cuda.is_available() and os.environ.get("COSMOS_DEVICE", "") != "cpu"
    device_type = "cuda" if use_cuda else "cpu"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device(device_type, local_rank) if use_cuda else torch.device("cpu")
    if not dist.is_initialized():
        backend = backend or os.environ.get("COSMOS_BACKEND") or _pick_backend(device_type)
        kwargs: dict[str, Any] = {"backend": backend, "timeout": datetime.timedelta(seconds=timeout_s)}
        if "WORLD_SIZE" not in os.environ:
            kwargs.update(init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
        if use_cuda:
            kwargs["device_id"] = device
        dist.init_process_group(**kwargs)
    return DistInfo(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local_rank,
        backend=str(dist.get_backend()),
        device=device,
    )


def destroy_distributed() -> None:
    """Tear the default process group down (safe to call when none exists)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def get_rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def get_world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def is_rank0() -> bool:
    return get_rank() == 0


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def broadcast_object(obj: Any, src: int = 0, group: dist.ProcessGroup | None = None) -> Any:
    """Send a picklable object from ``src`` to every rank (identity without a process group).

    Only for trusted, in-job values (run directory names, timestamps): it pickles.
    """
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src, group=group)
    return box[0]


def all_gather_object(obj: Any, group: dist.ProcessGroup | None = None) -> list[Any]:
    """Every rank's picklable ``obj``, in rank order (``[obj]`` without a process group).

    Only for trusted, in-job values (small per-rank summaries): it pickles.
    """
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def all_reduce_sum(value: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """In-place sum over ``group`` (identity without a process group); returns ``value``."""
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(value, op=dist.ReduceOp.SUM, group=group)
    return value
