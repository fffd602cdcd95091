"""FSDP2 (``fully_shard``) applied per transformer block and at the root, with mixed precision and
optional CPU offload."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, NamedTuple

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from cosmos_primitives.parallel.mesh import ParallelMesh


def transformer_block_classes(model: torch.nn.Module) -> set[str]:
    """Class names of the repeated blocks of every Hugging Face model inside ``model``.

    Read from ``_no_split_modules`` (e.g. ``{"Qwen2_5_VLDecoderLayer", "Qwen2_5_VLVisionBlock"}``
    for Qwen2.5-VL: language-model layers and vision blocks).
    """
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    return names


def find_blocks(model: torch.nn.Module, block_classes: Iterable[str | type] | None = None) -> list[torch.nn.Module]:
    """The block modules of ``model`` in registration order (outermost match only)."""
    wanted = set(transformer_block_classes(model) if block_classes is None else block_classes)
    if not wanted:
        raise ValueError(
            f"{type(model).__name__} declares no transformer block classes (_no_split_modules); "
            "pass block_classes=[...] naming the repeated layer class"
        )
    blocks: list[torch.nn.Module] = []
    inside: set[int] = set()
    for module in model.modules():
        if id(module) in inside:
            continue
        if type(module).__name__ in wanted or type(module) in wanted:
            blocks.append(module)
            inside.update(id(m) for m in module.modules())
    return blocks


RESHARD_POLICIES = ("default", "always", "never")
"""Values of ``[train] fsdp_reshard_after_forward`` (cosmos-rl's)."""


class ReshardAfterForward(NamedTuple):
    """Whether FSDP2 frees a unit's gathered parameters after its forward (and gathers them again
    for its backward): the blocks but the last, the last block, the root unit."""

    blocks: bool
    last_block: bool
    root: bool


def resolve_reshard_after_forward(policy: Literal["default", "always", "never"], *, shard_size: int,
                                  offload: bool = False) -> ReshardAfterForward:
    """``[train] fsdp_reshard_after_forward`` -> what each unit does.

    ``"always"``: every unit reshards (the least memory; two all-gathers, each with its cast to the
    compute dtype, of every unit per step). ``"never"``: none does (one all-gather per unit and
    step; the gathered copy of the whole model, ``N x`` compute-dtype bytes per rank, lives from
    the forward to the end of the backward). ``"default"``: with ``shard_size == 1`` and no
    offload, ``"never"``: one rank shards nothing, so resharding saves no memory of the shard's
    and only repeats the cast and copy in backward; else the blocks reshard except the last, whose
    backward comes right after the forward (cosmos-rl's default), and the root does not, as it is
    needed first in backward (FSDP2's and torchtitan's choice for the root).

    Args:
        shard_size: ranks of the FSDP shard group (``dp_shard x cp``; the last dim of
            ``mesh.fsdp_mesh``).
        offload: ``[train] fsdp_offload`` (the point of offloading is to keep only the working
            units on the device, so ``"default"`` reshards the blocks then).
    """
    if policy == "always":
        return ReshardAfterForward(True, True, True)
    if policy == "never":
        return ReshardAfterForward(False, False, False)
    if policy == "default":
        blocks = shard_size > 1 or offload
        return ReshardAfterForward(blocks, False, False)
    raise ValueError(f"[train] fsdp_reshard_after_forward = {policy!r}; use one of {', '.join(RESHARD_POLICIES)}")


def apply_fsdp(
    model: torch.nn.Module,
    mesh: DeviceMesh | ParallelMesh,
    *,
    param_dtype: torch.dtype | None = torch.bfloat16,
    reduce_dtype: torch.dtype = torch.float32,
    block_classes: Iterable[str | type] | None = None,
    reshard_after_forward: bool | Literal["default", "always", "never"] = True,
    offload: bool = False,
) -> torch.nn.Module:
    """Shard ``model`` in place with FSDP2: one ``fully_shard`` unit per block, then the root.

    The root unit owns everything outside the blocks (embeddings, final norm, LM head, the
    vision patch embedding / merger), so callers must go through the root module's ``forward``
    for those parameters to be gathered: wrap the HF model in
    :class:`cosmos_primitives.policy.CausalLMPolicy` and shard that.

    Args:
        model: the module to shard (the root; parameters may be float32 master weights on CPU,
            they move to the mesh's device).
        mesh: ``ParallelMesh`` (its ``fsdp_mesh``: 1-D dp_shard, or 2-D (dp_replicate, dp_shard)
            = HSDP: sharded within a replica group, all-reduced across groups) or a ``DeviceMesh``.
        param_dtype: compute dtype of the gathered parameters (``[policy] dtype``); None keeps
            the stored dtype. Optimizer state stays in the stored (master) dtype.
        reduce_dtype: dtype of the gradient reduce-scatter / all-reduce (float32 by default).
        block_classes: block class names or types; default: the HF ``_no_split_modules``.
        reshard_after_forward: free gathered parameters after forward (re-gather in backward);
            False trades memory for one all-gather (and cast) less per unit and step. A bool
            applies to every unit, the root included; a ``[train] fsdp_reshard_after_forward``
            policy is resolved by :func:`resolve_reshard_after_forward` for the mesh's shard group.
        offload: FSDP2 ``CPUOffloadPolicy`` (``[train] fsdp_offload``): sharded parameters,
            gradients and optimizer state live in host memory (pinned when the mesh is on an
            accelerator), each unit's shard is copied to the device for its all-gather and its
            gradient back after the reduce-scatter; the optimizer then steps on the CPU.

    Returns:
        ``model`` (now also an ``FSDPModule``). Gradients of sharded parameters are averaged over
        the mesh (not summed): scale per-rank losses accordingly (see ``cp.algo.sft_loss``).
    """
    fsdp_mesh = mesh.fsdp_mesh if isinstance(mesh, ParallelMesh) else mesh
    if param_dtype == torch.float32:
        param_dtype = None
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    # pinned host memory needs an accelerator; a CPU mesh offloads to where it already is
    offload_policy = CPUOffloadPolicy(pin_memory=fsdp_mesh.device_type != "cpu") if offload else OffloadPolicy()
    if isinstance(reshard_after_forward, bool):
        reshard = ReshardAfterForward(reshard_after_forward, reshard_after_forward, reshard_after_forward)
    else:
        # the shard dim is the last one (HSDP: (dp_replicate, dp_shard))
        shard_size = fsdp_mesh.size(fsdp_mesh.ndim - 1)
        reshard = resolve_reshard_after_forward(reshard_after_forward, shard_size=shard_size, offload=offload)
    blocks = find_blocks(model, block_classes)
    for i, block in enumerate(blocks):
        fully_shard(block, mesh=fsdp_mesh, mp_policy=policy, offload_policy=offload_policy,
                    reshard_after_forward=reshard.last_block if i == len(blocks) - 1 else reshard.blocks)
    fully_shard(model, mesh=fsdp_mesh, mp_policy=policy, reshard_after_forward=reshard.root,
                offload_policy=offload_policy)
    return model


def fsdp_units(model: torch.nn.Module) -> list[str]:
    """Qualified names of the ``fully_shard`` units inside ``model`` (``""`` = the root)."""
    return [name for name, module in model.named_modules() if isinstance(module, FSDPModule)]
