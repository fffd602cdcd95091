"""Load a Hugging Face causal LM (Qwen2, Llama, ...) or vision-language model (Qwen2.5-VL, ...) from a
model folder (e.g. one :mod:`.safetensors_export` wrote) or the Hub.

Below ``policy`` and ``rollout`` so that both the trainer's policy and the rollout engines load
models with it; re-exported by ``cp.policy``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"bfloat16"`` / ``"float32"`` / ``"float16"`` (or a ``torch.dtype``) -> ``torch.dtype``."""
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r} ([policy] dtype); use one of {', '.join(DTYPES)}") from None


def is_vision_language(config: Any) -> bool:
    """True for configs with a vision tower (Qwen2.5-VL, Qwen2-VL, Qwen3-VL, ...)."""
    return getattr(config, "vision_config", None) is not None


def load_hf_model(
    name_or_path: str | Path,
    *,
    dtype: str | torch.dtype = "bfloat16",
    revision: str | None = None,
    attn_implementation: str | None = "sdpa",
    trust_remote_code: bool = False,
) -> Any:
    """Load weights and config from a local folder or a Hub name, on the CPU, in train mode.

    Vision-language configs (those with a ``vision_config``) load through
    ``AutoModelForImageTextToText`` (e.g. ``Qwen2_5_VLForConditionalGeneration``), others through
    ``AutoModelForCausalLM``. Tied input / output embeddings stay tied.

    Args:
        name_or_path: local folder (``config.json`` + safetensors) or Hub repo id.
        dtype: parameter dtype. Trainers that shard with FSDP2 load float32 master weights and
            compute in ``[policy] dtype`` through FSDP's mixed precision (see :func:`build_policy`).
        revision: Hub revision (``[policy] model_revision``).
        attn_implementation: ``"sdpa"`` (default; CPU and GPU), ``"flash_attention_2"``, ``"eager"``.

    Raises:
        FileNotFoundError: ``name_or_path`` is neither a model folder nor a reachable Hub repo.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    source = str(name_or_path)
    local = Path(source).expanduser()
    if local.exists() and not (local / "config.json").is_file():
        raise FileNotFoundError(
            f"{local} has no config.json: [policy] model_name_or_path must be a Hugging Face model folder "
            "(config.json + *.safetensors) or a Hub repo id"
        )
    try:
        config = AutoConfig.from_pretrained(source, revision=revision, trust_remote_code=trust_remote_code)
    except OSError as exc:
        raise FileNotFoundError(
            f"could not load model config {source!r}: not a local folder ({local.resolve()} does not exist) "
            f"and the Hub lookup failed ({exc}). Point [policy] model_name_or_path at a local folder, or "
            "check the repo id, HF_TOKEN, HF_HOME and network access."
        ) from exc
    auto_cls = AutoModelForImageTextToText if is_vision_language(config) else AutoModelForCausalLM
    kwargs: dict[str, Any] = {"dtype": resolve_dtype(dtype), "revision": revision,
                              "trust_remote_code": trust_remote_code}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    model = auto_cls.from_pretrained(source, config=config, **kwargs)
    model.config.use_cache = False
    model.train()
    return model
