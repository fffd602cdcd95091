"""Gradient-norm clipping that is exact for FSDP2 / TP (DTensor) gradients spread over ranks."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard


def _local_power_sum(grads: list[torch.Tensor], norm_type: float) -> torch.Tensor:
    if not grads:
        return torch.zeros((), dtype=torch.float32)
    if math.isinf(norm_type):
        return torch.stack([g.detach().abs().max().float() if g.numel() else g.new_zeros((), dtype=torch.float32)
                            for g in grads]).max()
    norms = torch._foreach_norm([g.detach() for g in grads], norm_type)
    return torch.stack([n.float() for n in norms]).pow(norm_type).sum()


def total_grad_norm(parameters: Iterable[torch.Tensor], norm_type: float = 2.0) -> torch.Tensor:
    """The norm of all gradients together, as if every parameter were whole on one rank.

    Plain gradients count once; a DTensor gradient contributes its local shard, summed (max for
    ``inf``) over the mesh dims it is sharded on (``Shard``) and counted once over the dims it is
    replicated on: FSDP2 (``Shard(0)`` on dp_shard), HSDP (``Replicate, Shard``) and TP layouts
    are all exact. All ranks of each DTensor's mesh must call this together.

    Returns:
        0-d float32 tensor (on the gradients' device), identical on all ranks.
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    norm_type = float(norm_type)
    plain = [g for g in grads if not isinstance(g, DTensor)]
    by_layout: dict[tuple, list[torch.Tensor]] = {}
    meshes = {}
    for g in grads:
        if isinstance(g, DTensor):
            key = (id(g.device_mesh), tuple(g.placements))
            by_layout.setdefault(key, []).append(g.to_local())
            meshes[key] = g.device_mesh
    device = grads[0].device if grads else torch.device("cpu")
    total = _local_power_sum(plain, norm_type).to(device)
    for key, locals_ in by_layout.items():
        mesh, placements = meshes[key], key[1]
        # CPU-offloaded FSDP2 gradients live on the host while their mesh (NCCL) is on the GPU
        comm_device = device if mesh.device_type == "cpu" else torch.device(mesh.device_type)
        part = _local_power_sum(locals_, norm_type).to(comm_device)
        for dim, placement in enumerate(placements):
            if isinstance(placement, Shard) and mesh.size(dim) > 1:
                op = dist.ReduceOp.MAX if math.isinf(norm_type) else dist.ReduceOp.SUM
                dist.all_reduce(part, op=op, group=mesh.get_group(dim))
        part = part.to(device)
        total = torch.maximum(total, part) if math.isinf(norm_type) else total + part
    return total if math.isinf(norm_type) else total.pow(1.0 / norm_type)


def clip_grad_norm_(parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
    """Scale gradients in place so that their total norm is at most ``max_norm``.

    Same semantics as ``torch.nn.utils.clip_grad_norm_`` (scale by ``max_norm / (norm + 1e-6)``
    when the norm exceeds ``max_norm``; nothing when ``max_norm <= 0``), with the norm from
    :func:`total_grad_norm`, so the result is the same on every rank and equal to a
    single-process run's. Non-finite norms leave the gradients unscaled (the caller decides).

    Returns:
        The total norm before clipping (0-d float32 tensor).
    """
    params = [p for p in parameters if p.grad is not None]
    norm = total_grad_norm(params, norm_type)
    if max_norm <= 0 or not params:
        return norm
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    coef = torch.where(torch.isfinite(coef), coef, torch.ones_like(coef))
    with torch.no_grad():
        locals_ = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in params]
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for g in locals_:
            by_dtype.setdefault(g.dtype, []).append(g)
        for dtype, group in by_dtype.items():
            torch._foreach_mul_(group, coef.to(device=group[0].device, dtype=dtype))
    return norm
