"""``[rollout]``: the generation engine and its sampling parameters."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from cosmos_primitives.config.base import AtLeastOne, Fraction, NonNegative, Section
from cosmos_primitives.config.policy import ParallelismConfig


class SamplingConfig(Section):
    """``[rollout.sampling_config]``."""

    temperature: NonNegative = 1.0
    top_p: Fraction = 1.0
    top_k: int = -1
    repetition_penalty: float = 1.0


class RolloutConfig(Section):
    """``[rollout]``. The number of samples per prompt lives in ``[grpo]`` (alias ``n_generation``)."""

    # "auto": vLLM when it is installed and a GPU is present, else HF, decided where the engine is built
    # (cp.utils.resolve_backend), so that a file reads the same on every machine
    backend: Literal["auto", "hf", "vllm"] = "auto"
    parallelism: ParallelismConfig = msgspec.field(default_factory=ParallelismConfig)
    max_response_length: AtLeastOne = 1024
    batch_size: AtLeastOne = 8
    seed: int | None = None
    gpu_memory_utilization: Fraction = 0.3
    enforce_eager: bool = True
    include_stop_str_in_output: bool = False
    # backend "hf": decode into a static KV cache kept across calls, compiled with CUDA graphs on CUDA;
    # off until measured on a GPU (issue 28)
    hf_static_cache: bool = False
    # backend "vllm": bounds on vLLM's start-up profiling run and scheduling, passed to LLM() when set
    # (None: vLLM's defaults); new beside the cosmos-rl keys (cosmos-rl fixes max_num_batched_tokens = 2048)
    max_num_batched_tokens: AtLeastOne | None = None
    limit_mm_per_prompt: dict[str, int] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    sampling_config: SamplingConfig = msgspec.field(default_factory=SamplingConfig)
