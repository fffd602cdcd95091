"""Activation checkpointing: keep only block inputs in forward, recompute block internals in backward."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from cosmos_primitives.parallel.fsdp import find_blocks


def apply_activation_checkpointing(model: torch.nn.Module, block_classes: Iterable[str | type] | None = None) -> int:
    """Checkpoint every transformer block of ``model`` (non-reentrant), in place; before FSDP.

    Hugging Face models use their own mechanism (``activation_checkpointing_enable``, formerly
    ``gradient_checkpointing_enable``, with ``use_reentrant=False``), which covers language-model
    layers and vision blocks and leaves parameter names unchanged (so ``save_pretrained`` and
    freeze patterns are unaffected). Other modules get ``torch.distributed._composable.checkpoint``
    on each block (hook based, also name-preserving). Both compose with FSDP2: recomputation
    runs inside the block's unsharded window of the backward pass.

    Returns:
        The number of checkpointed blocks.
    """
    blocks = find_blocks(model, block_classes)
    hf_models = [m for m in model.modules() if hasattr(m, "gradient_checkpointing_enable")
                 and getattr(m, "supports_gradient_checkpointing", False)]
    if hf_models and block_classes is None:
        # the outermost HF model enables it for all of its sub-models
        hf = hf_models[0]
        if hasattr(hf, "activation_checkpointing_enable"):  # transformers >= 5.2x name
            hf.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return len(blocks)
    from torch.distributed._composable import checkpoint

    for block in blocks:
        checkpoint(block)
    return len(blocks)
