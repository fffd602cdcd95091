"""The fork server that :func:`~cosmos_primitives.testing.run_distributed` ranks and
:func:`~cosmos_primitives.testing.forked_script.start_script` scripts are forked from.

One per calling process (:mod:`multiprocessing.forkserver`): it imports :data:`FORKSERVER_PRELOAD` once,
when it starts, and every process forked from it starts with those modules loaded, where a fresh
interpreter would spend 4-5 CPU-s importing them again.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.context import ForkServerContext

# What the fork server imports once for every process it forks; a name that is not installed is skipped.
# The library's modules are those the example recipes import (tests/test_forked_script.py checks the
# list against them); the third-party ones are what the recipes go on to import.
FORKSERVER_PRELOAD = (
    "torch",
    "torch.distributed.checkpoint",
    "torch.distributed.fsdp",
    "torch.distributed.tensor",
    "transformers",
    "transformers.models.qwen2.modeling_qwen2",
    "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl",
    "transformers.models.qwen3.modeling_qwen3",
    "transformers.models.qwen3_vl.modeling_qwen3_vl",
    "aiohttp",
    "av",
    "datasets",
    "matplotlib.pyplot",
    "peft",
    "redis",
    "safetensors.torch",
    "cosmos_primitives",
    "cosmos_primitives.testing",
    "cosmos_primitives.parallel.distributed",
    "cosmos_primitives.policy",
    "cosmos_primitives.algo.distillation",
    "cosmos_primitives.algo.sft_objective",
    "cosmos_primitives.checkpoint",
    "cosmos_primitives.config",
    "cosmos_primitives.data",
    "cosmos_primitives.data.conversation",
    "cosmos_primitives.data.mcq",
    "cosmos_primitives.data.media",
    "cosmos_primitives.data.records",
    "cosmos_primitives.eval",
    "cosmos_primitives.policy.distill",
    "cosmos_primitives.policy.teacher",
    "cosmos_primitives.queue",
    "cosmos_primitives.queue.claimed_prompts",
    "cosmos_primitives.queue.disaggregated_plan",
    "cosmos_primitives.queue.job_registry",
    "cosmos_primitives.queue.prompt_claims",
    "cosmos_primitives.queue.record",
    "cosmos_primitives.queue.record_groups",
    "cosmos_primitives.queue.record_metrics",
    "cosmos_primitives.queue.rollback",
    "cosmos_primitives.queue.run_control",
    "cosmos_primitives.queue.trained_prompts",
    "cosmos_primitives.rewards",
    "cosmos_primitives.rewards.remote",
    "cosmos_primitives.rollout.episodes",
    "cosmos_primitives.rollout.flow_sampler",
    "cosmos_primitives.rollout.multi_turn",
    "cosmos_primitives.rollout.partial",
    "cosmos_primitives.sync",
    "cosmos_primitives.sync.run_auth",
    "cosmos_primitives.utils",
)


def fork_server_context() -> ForkServerContext:
    """The ``forkserver`` multiprocessing context, its server set to preload :data:`FORKSERVER_PRELOAD`
    (the list is read when this process's server first starts)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    return ctx
