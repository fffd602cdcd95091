"""``[rollout]``: the generation engine and its sampling parameters."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from cosmos_primitives.config.base import AtLeastOne, Fraction, NonNegative, NonNegativeInt, Section
from cosmos_primitives.config.policy import ParallelismConfig


class SamplingConfig(Section):
    """``[rollout.sampling_config]``."""

    temperature: NonNegative = 1.0
    top_p: Fraction = 1.0
    top_k: int = -1
    repetition_penalty: float = 1.0


class MultiTurnConfig(Section):
    """``[rollout.multi_turn_config]`` (cosmos-rl's keys, plus ``environment``): each prompt becomes an
    episode of at most ``max_assistant_turns`` model turns, the environment answering each
    (``cp.rollout.multi_turn.run_episodes``)."""

    enable: bool = False
    max_assistant_turns: AtLeastOne = 5
    # true: the environment's replies enter the chat as tool responses (QWEN_TOOL_REPLY); false: as they are
    enable_tools: bool = False
    # "module:function" (or "path/to/file.py:function"): env(episode) -> EnvReply, called after every model
    # turn; unset: no environment, so an episode ends after its first turn, as cosmos-rl's default data
    # packer (no tool agent) ends it. cosmos-rl takes tools from the data packer its launcher script builds.
    environment: str = ""
    # new tokens of one model turn at most (ours; 0: [rollout] max_response_length, the whole episode's
    # budget, as cosmos-rl): a smaller value leaves room in the episode for the replies and later turns
    max_tokens_per_turn: NonNegativeInt = 0


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
    # partial rollouts (ours; slime's --partial-rollout, cosmos-rl has none): > 0, the rollout job generates in
    # chunks of this many new tokens and takes a newer published weight version between chunks; a cut
    # completion goes on under it, each token keeping the log-prob of the weights that sampled it. 0: off
    partial_rollout_chunk_tokens: NonNegativeInt = 0
    sampling_config: SamplingConfig = msgspec.field(default_factory=SamplingConfig)
    multi_turn_config: MultiTurnConfig = msgspec.field(default_factory=MultiTurnConfig)
