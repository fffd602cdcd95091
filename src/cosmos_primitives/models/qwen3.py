"""Qwen3 text models (``Qwen3ForCausalLM``): the Qwen2 names, plus per-head ``self_attn.q_norm`` /
``self_attn.k_norm`` weights that every layout keeps under their own names (vLLM's ``Qwen3Attention``
holds them as ``q_norm`` / ``k_norm`` too); q / k / v carry no biases.
"""

import attrs

from cosmos_primitives.models.qwen2 import QWEN2

QWEN3 = attrs.evolve(QWEN2, model_type="qwen3")
