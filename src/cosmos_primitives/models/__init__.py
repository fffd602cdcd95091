"""Model-family knowledge in one place (torchtitan's ``models/<family>/``): how each family's
weights, layers and inputs are laid out, for the packages above that load, shard, sync and sample
them.

- :mod:`.lora`: the plain weights of a peft LoRA model (``W + s * B A`` folded in, original names),
  shared by the HF export (``cp.checkpoint``) and the weight sync (``cp.sync``);
- :mod:`.name_maps`: trainer -> rollout-engine weight names, one :class:`FamilyNameMap` per family,
  registered by :mod:`.families` from :mod:`.qwen2` (Qwen2 / Qwen2.5 text), :mod:`.qwen3` (Qwen3
  text), :mod:`.qwen2_5_vl` (Cosmos-Reason1) and :mod:`.qwen3_vl` (Cosmos-Reason2);
- :mod:`.qwen_tensor_parallel`: the tensor-parallel plan of the Qwen text decoder layers (all four
  families);
- :mod:`.cosmos_transformer`: context parallelism inside Cosmos-Predict2.5's transformer;
- :mod:`.flow_transformers`: Cosmos-Predict2.5 / Wan flow transformers called as a velocity field.

The Qwen-VL data-pipeline facts (mRoPE positions, ``cp.data.vl_family``) stay in ``cp.data``: the
data layer sits below this one and its prompt encoding needs them.

Names load on first use.
"""

from __future__ import annotations

from cosmos_primitives.utils.lazy_module import lazy_exports

_EXPORTS = {
    **{n: "name_maps" for n in ("FamilyNameMap", "Fusion", "NameMapError", "UnknownFamilyError", "get_family",
                                "known_families", "map_names", "register_family")},
    "apply_tensor_parallel": "qwen_tensor_parallel",
    "qwen2_layer_plan": "qwen_tensor_parallel",
    "cosmos_velocity_fn": "flow_transformers",
    "diffusers_velocity_fn": "flow_transformers",
    "flow_velocity_fn": "flow_transformers",
}

__all__ = [  # the public surface (tests/test_public_surface.py); the rest by module path
    "FamilyNameMap", "Fusion", "map_names", "register_family",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
