"""Process groups, the device mesh, FSDP2 / activation checkpointing / per-block torch.compile, exact
gradient clipping, and variable-length attention for packed rows (the Qwen tensor-parallel plan is
``cp.models.apply_tensor_parallel``)."""

from cosmos_primitives.parallel.activation_checkpoint import apply_activation_checkpointing
from cosmos_primitives.parallel.compile import apply_compile
from cosmos_primitives.parallel.distributed import (
    DistInfo,
    all_gather_object,
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
from cosmos_primitives.parallel.fsdp import apply_fsdp, find_blocks, fsdp_units
from cosmos_primitives.parallel.grad_norm import clip_grad_norm_, total_grad_norm
from cosmos_primitives.parallel.group_rewards import gather_group_rewards
from cosmos_primitives.parallel.mesh import MeshError, ParallelMesh
from cosmos_primitives.parallel.varlen_attention import (
    VARLEN_ATTENTION,
    available_varlen_kernels,
    enable_varlen_attention,
    packed_attention_kwargs,
    varlen_attention_enabled,
    varlen_kernel_name,
)

__all__ = [  # the public surface (tests/test_public_surface.py); the rest by module path
    "ParallelMesh", "all_gather_object", "all_reduce_sum", "apply_activation_checkpointing", "apply_fsdp",
    "barrier", "broadcast_object", "clip_grad_norm_", "destroy_distributed", "find_blocks", "fsdp_units",
    "gather_group_rewards", "init_distributed",
]
