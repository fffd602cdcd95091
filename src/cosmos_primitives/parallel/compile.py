"""``torch.compile`` per transformer block (``[train] compile``), torchtitan's way: each repeated
block is compiled on its own with ``fullgraph=True`` (a graph break is an error, not a silent
slowdown); the blocks share their compiled code, so compile time does not grow with depth.

Apply after activation checkpointing and tensor parallelism and before FSDP2, as torchtitan does:
FSDP2's hooks run outside the compiled region, and HF's checkpointing wrapper is traced into it (the
recomputation is then part of the compiled backward).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import torch

from cosmos_primitives.parallel.fsdp import find_blocks

COMPILE_DEVICE_TYPES = ("cuda",)
"""Device types on which ``build_policy`` applies ``[train] compile``. Not the CPU: inductor's C++
code generation takes tens of seconds per graph there (about 25 s for the tiny test Qwen2's forward
and backward on 2 cores) and CPU runs are tests and small demos."""

RECOMPILE_LIMIT = 64
"""Lower bound set on ``torch._dynamo.config.recompile_limit`` by :func:`apply_compile`.

Every HF block class shares one compiled function (transformers wraps each block's ``forward`` in
the same checkpointing closure), and torch's default limit of 8 compiled variants per function is
reached by an ordinary GRPO run: {training, no-grad} x {static first shape, dynamic length} x
{block-diagonal mask, none (one sample per row)} x {one row, several} x {decoder layer, vision
block}. With ``fullgraph=True`` reaching the limit is an error in the middle of a run."""


def compiles_in_full_graph(block: torch.nn.Module, *, compute_dtype: torch.dtype | None = None,
                           device_type: str | None = None) -> tuple[bool, str]:
    """Whether ``block`` compiles without graph breaks where it will run, and if not, why.

    - Qwen2.5-VL's vision blocks under sdpa / eager attention split their sequence into one
      attention call per image window at ``cu_seqlens.tolist()`` (a data-dependent Python list): no
      full graph. Under a flash-style attention (transformers: ``"flash"`` in the implementation's
      name) they pass ``cu_seqlens`` to one varlen kernel and compile whole.
    - A decoder layer under :data:`~cosmos_primitives.parallel.varlen_attention.VARLEN_ATTENTION`
      compiles whole on its varlen kernels (a CUDA device, bfloat16 / float16 compute, a head size
      they take); elsewhere it attends sample by sample at offsets read on the host.

    Args:
        compute_dtype: the dtype the block computes in (``[policy] dtype``; None: its weights').
        device_type: where it will run (None: its weights' device).
    """
    from cosmos_primitives.parallel.varlen_attention import VARLEN_ATTENTION, varlen_kernel_name

    attention = getattr(block, "self_attn", None) or getattr(block, "attn", None)
    config = getattr(attention, "config", None)
    implementation = (getattr(config, "_attn_implementation", None) or "eager") if config is not None else None
    if "VisionBlock" in type(block).__name__ and implementation is not None and "flash" not in implementation:
        return False, (f"its attention ({implementation!r}) splits each row at cu_seqlens.tolist(), a "
                       "data-dependent number of calls; a flash-style (varlen) attention compiles")
    if implementation == VARLEN_ATTENTION:
        weight = next(block.parameters())
        dtype, device = compute_dtype or weight.dtype, device_type or weight.device.type
        # a one-element query of the block's head size stands for its calls: the kernel choice
        # depends on device, dtype and head size only
        query = torch.empty(1, 1, getattr(attention, "head_dim", config.hidden_size // config.num_attention_heads),
                            dtype=dtype, device=device)
        if varlen_kernel_name(query, query) == "sdpa_per_sample":
            return False, (f"{VARLEN_ATTENTION} attention in {dtype} on {device} runs sample by sample at offsets "
                           "read on the host (its varlen kernels need CUDA and bfloat16 / float16)")
    return True, ""


class CompiledBlocks(NamedTuple):
    """What :func:`apply_compile` did: class names of the compiled blocks (one per block, in
    registration order) and, per block class left as it was, why."""

    compiled: list[str]
    skipped: dict[str, str]

    def summary(self) -> str:
        """One log line: ``Qwen2DecoderLayer x 28; not compiled: Qwen2_5_VLVisionBlock (why)``."""
        counts = {name: self.compiled.count(name) for name in dict.fromkeys(self.compiled)}
        text = ", ".join(f"{name} x {n}" for name, n in counts.items()) or "no block"
        if self.skipped:
            text += "; not compiled: " + "; ".join(f"{name} ({why})" for name, why in self.skipped.items())
        return text


def apply_compile(model: torch.nn.Module, *, backend: str | Callable[..., Any] = "inductor",
                  block_classes: Iterable[str | type] | None = None, fullgraph: bool = True,
                  compute_dtype: torch.dtype | None = None, device_type: str | None = None) -> CompiledBlocks:
    """Compile every transformer block of ``model`` in place (``module.compile``: names, state-dict
    keys and parameters unchanged).

    Blocks that cannot be one graph (:func:`compiles_in_full_graph`) are left as they are.
    Raises ``torch._dynamo.config.recompile_limit`` to at least :data:`RECOMPILE_LIMIT` (a process-wide
    setting, as torchtitan sets its own).

    Args:
        model: the model (before FSDP2; blocks found as :func:`~cosmos_primitives.parallel.fsdp.find_blocks`).
        backend: ``torch.compile`` backend (``"inductor"``; tests count graphs with ``"eager"``).
        block_classes: block class names or types; default: the HF ``_no_split_modules``.
        fullgraph: a graph break raises at the first forward instead of running in pieces.
        compute_dtype, device_type: where and in what the blocks will compute (FSDP2 casts and
            moves them later), for :func:`compiles_in_full_graph`; None: their weights' now.

    Returns:
        :class:`CompiledBlocks` (``.summary()`` is the log line).
    """
    dynamo_config = torch._dynamo.config
    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, RECOMPILE_LIMIT)
    compiled: list[str] = []
    skipped: dict[str, str] = {}
    for block in find_blocks(model, block_classes):
        ok, why = compiles_in_full_graph(block, compute_dtype=compute_dtype, device_type=device_type)
        if not ok:
            skipped[type(block).__name__] = why
            continue
        block.compile(backend=backend, fullgraph=fullgraph)
        compiled.append(type(block).__name__)
    return CompiledBlocks(compiled, skipped)
