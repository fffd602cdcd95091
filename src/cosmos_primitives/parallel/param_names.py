"""Parameter names without the path parts that module wrappers insert."""

from __future__ import annotations

# Module wrappers that insert a path component without changing the model: activation
# checkpointing, torch.compile, FSDP1. FSDP2 (fully_shard) keeps names as they are.
WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def clean_name(name: str) -> str:
    """``layers.0._checkpoint_wrapped_module.mlp.weight`` -> ``layers.0.mlp.weight``."""
    for part in WRAPPER_PARTS:
        name = name.replace(part, "")
    return name
