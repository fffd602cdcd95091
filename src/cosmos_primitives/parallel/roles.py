"""Split the ranks of one ``torchrun`` job into trainer and rollout roles, and give the trainers a mesh.

Disaggregated GRPO runs generation and training in separate processes of one job: the first
``world_size - num_rollout_ranks`` ranks train (global rank 0 among them, so rank-0 duties such as
logging and exports stay with a trainer), the last ``num_rollout_ranks`` generate. The trainers
shard the policy over their own device mesh (:class:`RoleMesh`); the rollout ranks are not in it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import attrs
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from cosmos_primitives.config.policy import ParallelismConfig
from cosmos_primitives.parallel.mesh import DIM_NAMES, FLATTENED, MeshError, ParallelMesh, resolve_sizes

Role = Literal["trainer", "rollout"]


@attrs.frozen
class RoleSplit:
    """Which global ranks train and which generate, seen from ``rank``.

    Attributes:
        trainer_ranks: global ranks of the trainers, ascending (``trainer_ranks[0]`` sends weights).
        rollout_ranks: global ranks of the rollout workers, ascending.
        rank: this process's global rank.
    """

    trainer_ranks: tuple[int, ...]
    rollout_ranks: tuple[int, ...]
    rank: int

    @property
    def role(self) -> Role:
        return "trainer" if self.rank in self.trainer_ranks else "rollout"

    @property
    def is_trainer(self) -> bool:
        return self.role == "trainer"

    @property
    def is_rollout(self) -> bool:
        return self.role == "rollout"

    @property
    def num_trainers(self) -> int:
        return len(self.trainer_ranks)

    @property
    def num_rollouts(self) -> int:
        return len(self.rollout_ranks)

    @property
    def index(self) -> int:
        """This rank's position among the ranks of its role (0-based), e.g. for sharding prompts."""
        ranks = self.trainer_ranks if self.is_trainer else self.rollout_ranks
        return ranks.index(self.rank)


def split_roles(world_size: int, num_rollout_ranks: int, rank: int | None = None) -> RoleSplit:
    """Trainers are ranks ``0 .. world_size - num_rollout_ranks - 1``, rollout workers the rest.

    Args:
        world_size: ranks in the job (``torchrun --nproc_per_node`` x nodes).
        num_rollout_ranks: ``[disaggregated] num_rollout_ranks``.
        rank: this process's global rank (default: the default process group's, else 0).

    Raises:
        ValueError: fewer than one rank would be left for either role (names both numbers).
    """
    if rank is None:
        rank = dist.get_rank() if dist.is_initialized() else 0
    if num_rollout_ranks < 1 or num_rollout_ranks >= world_size:
        raise ValueError(
            f"[disaggregated] num_rollout_ranks = {num_rollout_ranks} with {world_size} ranks in the job: "
            "both roles need at least one rank, so it must be between 1 and world_size - 1 "
            "(start more processes with torchrun --nproc_per_node, or lower num_rollout_ranks)"
        )
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a job of {world_size} ranks")
    trainers = world_size - num_rollout_ranks
    return RoleSplit(tuple(range(trainers)), tuple(range(trainers, world_size)), rank)


class RoleMesh(ParallelMesh):
    """A :class:`ParallelMesh` over a subset of the job's ranks (e.g. the trainer ranks only).

    Creating the sub-groups of a device mesh is collective over the whole job, so EVERY rank
    constructs it with the same arguments, members or not; ranks outside ``ranks`` get an object
    whose :attr:`is_member` is False and must not use it for anything else.

    Args:
        parallelism: the sizes, resolved against ``len(ranks)`` (``dp_shard_size = -1`` infers it).
        ranks: the member global ranks, in mesh order.
        device_type: ``"cuda"`` or ``"cpu"``.

    Raises:
        MeshError: sizes that do not multiply to ``len(ranks)``, or repeated ranks.
    """

    def __init__(self, parallelism: ParallelismConfig, ranks: Sequence[int], device_type: str | None = None) -> None:
        ranks = [int(r) for r in ranks]
        if not ranks or len(set(ranks)) != len(ranks):
            raise MeshError(f"a role mesh needs distinct ranks, got {ranks}")
        self.ranks = tuple(ranks)
        self.sizes = resolve_sizes(parallelism, len(ranks))
        self.world_size = len(ranks)
        self.device_type = device_type or ("cuda" if torch.cuda.is_available() else "cpu")
        layout = torch.tensor(ranks, dtype=torch.int).reshape(tuple(self.sizes[d] for d in DIM_NAMES))
        self.mesh = DeviceMesh(self.device_type, layout, mesh_dim_names=DIM_NAMES)
        self._flat = {
            flat_name: self.mesh[dims]._flatten(mesh_dim_name=flat_name) for flat_name, dims in FLATTENED.items()
        }

    @property
    def is_member(self) -> bool:
        """Whether this process is one of :attr:`ranks`."""
        rank = dist.get_rank() if dist.is_initialized() else 0
        return rank in self.ranks

    def __repr__(self) -> str:
        dims = ", ".join(f"{k}={v}" for k, v in self.sizes.items())
        return (f"RoleMesh({dims}, ranks={list(self.ranks)}, device_type={self.device_type!r}, "
                f"{math.prod(self.sizes.values())} ranks)")
