"""Qwen2 / Qwen2.5 text models (``Qwen2ForCausalLM``): trainer names ``model.*``, ``lm_head.*``.

On disk the names are the same. vLLM's ``Qwen2ForCausalLM`` keeps them too, with the attention
projections packed into ``self_attn.qkv_proj`` and the MLP's gate / up into ``mlp.gate_up_proj``.
"""

from cosmos_primitives.models.name_maps import FamilyNameMap, Fusion

QKV = Fusion("self_attn.qkv_proj", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"))
GATE_UP = Fusion("mlp.gate_up_proj", ("mlp.gate_proj", "mlp.up_proj"))

_SAME = (("model.", "model."), ("lm_head.", "lm_head."))

QWEN2 = FamilyNameMap(
    model_type="qwen2",
    prefixes={"hf_checkpoint": _SAME, "vllm": _SAME},
    fusions={"vllm": (QKV, GATE_UP)},
    tied=("lm_head.weight", "model.embed_tokens.weight"),
)
