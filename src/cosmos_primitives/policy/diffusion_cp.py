"""Context parallel for a diffusers flow transformer: its video tokens split over the cp ranks.

``WanTransformer3DModel`` (Wan 2.1 / 2.2; the tiny test transformer) goes through diffusers' own
Ulysses context parallel (``ContextParallelConfig``, the model's ``_cp_plan`` naming where the token
sequence is split and gathered, and ``dispatch_attention_fn`` doing the all-to-all over heads around
attention), turned on here from our mesh. It does not go through ``ModelMixin.enable_parallelism``: in
diffusers 0.42.1 that computes the device as ``torch.device(device_type, rank %
torch.accelerator.device_count())`` (``models/modeling_utils.py``, ``_resolve_parallel_config``), which
divides by zero on a machine without an accelerator. The same steps are taken here with the device
given: a ``ParallelConfig`` set up over a ``("ring", "ulysses")`` mesh whose ulysses dim is the job's
``"cp"`` groups, the config set on the model and on every attention processor that takes one, then
diffusers' ``hooks.context_parallel.apply_context_parallel`` with the model's ``_cp_plan``. These are
diffusers' experimental (and partly private) interfaces; re-check them when diffusers moves.

``CosmosTransformer3DModel`` (Cosmos-Predict2.5) has neither a ``_cp_plan`` nor processors that take
a parallel config in diffusers 0.42.1; it gets our own split
(:mod:`cosmos_primitives.models.cosmos_transformer`: the same Ulysses scheme, with the rope,
learnable position embedding and per-token time embeddings narrowed to the rank's tokens). Another
class without a plan is refused.

Gradients: every cp rank computes the loss from the gathered output; the gather gives each rank the
gradient of its own token slice only, so the full gradient is the SUM over the cp group. The output's
gradient is multiplied by cp (here for Wan, in the gather for Cosmos), so that averaging over the cp
group (FSDP2 over ``dp_shard x cp``, or
:func:`~cosmos_primitives.parallel.context_parallel.all_reduce_context_parallel_grads`) gives it, as
for the language-model context parallel.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from cosmos_primitives.utils.extras import require


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.factor, None


def _ulysses_mesh(mesh: Any) -> Any:
    """A ``("ring", "ulysses")`` device mesh whose ulysses groups are ``mesh``'s ``"cp"`` groups."""
    from torch.distributed.device_mesh import init_device_mesh

    sizes = mesh.sizes
    if mesh.world_size != dist.get_world_size():
        raise ValueError("world-model context parallel needs a mesh over the whole job (a ParallelMesh)")
    outer = sizes["pp"] * sizes["dp_replicate"] * sizes["dp_shard"]
    full = init_device_mesh(mesh.device_type, (outer, 1, sizes["cp"], sizes["tp"]),
                            mesh_dim_names=("cp_outer", "ring", "ulysses", "cp_inner"))
    ulysses = full["ring", "ulysses"]
    if dist.get_process_group_ranks(ulysses["ulysses"].get_group()) != dist.get_process_group_ranks(mesh.group("cp")):
        raise ValueError("the ulysses mesh does not match the job's cp groups")  # a change of DIM_NAMES order
    return ulysses


def enable_transformer_context_parallel(transformer: torch.nn.Module, mesh: Any) -> None:
    """Split ``transformer``'s video tokens over ``mesh``'s ``"cp"`` ranks (Ulysses, in place).

    After this, every cp rank must call the transformer with the SAME inputs (the same sample and
    noise); each runs its blocks on ``tokens / cp`` of the sequence and gets the whole output.
    Collective: every rank of the job calls it.

    Args:
        transformer: ``CosmosTransformer3DModel`` (our split), or a diffusers transformer with a
            ``_cp_plan`` whose attention goes through ``dispatch_attention_fn`` (``WanTransformer3DModel``).
        mesh: a :class:`~cosmos_primitives.parallel.mesh.ParallelMesh` with ``cp > 1``.

    Raises:
        NotImplementedError: the model class has no context-parallel plan or dispatcher (names it).
        ValueError: heads not divisible by cp, an attention backend without context parallel (Wan), or
            (at the call) a latent whose token count does not divide by cp.
    """
    from cosmos_primitives.models.cosmos_transformer import is_cosmos_transformer, split_cosmos_tokens

    cp = mesh.size("cp")
    name = type(transformer).__name__
    cosmos = is_cosmos_transformer(transformer)
    if not cosmos:
        _check_diffusers_plan(transformer, cp)
    heads = getattr(transformer.config, "num_attention_heads", None)
    if heads is not None and heads % cp:
        raise ValueError(f"[policy.parallelism] cp_size = {cp} does not divide {name}'s {heads} attention heads "
                         "(Ulysses gives each cp rank heads / cp of them); pick a cp_size that divides it")
    patch = tuple(getattr(transformer.config, "patch_size", None) or ())

    def check_tokens(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        latents = kwargs.get("hidden_states", args[0] if args else None)
        if isinstance(latents, torch.Tensor) and latents.dim() == 5 and len(patch) == 3:
            tokens = math.prod(s // p for s, p in zip(latents.shape[2:], patch))
            if tokens % cp:
                raise ValueError(f"{name}: {tokens} video tokens ({tuple(latents.shape[2:])} latents, patch {patch}) "
                                 f"do not divide over cp_size = {cp}; pick frames / height / width that do")

    transformer.register_forward_pre_hook(check_tokens, with_kwargs=True)
    if cosmos:
        split_cosmos_tokens(transformer, mesh.group("cp"))  # its gather scales the output gradient by cp
        return
    _apply_diffusers_plan(transformer, mesh, cp)

    def scale_output_grad(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> Any:
        if isinstance(output, tuple):
            return (_ScaleGrad.apply(output[0], float(cp)), *output[1:])
        output.sample = _ScaleGrad.apply(output.sample, float(cp))
        return output

    transformer.register_forward_hook(scale_output_grad, with_kwargs=True)


def _attention_processors(transformer: torch.nn.Module) -> list[Any]:
    """The attention processors of ``transformer`` that take a diffusers parallel config."""
    return [m.processor for m in transformer.modules() if hasattr(getattr(m, "processor", None), "_parallel_config")]


def _check_diffusers_plan(transformer: torch.nn.Module, cp: int) -> None:
    """NotImplementedError unless ``transformer`` has a ``_cp_plan`` and processors that take a parallel config."""
    if getattr(transformer, "_cp_plan", None) is None or not _attention_processors(transformer):
        raise NotImplementedError(
            f"[policy.parallelism] cp_size = {cp}: diffusers' {type(transformer).__name__} has no context-parallel "
            "plan (_cp_plan) or attention processors that take a parallel config, and cosmos_primitives has no "
            "split of its own for it (it has for CosmosTransformer3DModel), so its tokens cannot be split; set "
            "cp_size = 1 and use dp_shard_size / dp_replicate_size"
        )


def _apply_diffusers_plan(transformer: torch.nn.Module, mesh: Any, cp: int) -> None:
    """Diffusers' Ulysses over ``mesh``'s cp groups, with the model's ``_cp_plan`` (the module docstring)."""
    diffusers = require("diffusers", "world-model context parallel")
    from diffusers.hooks.context_parallel import apply_context_parallel
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    name = type(transformer).__name__
    processors = _attention_processors(transformer)
    for processor in processors:
        backend = processor._attention_backend
        backend = (_AttentionBackendRegistry.get_active_backend()[0] if backend is None
                   else AttentionBackendName(backend))
        if not _AttentionBackendRegistry._is_context_parallel_available(backend):
            raise ValueError(f"{name}'s attention backend '{backend.value}' has no context parallel; call "
                             "transformer.set_attention_backend('native') (or another that has) first")
    config = diffusers.ParallelConfig(context_parallel_config=diffusers.ContextParallelConfig(ulysses_degree=cp))
    device = (torch.device("cuda", torch.cuda.current_device()) if mesh.device_type == "cuda"
              else torch.device(mesh.device_type))
    config.setup(dist.get_rank(), dist.get_world_size(), device, mesh=_ulysses_mesh(mesh))
    transformer._parallel_config = config
    for processor in processors:
        processor._parallel_config = config
    apply_context_parallel(transformer, config.context_parallel_config, transformer._cp_plan)
