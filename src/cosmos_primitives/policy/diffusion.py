"""A diffusers flow-matching transformer as a trainable policy: LoRA or full fine-tuning, its KL
reference, FSDP2 sharding and gradient checkpointing.

With LoRA (peft, on the attention projections ``to_q``, ``to_k``, ``to_v``, ``to_out.0`` by
default) the reference is the same network with the adapters disabled, so it costs no memory.
With full fine-tuning the reference is a frozen copy of the initial weights, made only when asked
for (``keep_reference=True``, i.e. when a KL term is used).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
from torch.utils._pytree import tree_map

from cosmos_primitives.algo.flow_step import VelocityFn
from cosmos_primitives.config.policy import LoraConfig
from cosmos_primitives.models.flow_transformers import flow_velocity_fn
from cosmos_primitives.policy.lora import adapters_disabled, apply_lora

BLOCK_ATTRIBUTES = ("blocks", "transformer_blocks")
"""Where diffusers transformers keep their blocks (Wan, Cosmos: ``blocks``; SD3, Flux: ``transformer_blocks``)."""


def transformer_blocks(transformer: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks of a diffusers transformer (the FSDP2 / checkpointing unit)."""
    for attr in BLOCK_ATTRIBUTES:
        blocks = getattr(transformer, attr, None)
        if isinstance(blocks, torch.nn.ModuleList) and len(blocks) > 0:
            return list(blocks)
    raise ValueError(f"{type(transformer).__name__} has no block list (looked for {BLOCK_ATTRIBUTES}); "
                     "shard it yourself with torch.distributed.fsdp.fully_shard")


def text_width(transformer: Any) -> int | None:
    """The width ``D`` of the text embeddings ``[B, L, D]`` that ``transformer`` takes, from its config.

    Cosmos-Predict2.5's ``CosmosTransformer3DModel`` projects the Cosmos-Reason1 embeddings (every
    layer's hidden states, concatenated: 28 x 3584 = 100352 wide) to ``text_embed_dim``
    (``use_crossattn_projection``), so it takes ``crossattn_proj_in_channels``; Cosmos-Predict2 takes
    ``text_embed_dim`` (T5), Wan ``text_dim``. None for a class it does not know.
    """
    config = getattr(transformer, "config", None)
    if config is None:
        return None
    if config.get("use_crossattn_projection"):
        return int(config["crossattn_proj_in_channels"])
    for key in ("text_embed_dim", "text_dim"):
        if config.get(key) is not None:
            return int(config[key])
    return None


def check_text_width(transformer: Any, width: int, *, source: str = "[wfm.data] text_dim") -> None:
    """Raise ``ValueError`` when ``width`` (of the embeddings named by ``source``) is not :func:`text_width`."""
    expected = text_width(transformer)
    if expected is not None and expected != width:
        raise ValueError(
            f"{source} is {width} wide but {type(transformer).__name__} takes text embeddings {expected} wide; "
            f"set [wfm.data] text_dim = {expected} and precompute the embeddings with the model's text encoder "
            "(python -m cosmos_primitives.data.precompute_text_embeddings)")


def shard_transformer(transformer: torch.nn.Module, mesh: Any = None, *, param_dtype: torch.dtype | None = None,
                      reshard_after_forward: bool = True) -> torch.nn.Module:
    """FSDP2: ``fully_shard`` every transformer block, then the root (in place).

    Args:
        mesh: a 1-D ``DeviceMesh`` (e.g. ``cp.parallel.ParallelMesh(...).fsdp_mesh``; 2-D for HSDP);
            ``None``: all ranks of the default group.
        param_dtype: compute dtype of the gathered weights (e.g. ``torch.bfloat16``); gradients are
            reduced in float32.

    Gradients are averaged over the mesh: each rank's loss should be the mean over its own samples.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if param_dtype is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for block in transformer_blocks(transformer):
        fully_shard(block, **kwargs)
        if param_dtype is not None:
            # diffusers checkpoints around the block's call, so its recompute re-enters the FSDP unit
            # during backward, where torch 2.11's FSDP2 skips the input cast: the recompute then ran in
            # float32 and failed checkpointing's metadata check (seen on an H100, 2026-11-27)
            block.register_forward_pre_hook(partial(_cast_floating_inputs, param_dtype), with_kwargs=True)
    fully_shard(transformer, **kwargs)
    return transformer


def _cast_floating_inputs(dtype: torch.dtype, module: torch.nn.Module, args: tuple,
                          kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """Forward pre-hook: every floating-point tensor argument in ``dtype`` (FSDP2's own input cast, also
    when the forward is an activation-checkpointing recompute)."""
    def cast(value: Any) -> Any:
        return value.to(dtype) if isinstance(value, torch.Tensor) and value.is_floating_point() else value

    return tree_map(cast, args), tree_map(cast, kwargs)


class DiffusionPolicy:
    """The trainable transformer of world-model RL and its KL reference.

    Args:
        transformer: a diffusers flow transformer (moved / cast by the caller).
        lora: ``[policy.lora]`` (its ``target_modules`` name the transformer's layers, e.g.
            ``to_q``); ``None`` or ``enabled = false``: full fine-tuning.
        keep_reference: with full fine-tuning, keep a frozen copy of the initial weights as the
            reference (needed for a KL term). Ignored with LoRA.
        gradient_checkpointing: recompute block activations in backward (diffusers' own switch).
        num_train_timesteps: the scheduler's; a Cosmos-Predict2.5 transformer is fed
            ``timestep / num_train_timesteps`` (its sigma); see ``cp.models.flow_velocity_fn``.

    Use :meth:`velocity_fn` for rollouts and training, ``with policy.reference() as ref:`` for the
    reference velocity, :meth:`shard` for FSDP2.
    """

    def __init__(self, transformer: Any, *, lora: LoraConfig | None = None, keep_reference: bool = False,
                 gradient_checkpointing: bool = False, num_train_timesteps: float = 1000.0) -> None:
        self.transformer = transformer
        self.num_train_timesteps = float(num_train_timesteps)
        self.uses_lora = lora is not None and lora.enabled
        self._frozen_reference: Any = None
        if self.uses_lora:
            apply_lora(transformer, lora)
        else:
            transformer.requires_grad_(True)
            if keep_reference:
                self._frozen_reference = copy.deepcopy(transformer).requires_grad_(False).eval()
        if gradient_checkpointing:
            transformer.enable_gradient_checkpointing()

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The parameters the optimizer updates (LoRA weights, or all of them)."""
        return [p for p in self.transformer.parameters() if p.requires_grad]

    def num_trainable(self) -> int:
        """Number of trainable scalars (local shard sizes after :meth:`shard`)."""
        return sum(p.numel() for p in self.trainable_parameters())

    def velocity_fn(self, **forward_kwargs: Any) -> VelocityFn:
        """The policy's velocity, see :func:`cosmos_primitives.models.flow_transformers.flow_velocity_fn`."""
        return flow_velocity_fn(self.transformer, num_train_timesteps=self.num_train_timesteps, **forward_kwargs)

    @property
    def has_reference(self) -> bool:
        return self.uses_lora or self._frozen_reference is not None

    @contextmanager
    def reference(self, **forward_kwargs: Any) -> Iterator[VelocityFn]:
        """The reference velocity inside the block, evaluated without autograd.

        Raises:
            RuntimeError: full fine-tuning built without ``keep_reference=True``.
        """
        if self.uses_lora:
            with adapters_disabled(self.transformer), torch.no_grad():
                yield flow_velocity_fn(self.transformer, num_train_timesteps=self.num_train_timesteps, **forward_kwargs)
            return
        if self._frozen_reference is None:
            raise RuntimeError("this DiffusionPolicy does full fine-tuning without a reference copy; build it with "
                               "keep_reference=True (needed when [wfm] kl_beta > 0)")
        with torch.no_grad():
            yield flow_velocity_fn(self._frozen_reference, num_train_timesteps=self.num_train_timesteps,
                                   **forward_kwargs)

    def refresh_reference(self) -> None:
        """Copy the current weights into the frozen reference (``[wfm] reference_update_interval``).
        Shard by shard under FSDP2 (both are sharded alike), so no rank gathers anything.

        Raises:
            RuntimeError: with LoRA (the reference is the base model, adapters off) or without a
                reference copy.
        """
        if self.uses_lora or self._frozen_reference is None:
            raise RuntimeError("[wfm] reference_update_interval needs full fine-tuning with a reference copy "
                               "([wfm] kl_beta > 0 and no [policy.lora]): with LoRA the reference is the base model")
        with torch.no_grad():
            for ref, now in zip(self._frozen_reference.parameters(), self.transformer.parameters(), strict=True):
                ref.copy_(now)

    def enable_context_parallel(self, mesh: Any) -> DiffusionPolicy:
        """Split the video tokens over ``mesh``'s ``"cp"`` ranks, in the transformer and the frozen
        reference (:func:`cosmos_primitives.policy.diffusion_cp.enable_transformer_context_parallel`:
        Cosmos-Predict2.5 and Wan). The cp ranks must then feed the same samples and noise."""
        from cosmos_primitives.policy.diffusion_cp import enable_transformer_context_parallel

        enable_transformer_context_parallel(self.transformer, mesh)
        if self._frozen_reference is not None:
            enable_transformer_context_parallel(self._frozen_reference, mesh)
        return self

    def shard(self, mesh: Any = None, *, param_dtype: torch.dtype | None = None) -> DiffusionPolicy:
        """FSDP2-shard the transformer (and the frozen reference, if any) over ``mesh`` (:func:`shard_transformer`)."""
        shard_transformer(self.transformer, mesh, param_dtype=param_dtype)
        if self._frozen_reference is not None:
            shard_transformer(self._frozen_reference, mesh, param_dtype=param_dtype)
        return self

    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        """The trainable weights by name (LoRA weights only, or the whole transformer), full tensors on CPU.

        Collective under FSDP2: call it on every rank.
        """
        out = {}
        for name, p in self.transformer.named_parameters():
            if p.requires_grad:
                full = p.full_tensor() if hasattr(p, "full_tensor") else p
                out[name] = full.detach().to("cpu", copy=True)
        return out
