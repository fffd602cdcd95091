"""Qwen3-VL (``Qwen3VLForConditionalGeneration``, the Cosmos-Reason2 architecture).

Unlike Qwen2.5-VL, the trainer's names ARE the checkpoint names: the hub checkpoints of Qwen3-VL
and what ``save_pretrained`` of transformers 5 writes for it (the names of ``named_parameters()``,
tests/test_sync.py checks it) are ``model.language_model.*``, ``model.visual.*`` and, when the head
is untied (8B), ``lm_head.*``.
The 2B ties ``lm_head`` to ``model.language_model.embed_tokens`` and stores no ``lm_head``.

vLLM's names, checked against ``vllm/model_executor/models/qwen3_vl.py`` of vLLM v0.11.0 (commit
002d7b939754) and of a later main (commit 4f5768c74b6f, the ``"qkv": ["qkv"]`` packed-modules entry
added), which agree on everything below:

- ``hf_to_vllm_mapper``: ``model.visual.`` -> ``visual.``, ``lm_head.`` -> ``language_model.lm_head.``,
  ``model.language_model.`` -> ``language_model.model.`` (``Qwen3LLMForCausalLM`` nests its
  ``Qwen3LLMModel`` as ``.model``; with a tied head its ``lm_head`` IS ``model.embed_tokens``).
- ``packed_modules_mapping``: ``qkv_proj`` = q / k / v and ``gate_up_proj`` = gate / up, in the
  language model only (``Qwen3Model``'s layers; ``q_norm`` / ``k_norm`` kept under their own names).
  The vision blocks keep HF's one ``attn.qkv`` and an ungated MLP (``mlp.linear_fc1`` /
  ``linear_fc2``), so nothing of ``visual.*`` is fused; ``merger`` and ``deepstack_merger_list.<i>``
  (``norm``, ``linear_fc1``, ``linear_fc2``), ``patch_embed.proj`` and ``pos_embed`` keep their names.
"""

from cosmos_primitives.models.name_maps import FamilyNameMap
from cosmos_primitives.models.qwen2 import GATE_UP, QKV

QWEN3_VL = FamilyNameMap(
    model_type="qwen3_vl",
    prefixes={
        "hf_checkpoint": (
            ("model.language_model.", "model.language_model."),
            ("model.visual.", "model.visual."),
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
