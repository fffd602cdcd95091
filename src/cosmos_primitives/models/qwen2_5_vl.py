"""Qwen2.5-VL (``Qwen2_5_VLForConditionalGeneration``, the Cosmos-Reason1 architecture).

transformers 5 keeps the language model under ``model.language_model.*`` and the vision tower
under ``model.visual.*`` in memory, but reads and writes checkpoints with the older names
``model.*`` (language model) and ``visual.*``. vLLM's module tree nests the language model as
``language_model.model.*`` / ``language_model.lm_head.*`` and keeps ``visual.*``; it packs
``qkv_proj`` / ``gate_up_proj`` in the language model and ``gate_up_proj`` in the vision MLP (the
vision attention is already one ``attn.qkv`` in HF).
"""

from cosmos_primitives.models.name_maps import FamilyNameMap
from cosmos_primitives.models.qwen2 import GATE_UP, QKV

QWEN2_5_VL = FamilyNameMap(
    model_type="qwen2_5_vl",
    prefixes={
        "hf_checkpoint": (
            ("model.language_model.", "model."),
            ("model.visual.", "visual."),
            ("lm_head.", "lm_head."),
        ),
        "vllm": (
            ("model.language_model.", "language_model.model."),
            ("model.visual.", "visual."),
            ("lm_head.", "language_model.lm_head."),
        ),
    },
    fusions={"vllm": (QKV, GATE_UP)},
    tied=("lm_head.weight", "model.language_model.embed_tokens.weight"),
)
