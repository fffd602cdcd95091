"""Process groups, the device mesh, and (in later modules) FSDP2 / TP / activation checkpointing."""

from cosmos_primitives.parallel.distributed import (
    DistInfo,
    all_reduce_sum,
    barrier,
    broadcast_object,
    destroy_distributed,
    free_port,
    get_rank,
    get_world_size,
    init_distributed,
    is_rank0,
)
from cosmos_primitives.parallel.mesh import DIM_NAMES, MeshError, ParallelMesh, resolve_sizes

__all__ = [
    "DIM_NAMES",
    "DistInfo",
    "MeshError",
    "ParallelMesh",
    "all_reduce_sum",
    "barrier",
    "broadcast_object",
    "destroy_distributed",
    "free_port",
    "get_rank",
    "get_world_size",
    "init_distributed",
    "is_rank0",
    "resolve_sizes",
]
