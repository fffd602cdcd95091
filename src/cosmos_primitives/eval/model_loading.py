"""Turn what the user names as "the model" into a rollout engine for evaluation.

Accepted: a rollout engine (used as is), an in-memory HF model with its processor, or a path /
hub name of a Hugging Face folder such as an exported ``<run>/safetensors/final`` (loaded with
``cp.policy.load_hf_model``, the trainer's loader), run by ``HFRolloutEngine`` or, with
``backend = "vllm"``, by ``VLLMRolloutEngine``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from cosmos_primitives.policy.hf_loading import load_hf_model, load_processor
from cosmos_primitives.rollout.base import RolloutEngine

STANDALONE_GPU_MEMORY_UTILIZATION = 0.9
"""vLLM's own default: the share of the GPU an evaluation engine takes when nothing else runs there."""


def _default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_eval_engine(model: Any, processor: Any = None, *, backend: str = "hf", dtype: str = "auto",
                     device: str | torch.device | None = None, tp_size: int = 1, max_model_len: int | None = None,
                     seed: int = 1, max_batch_sequences: int = 64) -> RolloutEngine:
    """A rollout engine for ``model``.

    Args:
        model: a :class:`RolloutEngine` (returned unchanged), a HF model object (``processor``
            required), or a folder path / hub id.
        processor: the model's processor; loaded from the folder when ``model`` is a path.
        backend: ``"hf"`` or ``"vllm"`` (paths only; needs the ``vllm`` extra and a GPU).
        dtype: weights dtype for loading (``"auto"``: bfloat16 on CUDA, float32 on CPU).
        device: HF backend device (default: CUDA when available, else CPU).
        tp_size, max_model_len, seed: vLLM ``tensor_parallel_size``, ``max_model_len`` and ``seed``.
        max_batch_sequences: HF backend: sequences per ``generate`` call.
    """
    if isinstance(model, RolloutEngine):
        return model
    if backend not in ("hf", "vllm"):
        raise ValueError(f"[eval] backend must be 'hf' or 'vllm', got {backend!r}")
    if isinstance(model, torch.nn.Module):
        if backend != "hf":
            raise ValueError("an in-memory model runs with backend 'hf'; pass a folder path for vLLM")
        if processor is None:
            raise ValueError("an in-memory model needs its processor (processor=...)")
        from cosmos_primitives.rollout.hf_engine import HFRolloutEngine

        return HFRolloutEngine(model, processor, max_batch_sequences=max_batch_sequences)
    if not isinstance(model, (str, Path)):
        raise TypeError(f"model must be a rollout engine, a torch module or a path, got {type(model).__name__}")
    processor = processor if processor is not None else load_processor(model)
    if backend == "vllm":
        from cosmos_primitives.rollout.vllm_engine import VLLMRolloutEngine

        vllm_dtype = "bfloat16" if dtype == "auto" else dtype
        # evaluation has the GPU to itself: no trainer beside it, so vLLM may take most of it
        return VLLMRolloutEngine(str(Path(model).expanduser()), processor, tensor_parallel_size=tp_size,
                                 dtype=vllm_dtype, max_model_len=max_model_len, seed=seed,
                                 gpu_memory_utilization=STANDALONE_GPU_MEMORY_UTILIZATION)
    from cosmos_primitives.rollout.hf_engine import HFRolloutEngine

    target = torch.device(device) if device is not None else _default_device()
    hf_model = load_hf_model(model, dtype=dtype, device=target).eval()
    return HFRolloutEngine(hf_model, processor, max_batch_sequences=max_batch_sequences)
