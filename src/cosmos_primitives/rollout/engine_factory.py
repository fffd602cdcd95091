"""``[rollout] backend`` -> a rollout engine, and the weight-sync layout that engine takes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from cosmos_primitives.config.rollout import RolloutConfig


def build_rollout_engine(cfg: RolloutConfig, model_path: str, processor: Any, *, dtype: str = "bfloat16",
                         device: torch.device | str = "cpu", seed: int = 0,
                         max_model_len: int | None = None, colocated: bool = True,
                         engine_ranks: Sequence[int] | None = None) -> tuple[Any, torch.nn.Module | None]:
    """The engine ``[rollout]`` asks for, loaded from ``model_path`` (a HF folder or hub name).

    ``backend = "hf"``: :class:`~cosmos_primitives.rollout.hf_engine.HFRolloutEngine` over a HF
    model in ``dtype`` on ``device`` (``batch_size`` sequences per ``generate`` call). ``"vllm"``:
    :class:`~cosmos_primitives.rollout.vllm_engine.VLLMRolloutEngine` (``gpu_memory_utilization``,
    ``enforce_eager``) in this process on this rank's GPU (vLLM's external launcher under torchrun);
    ``colocated``: a trainer shares the GPU, so the engine sleeps between rollouts; ``engine_ranks``:
    the global ranks that build an engine (default: all).

    Returns:
        ``(engine, engine_model)``: ``engine_model`` is the HF engine's module (the target weight
        sync writes into, layout ``"hf"``), None for vLLM (sync through the engine's
        ``update_weights``, layout :func:`sync_layout`).

    Raises:
        ValueError: ``backend = "vllm"`` with ``[rollout.parallelism] tp_size`` other than 1, or on only
            some ranks of the job (see :func:`~cosmos_primitives.rollout.vllm_engine.launcher_settings`).
    """
    if cfg.backend == "hf":
        from cosmos_primitives.checkpoint.hf_loading import load_hf_model
        from cosmos_primitives.rollout.hf_engine import HFRolloutEngine

        model = load_hf_model(model_path, dtype=dtype).eval().to(device)
        return HFRolloutEngine(model, processor, max_batch_sequences=cfg.batch_size), model
    if cfg.parallelism.tp_size != 1:
        raise ValueError(
            f"[rollout.parallelism] tp_size = {cfg.parallelism.tp_size} with backend = \"vllm\": every rank runs "
            "its own vLLM engine on its own GPU, so set tp_size = 1 (vLLM tensor parallelism across the ranks "
            "of one job is not supported)"
        )
    from cosmos_primitives.rollout.vllm_engine import VLLMRolloutEngine

    engine = VLLMRolloutEngine(model_path, processor, tensor_parallel_size=1,
                               gpu_memory_utilization=cfg.gpu_memory_utilization, enforce_eager=cfg.enforce_eager,
                               dtype=dtype, max_model_len=max_model_len, seed=seed, sleep_level=1 if colocated else 0,
                               engine_ranks=engine_ranks)
    return engine, None


def sync_layout(cfg: RolloutConfig) -> str:
    """Parameter names the engine of ``cfg`` takes: ``"hf"`` (same module tree) or ``"hf_checkpoint"``
    (vLLM's ``load_weights``, which fuses and shards itself)."""
    return "hf" if cfg.backend == "hf" else "hf_checkpoint"
