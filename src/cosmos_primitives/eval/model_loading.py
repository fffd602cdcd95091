"""Turn what the user names as "the model" into a rollout engine for evaluation.

Accepted: a rollout engine (used as is), an in-memory HF model with its processor, or a path /
hub name of a Hugging Face folder such as an exported ``<run>/safetensors/final`` (loaded with
``from_pretrained``; vision-language models through ``AutoModelForImageTextToText``, text models
through ``AutoModelForCausalLM``), run by ``HFRolloutEngine`` or, with ``backend = "vllm"``, by
``VLLMRolloutEngine``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from cosmos_primitives.rollout.base import RolloutEngine

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``"auto"``: bfloat16 on CUDA, float32 elsewhere; else the named dtype."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"[eval] dtype must be 'auto' or one of {sorted(_DTYPES)}, got {dtype!r}")
    return _DTYPES[dtype]


def _check_model_path(model: str | Path) -> str:
    path = Path(model).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"model folder {path} has no config.json; pass an exported checkpoint folder "
                f"(<output_dir>/<timestamp>/safetensors/final) or a Hugging Face model folder")
        return str(path)
    if str(model).startswith((".", "/", "~")) or str(model).count("/") != 1:
        raise FileNotFoundError(f"model path {model} does not exist (nor is it a 'org/name' hub id)")
    return str(model)  # a hub id, resolved by from_pretrained


def load_processor(model: str | Path) -> Any:
    """The processor (VLM) or tokenizer (text model) saved with a model folder."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(_check_model_path(model))


def load_hf_model(model: str | Path, *, dtype: str = "auto", device: str | torch.device | None = None) -> Any:
    """Load a HF folder for generation (eval mode) on ``device`` (default: CUDA when available)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    name = _check_model_path(model)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    target = torch.device(device)
    config = AutoConfig.from_pretrained(name)
    auto = AutoModelForImageTextToText if getattr(config, "vision_config", None) is not None else AutoModelForCausalLM
    loaded = auto.from_pretrained(name, dtype=resolve_dtype(dtype, target))
    return loaded.to(target).eval()


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
        return VLLMRolloutEngine(_check_model_path(model), processor, tensor_parallel_size=tp_size, dtype=vllm_dtype,
                                 max_model_len=max_model_len, seed=seed)
    from cosmos_primitives.rollout.hf_engine import HFRolloutEngine

    return HFRolloutEngine(load_hf_model(model, dtype=dtype, device=device), processor,
                           max_batch_sequences=max_batch_sequences)
