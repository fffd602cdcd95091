"""Plain weights of a peft LoRA model: its adapted layers, and ``W + s * B A`` folded into ``W``.

An adapted linear layer computes ``W x + b + s * B (A x)`` with ``s = lora_alpha / r``, ``A``
``[r, in]``, ``B`` ``[out, r]``. Exported checkpoints (:mod:`.safetensors_export`) and rollout
engines (``cp.sync``) need plain weights under the layer's original parameter names; the policy
(``cp.policy.lora``) adds the adapters and switches them off for the KL reference.
"""

from __future__ import annotations

import torch

from cosmos_primitives.parallel.param_names import clean_name

ADAPTER_PARTS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector")
"""Sub-module names peft adds inside an adapted layer (besides ``base_layer``)."""


def lora_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The peft-adapted layers of ``model`` (those with ``base_layer`` + ``lora_A``) by module name,
    without wrapper parts such as ``_checkpoint_wrapped_module.`` (state-dict names)."""
    return {clean_name(name): m for name, m in model.named_modules()
            if hasattr(m, "base_layer") and isinstance(getattr(m, "lora_A", None), torch.nn.ModuleDict)}


def has_lora(model: torch.nn.Module) -> bool:
    return bool(lora_layers(model))


def active_adapters(layer: torch.nn.Module) -> list[str]:
    """The adapters of ``layer`` that its forward applies (none while adapters are disabled).

    Raises:
        NotImplementedError: a DoRA adapter or a transposed (``fan_in_fan_out``) weight.
    """
    if getattr(layer, "disable_adapters", False) or getattr(layer, "merged", False):
        return []
    names = [a for a in layer.active_adapters if a in layer.lora_A]
    for a in names:
        if getattr(layer, "use_dora", {}).get(a, False):
            raise NotImplementedError(f"adapter '{a}' is DoRA; merging DoRA weights is not supported")
    if getattr(layer, "fan_in_fan_out", False):
        raise NotImplementedError("LoRA on a fan_in_fan_out (Conv1D) weight is not supported")
    return names


def merged_weight(base: torch.Tensor, pairs: list[tuple[torch.Tensor, torch.Tensor, float]]) -> torch.Tensor:
    """``base + sum(s * B @ A)`` over ``(A [r, in], B [out, r], s)``, computed in float32 and
    returned in ``base``'s dtype (``base`` ``[out, in]``)."""
    if not pairs:
        return base
    out = base.float()
    for a, b, scale in pairs:
        out = out + scale * (b.float() @ a.float())
    return out.to(base.dtype)


def merge_lora_state_dict(state_dict: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A full state dict of the LoRA model ``model`` with the adapters folded in, under the base
    model's names (``q_proj.base_layer.weight`` + ``lora_A/B`` -> ``q_proj.weight``).

    ``state_dict`` holds full (gathered) tensors named like ``model.state_dict()``; names of
    layers without adapters pass through unchanged.
    """
    layers = lora_layers(model)
    if not layers:
        return state_dict
    out = dict(state_dict)
    for prefix, layer in layers.items():
        adapters = active_adapters(layer)
        for key in [k for k in out if k.startswith(prefix + ".base_layer.")]:
            out[prefix + "." + key[len(prefix) + len(".base_layer."):]] = out.pop(key)
        weight_key = prefix + ".weight"
        pairs = [(out[f"{prefix}.lora_A.{a}.weight"], out[f"{prefix}.lora_B.{a}.weight"], float(layer.scaling[a]))
                 for a in adapters]
        if weight_key in out:
            out[weight_key] = merged_weight(out[weight_key], pairs)
        for part in ADAPTER_PARTS:
            for key in [k for k in out if k.startswith(f"{prefix}.{part}.")]:
                del out[key]
    return out
