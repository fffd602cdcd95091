"""Generation engines behind one interface (HF ``generate``, vLLM) and the flow-matching SDE sampler.

Names load on first use (the HF engine imports transformers, the vLLM engine needs the ``vllm``
extra). The record types engines speak in and the prompt encoding are defined in ``cp.data`` and
re-exported here.
"""

from __future__ import annotations

import importlib
from typing import Any

from cosmos_primitives.data.prompt_inputs import encode_prompts as encode_prompts
from cosmos_primitives.data.prompt_inputs import render_prompt as render_prompt
from cosmos_primitives.data.prompt_inputs import repeat_batch as repeat_batch
from cosmos_primitives.data.records import Completion as Completion
from cosmos_primitives.data.records import Prompt as Prompt
from cosmos_primitives.data.records import RolloutGroup as RolloutGroup
from cosmos_primitives.data.records import SamplingParams as SamplingParams

_EXPORTS = {
    "RolloutEngine": "base",
    "HFRolloutEngine": "hf_engine",
    "build_rollout_engine": "engine_factory",
    "sync_layout": "engine_factory",
    "InverseCDFSampler": "token_sampler",
    "VLLMRolloutEngine": "vllm_engine",
    "CosmosWorkerExtension": "vllm_engine",
    "SDEParams": "flow_sde",
    "gaussian_log_prob": "flow_sde",
    "gaussian_mean_kl": "flow_sde",
    "ode_step": "flow_sde",
    "sde_std_t": "flow_sde",
    "sde_step_stats": "flow_sde",
    "FlowTrajectory": "flow_sampler",
    "StepRecompute": "flow_sampler",
    "VelocityFn": "flow_sampler",
    "diffusers_velocity_fn": "flow_sampler",
    "cosmos_velocity_fn": "flow_sampler",
    "flow_velocity_fn": "flow_sampler",
    "flow_sigmas": "flow_sampler",
    "guided_velocity": "flow_sampler",
    "recompute_step": "flow_sampler",
    "sample_flow": "flow_sampler",
    "sde_window": "flow_sampler",
    "sliding_sde_window": "flow_sampler",
    "to_diffusers_guidance": "flow_sampler",
    "decode_video": "flow_vae",
    "encode_video": "flow_vae",
    "video_to_uint8": "flow_vae",
}

__all__ = sorted([*_EXPORTS, "Completion", "Prompt", "RolloutGroup", "SamplingParams", "encode_prompts",
                  "render_prompt", "repeat_batch"])


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"cosmos_primitives.rollout.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'cosmos_primitives.rollout' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
