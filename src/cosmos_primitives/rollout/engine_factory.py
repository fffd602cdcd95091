"""``[rollout] backend`` -> a rollout engine, and the weight-sync layout that engine takes."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from cosmos_primitives.config.rollout import RolloutConfig
from cosmos_primitives.utils.engine_choice import resolve_backend


def build_rollout_engine(cfg: RolloutConfig, model_path: str, processor: Any, *, dtype: str = "bfloat16",
                         device: torch.device | str = "cpu", seed: int = 0,
                         max_model_len: int | None = None, colocated: bool = True,
                         engine_ranks: Sequence[int] | None = None) -> tuple[Any, torch.nn.Module | None]:
    """The engine ``[rollout]`` asks for, loaded from ``model_path`` (a HF folder or hub name).

    ``backend = "auto"`` is resolved here (:func:`~cosmos_primitives.utils.engine_choice.resolve_backend`,
    logged). ``"hf"``: :class:`~cosmos_primitives.rollout.hf_engine.HFRolloutEngine` over a HF
    model in ``dtype`` on ``device`` (``batch_size`` sequences per ``generate`` call; ``hf_static_cache``:
    its static KV cache, compiled with CUDA graphs on CUDA). ``"vllm"``:
    :class:`~cosmos_primitives.rollout.vllm_engine.VLLMRolloutEngine` (``gpu_memory_utilization``,
    ``enforce_eager``, ``max_num_batched_tokens``, ``limit_mm_per_prompt``, ``mm_processor_kwargs``) in this
    process on this rank's GPU (vLLM's external launcher under torchrun);
    ``colocated``: a trainer shares the GPU, so the engine sleeps between rollouts; ``engine_ranks``:
    the global ranks that build an engine (default: all).

    Returns:
        ``(engine, engine_model)``: ``engine_model`` is the HF engine's module (the target weight
        sync writes into, layout ``"hf"``), None for vLLM (sync through the engine's
        ``update_weights``, layout :func:`sync_layout`).

    ``[rollout.parallelism] tp_size`` (vLLM only) is the engine's ``tensor_parallel_size``: under torchrun
    the ranks form engines of ``tp_size`` consecutive ranks, the ``"tp"`` groups of a
    :class:`~cosmos_primitives.parallel.mesh.ParallelMesh` over ``[rollout.parallelism]`` (built here,
    collectively: every rank of the job calls this together); the other rollout sizes must stay 1
    (``dp_shard_size`` takes the rest: the independent engines).

    Raises:
        ValueError: ``tp_size > 1`` with ``backend = "hf"`` (with ``"auto"`` choosing HF, as on a
            machine without vLLM or a GPU, a warning says tp_size is not used); ``[rollout.parallelism]`` pp / cp /
            dp sizes that vLLM's layout cannot take; ``backend = "vllm"`` on only some ranks of the
            job, or a ``tp_size`` that does not divide it (see
            :func:`~cosmos_primitives.rollout.vllm_engine.launcher_settings`).
    """
    tp = cfg.parallelism.tp_size
    if resolve_backend(cfg.backend) == "hf":
        if tp > 1 and cfg.backend == "auto":  # a file written for vLLM, run where vLLM cannot run
            logging.getLogger("cosmos").warning(
                f"[rollout.parallelism] tp_size = {tp} is vLLM's engine split; backend = \"auto\" chose the HF "
                "engine on this machine, which runs one whole model per rank: tp_size is not used")
        elif tp > 1:
            raise ValueError(
                f"[rollout.parallelism] tp_size = {tp} with [rollout] backend = \"hf\": the HF engine runs one "
                "whole model per rank and cannot shard it. Use backend = \"vllm\" (install the vLLM extra: "
                "pip install 'cosmos_primitives[vllm]'; it needs a GPU) or set tp_size = 1"
            )
        from cosmos_primitives.policy.hf_loading import load_hf_model
        from cosmos_primitives.rollout.hf_engine import HFRolloutEngine

        model = load_hf_model(model_path, dtype=dtype).eval().to(device)
        engine = HFRolloutEngine(model, processor, max_batch_sequences=cfg.batch_size, static_cache=cfg.hf_static_cache)
        return engine, model
    from cosmos_primitives.rollout.vllm_engine import VLLMRolloutEngine, launcher_settings

    par = cfg.parallelism
    others = {"pp_size": par.pp_size, "cp_size": par.cp_size, "dp_replicate_size": par.dp_replicate_size}
    if any(v != 1 for v in others.values()):
        raise ValueError(
            f"[rollout.parallelism] {', '.join(f'{k} = {v}' for k, v in others.items() if v != 1)} with backend = "
            "\"vllm\": the engine takes tensor parallelism only (tp_size; dp_shard_size = -1 makes the rest "
            "independent engines); set them to 1"
        )
    tp_group = None
    if tp > 1 and launcher_settings(engine_ranks, tp):
        from cosmos_primitives.parallel.mesh import ParallelMesh

        tp_group = ParallelMesh(par).group("tp")
    engine = VLLMRolloutEngine(model_path, processor, tensor_parallel_size=tp,
                               gpu_memory_utilization=cfg.gpu_memory_utilization, enforce_eager=cfg.enforce_eager,
                               dtype=dtype, max_model_len=max_model_len, seed=seed, sleep_level=1 if colocated else 0,
                               engine_ranks=engine_ranks, tp_group=tp_group,
                               max_num_batched_tokens=cfg.max_num_batched_tokens,
                               limit_mm_per_prompt=cfg.limit_mm_per_prompt, mm_processor_kwargs=cfg.mm_processor_kwargs)
    return engine, None


def sync_layout(cfg: RolloutConfig) -> str:
    """Parameter names the engine of ``cfg`` takes: ``"hf"`` (same module tree) or ``"hf_checkpoint"``
    (vLLM's ``load_weights``, which fuses and shards itself)."""
    return "hf" if resolve_backend(cfg.backend, log=False) == "hf" else "hf_checkpoint"
