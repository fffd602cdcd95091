"""One object that knows the device mesh and hands out named sub-meshes and rank facts."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from cosmos_primitives.config.policy import ParallelismConfig

# Outer to inner: ranks that differ only in tp are neighbours (same node first).
DIM_NAMES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")

# Flattened views built on top of the base dims.
FLATTENED = {
    "dp": ("dp_replicate", "dp_shard"),
    "dp_shard_cp": ("dp_shard", "cp"),
    "dp_cp": ("dp_replicate", "dp_shard", "cp"),
}


class MeshError(ValueError):
    """Mesh sizes do not fit the world size."""


def resolve_sizes(parallelism: ParallelismConfig, world_size: int) -> dict[str, int]:
    """Resolve ``dp_shard_size = -1`` (or ``dp_replicate_size = -1``); check that the sizes multiply to ``world_size``.

    Returns:
        ``{"pp": .., "dp_replicate": .., "dp_shard": .., "cp": .., "tp": ..}``.

    Raises:
        MeshError: naming every size and the world size when they do not fit.
    """
    sizes = {
        "pp": parallelism.pp_size,
        "dp_replicate": parallelism.dp_replicate_size,
        "dp_shard": parallelism.dp_shard_size,
        "cp": parallelism.cp_size,
        "tp": parallelism.tp_size,
    }
    described = ", ".join(f"{k}_size={v}" for k, v in sizes.items())
    inferred = [name for name, size in sizes.items() if size == -1]
    for name, size in sizes.items():
        if size == 0 or size < -1 or (size == -1 and name not in ("dp_shard", "dp_replicate")):
            raise MeshError(f"invalid parallelism: {name}_size={size} ({described}); sizes must be >= 1")
    if len(inferred) > 1:
        raise MeshError(f"invalid parallelism: only one of dp_shard_size / dp_replicate_size may be -1 ({described})")
    if inferred:
        name = inferred[0]
        others = math.prod(v for k, v in sizes.items() if k != name)
        if world_size % others:
            rest = "*".join(k for k in sizes if k != name)
            raise MeshError(
                f"cannot infer {name}_size: world size {world_size} is not divisible by {rest} = {others} ({described})"
            )
        sizes[name] = world_size // others
    total = math.prod(sizes.values())
    if total != world_size:
        raise MeshError(
            f"parallelism sizes multiply to {total} but the world size is {world_size} ({described}); "
            "make the product equal the number of ranks, or set dp_shard_size = -1 to infer it"
        )
    return sizes


class ParallelMesh:
    """The device mesh of one process group, built from ``[policy.parallelism]``.

    ``mesh["dp_shard"]``, ``mesh["tp"]``, ``mesh["dp"]`` (dp_replicate x dp_shard flattened),
    ``mesh["dp_shard_cp"]``, ``mesh["dp_cp"]`` and ``mesh["dp_replicate", "dp_shard"]`` (the 2-D
    HSDP mesh) are :class:`DeviceMesh` objects; :meth:`size` and :meth:`local_rank` give facts.

    Args:
        parallelism: the sizes (``dp_shard_size = -1`` infers it).
        device_type: ``"cuda"`` or ``"cpu"``.
        world_size: defaults to the default process group's size.
    """

    def __init__(self, parallelism: ParallelismConfig, device_type: str | None = None,
                 world_size: int | None = None) -> None:
        if world_size is None:
            world_size = dist.get_world_size() if dist.is_initialized() else 1
        self.sizes = resolve_sizes(parallelism, world_size)
        self.world_size = world_size
        self.device_type = device_type or ("cuda" if torch.cuda.is_available() else "cpu")
        self.mesh: DeviceMesh = init_device_mesh(
            self.device_type, tuple(self.sizes[d] for d in DIM_NAMES), mesh_dim_names=DIM_NAMES
        )
        # kept here: slicing a flattened dim back out of the root mesh is deprecated in torch
        self._flat: dict[str, DeviceMesh] = {
            flat_name: self.mesh[dims]._flatten(mesh_dim_name=flat_name) for flat_name, dims in FLATTENED.items()
        }

    def __getitem__(self, name: str | tuple[str, ...]) -> DeviceMesh:
        if isinstance(name, str) and name in self._flat:
            return self._flat[name]
        return self.mesh[name]

    def size(self, name: str) -> int:
        """Size of a base or flattened dim (``"dp"`` = dp_replicate * dp_shard)."""
        if name in self.sizes:
            return self.sizes[name]
        if name in FLATTENED:
            return math.prod(self.sizes[d] for d in FLATTENED[name])
        raise KeyError(f"unknown mesh dim {name!r}; known: {', '.join((*DIM_NAMES, *FLATTENED))}")

    def local_rank(self, name: str) -> int:
        """This process's coordinate along a base or flattened dim."""
        self.size(name)  # validates the name
        return self[name].get_local_rank()

    def enabled(self, name: str) -> bool:
        return self.size(name) > 1

    def group(self, name: str) -> dist.ProcessGroup:
        """The process group of a dim (e.g. for all-reducing token counts over ``"dp"``)."""
        return self[name].get_group()

    @property
    def dp_rank(self) -> int:
        return self.local_rank("dp")

    @property
    def dp_size(self) -> int:
        return self.size("dp")

    @property
    def fsdp_mesh(self) -> DeviceMesh:
        """The mesh FSDP2 shards over: 1-D dp_shard(+cp), or 2-D (dp_replicate, dp_shard) for HSDP."""
        if self.enabled("cp"):
            if self.enabled("dp_replicate"):
                return self.mesh["dp_replicate", "dp_shard_cp"]
            return self._flat["dp_shard_cp"]
        if self.enabled("dp_replicate"):
            return self.mesh["dp_replicate", "dp_shard"]
        return self.mesh["dp_shard"]

    def __repr__(self) -> str:
        dims = ", ".join(f"{k}={v}" for k, v in self.sizes.items())
        return f"ParallelMesh({dims}, world_size={self.world_size}, device_type={self.device_type!r})"
