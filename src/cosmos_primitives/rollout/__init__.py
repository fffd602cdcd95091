"""Generation engines behind one interface (HF ``generate``, vLLM) and the flow-matching SDE sampler.

Names load on first use (the HF engine imports transformers, the vLLM engine needs the ``vllm``
extra). The record types engines speak in (``Prompt``, ``Completion``, ...) and the prompt encoding
live in ``cp.data``.
"""

from __future__ import annotations

from cosmos_primitives.utils.lazy_module import lazy_exports

_EXPORTS = {
    "RolloutEngine": "base",
    "HFRolloutEngine": "hf_engine",
    "build_rollout_engine": "engine_factory",
    "sync_layout": "engine_factory",
    "InverseCDFSampler": "token_sampler",
    "VLLMRolloutEngine": "vllm_engine",
    "CosmosWorkerExtension": "vllm_engine",
    "launcher_settings": "vllm_engine",
    "flow_sigmas": "flow_sampler",
    "sample_flow": "flow_sampler",
    "sde_window": "flow_sampler",
    "sliding_sde_window": "flow_sampler",
    "decode_video": "flow_vae",
    "encode_video": "flow_vae",
    "video_to_uint8": "flow_vae",
}

__all__ = [  # the public surface (tests/test_public_surface.py); the rest by module path
    "HFRolloutEngine", "RolloutEngine", "VLLMRolloutEngine", "build_rollout_engine", "decode_video",
    "encode_video", "flow_sigmas", "sample_flow", "sde_window", "sliding_sde_window", "sync_layout",
    "video_to_uint8",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
