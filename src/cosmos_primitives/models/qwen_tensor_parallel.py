"""Tensor parallelism (Megatron-style column / row splits) for Qwen2-style decoder layers.

These are the layers of Qwen2 / Qwen2.5 and Qwen3 text models and the text decoders of Qwen2.5-VL
(Cosmos-Reason1) and Qwen3-VL (Cosmos-Reason2): any layer with ``self_attn.{q,k,v,o}_proj`` and
``mlp.{gate,up,down}_proj`` linears. Per decoder layer: ``q_proj`` / ``k_proj`` / ``v_proj`` and
``gate_proj`` / ``up_proj`` are split by output features (``ColwiseParallel``: each rank holds
``heads / tp`` attention heads and ``intermediate / tp`` MLP features), ``o_proj`` / ``down_proj`` by
input features (``RowwiseParallel``: partial sums all-reduced). Layer inputs and outputs stay
replicated plain tensors, so norms, embeddings, the LM head and the vision tower are untouched
(replicated over tp) and the chunked log-prob head works unchanged. Qwen3's per-head ``q_norm`` /
``k_norm`` (weights of ``head_dim``) apply to each rank's own heads unchanged, and Qwen3-VL's deepstack
features are added to a layer's replicated output, so both need no entry in the plan. The vision
blocks (one ``attn.qkv``; a gated or ``linear_fc1`` / ``linear_fc2`` MLP) do not match and stay whole.
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

ATTENTION_COLWISE = ("q_proj", "k_proj", "v_proj")
ATTENTION_ROWWISE = ("o_proj",)
MLP_COLWISE = ("gate_proj", "up_proj")
MLP_ROWWISE = ("down_proj",)


def qwen2_layer_plan() -> dict[str, ColwiseParallel | RowwiseParallel]:
    """The ``parallelize_module`` plan of one Qwen2 / Qwen3 / Qwen2.5-VL / Qwen3-VL text decoder layer."""
    plan: dict[str, ColwiseParallel | RowwiseParallel] = {}
    for name in ATTENTION_COLWISE:
        plan[f"self_attn.{name}"] = ColwiseParallel()
    for name in ATTENTION_ROWWISE:
        plan[f"self_attn.{name}"] = RowwiseParallel()
    for name in MLP_COLWISE:
        plan[f"mlp.{name}"] = ColwiseParallel()
    for name in MLP_ROWWISE:
        plan[f"mlp.{name}"] = RowwiseParallel()
    return plan


def _is_qwen2_layer(module: torch.nn.Module) -> bool:
    attn, mlp = getattr(module, "self_attn", None), getattr(module, "mlp", None)
    return (
        attn is not None and mlp is not None
        and all(isinstance(getattr(attn, n, None), torch.nn.Linear) for n in (*ATTENTION_COLWISE, *ATTENTION_ROWWISE))
        and all(isinstance(getattr(mlp, n, None), torch.nn.Linear) for n in (*MLP_COLWISE, *MLP_ROWWISE))
    )


def apply_tensor_parallel(model: torch.nn.Module, tp_mesh: DeviceMesh) -> int:
    """Apply :func:`qwen2_layer_plan` to every Qwen2-style decoder layer of ``model`` in place.

    Apply before FSDP (``apply_fsdp`` then shards the TP shards over dp: 2-D parameters).

    Returns:
        The number of layers parallelised.

    Raises:
        ValueError: no such layer was found, or head / KV-head / MLP sizes do not divide by the
            tp size (the message names the sizes).
    """
    tp = tp_mesh.size()
    layers = [m for m in model.modules() if _is_qwen2_layer(m)]
    if not layers:
        raise ValueError(
            f"{type(model).__name__} has no Qwen2-style decoder layers (self_attn.{{q,k,v,o}}_proj + "
            "mlp.{gate,up,down}_proj); tensor parallelism supports Qwen2 / Qwen3 text models and the "
            "Qwen2.5-VL / Qwen3-VL text decoders"
        )
    config = getattr(model, "config", None)
    text_config = getattr(config, "text_config", None) or config
    heads = getattr(text_config, "num_attention_heads", None)
    kv_heads = getattr(text_config, "num_key_value_heads", None) or heads
    intermediate = getattr(text_config, "intermediate_size", None)
    for what, size in (("num_attention_heads", heads), ("num_key_value_heads", kv_heads),
                       ("intermediate_size", intermediate)):
        if size is not None and size % tp:
            raise ValueError(
                f"tp_size={tp} does not divide {what}={size} of {type(model).__name__}; "
                "pick a tp_size that divides the attention heads, KV heads and MLP width"
            )
    plan = qwen2_layer_plan()
    for layer in layers:
        parallelize_module(layer, tp_mesh, plan)
    return len(layers)
