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


def compiles_in_full_graph(block: torch.nn.Module) -> tuple[bool, str]:
    """Whether ``block`` can be compiled without graph breaks, and if not, why.

    Qwen2.5-VL's vision blocks under sdpa / eager attention split their sequence into one attention
    call per image window at ``cu_seqlens.tolist()`` (a data-dependent Python list): no full graph.
    Under a flash-style attention (transformers: ``"flash"`` in the implementation's name) they pass
    ``cu_seqlens`` to one varlen kernel and compile whole.
    """
    config = getattr(getattr(block, "attn", None), "config", None)
    if "VisionBlock" in type(block).__name__ and config is not None:
        implementation = getattr(config, "_attn_implementation", None) or "eager"
        if "flash" not in implementation:
            return False, (f"its attention ({implementation!r}) splits each row at cu_seqlens.tolist(), a "
                           "data-dependent number of calls; a flash-style (varlen) attention compiles")
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
                  block_classes: Iterable[str | type] | None = None, fullgraph: bool = True) -> CompiledBlocks:
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

    Returns:
        :class:`CompiledBlocks` (``.summary()`` is the log line).
    """
    dynamo_config = torch._dynamo.config
    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, RECOMPILE_LIMIT)
    compiled: list[str] = []
    skipped: dict[str, str] = {}
    for block in find_blocks(model, block_classes):
        ok, why = compiles_in_full_graph(block)
        if not ok:
            skipped[type(block).__name__] = why
            continue
        block.compile(backend=backend, fullgraph=fullgraph)
        compiled.append(type(block).__name__)
    return CompiledBlocks(compiled, skipped)
