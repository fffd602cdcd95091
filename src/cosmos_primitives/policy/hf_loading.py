"""Load a Hugging Face causal LM (Qwen2, Llama, ...) or vision-language model (Qwen2.5-VL, ...) and its
processor from a model folder (e.g. one :mod:`.safetensors_export` wrote) or the Hub.

Below ``policy``, ``rollout`` and ``eval`` so that the trainer's policy, the rollout engines and
evaluation all load models with it; re-exported by ``cp.policy``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def resolve_dtype(dtype: str | torch.dtype, device: str | torch.device | None = None) -> torch.dtype:
    """``"bfloat16"`` / ``"float32"`` / ``"float16"`` (or a ``torch.dtype``) -> ``torch.dtype``.

    ``"auto"`` picks bfloat16 when ``device`` is a CUDA device and float32 otherwise (CPU kernels
    are slow and partly missing in bfloat16).
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device is not None and torch.device(device).type == "cuda" else torch.float32
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use 'auto' or one of {', '.join(DTYPES)}") from None


def is_vision_language(config: Any) -> bool:
    """True for configs with a vision tower (Qwen2.5-VL, Qwen2-VL, Qwen3-VL, ...)."""
    return getattr(config, "vision_config", None) is not None


def _checked_source(name_or_path: str | Path) -> str:
    """The folder / Hub id as ``from_pretrained`` takes it; an existing folder must hold ``config.json``."""
    local = Path(str(name_or_path)).expanduser()
    if local.exists():
        if not (local / "config.json").is_file():
            raise FileNotFoundError(
                f"{local} has no config.json: the model must be a Hugging Face model folder (config.json + "
                "*.safetensors, e.g. <output_dir>/<timestamp>/safetensors/final) or a Hub repo id")
        return str(local)
    return str(name_or_path)


def _hub_lookup_error(source: str, exc: OSError) -> FileNotFoundError:
    local = Path(source).expanduser()
    return FileNotFoundError(
        f"could not load model {source!r}: not a local folder ({local.resolve()} does not exist) and the Hub "
        f"lookup failed ({exc}). Point the model path at a local folder, or check the repo id, HF_TOKEN, "
        "HF_HOME and network access.")


def load_processor(name_or_path: str | Path, *, revision: str | None = None, trust_remote_code: bool = False) -> Any:
    """The processor (vision-language model) or tokenizer (text model) saved with a model folder."""
    from transformers import AutoProcessor

    source = _checked_source(name_or_path)
    try:
        return AutoProcessor.from_pretrained(source, revision=revision, trust_remote_code=trust_remote_code)
    except OSError as exc:
        raise _hub_lookup_error(source, exc) from exc


def load_hf_model(
    name_or_path: str | Path,
    *,
    dtype: str | torch.dtype = "bfloat16",
    device: str | torch.device = "cpu",
    revision: str | None = None,
    attn_implementation: str | None = "sdpa",
    trust_remote_code: bool = False,
) -> Any:
    """Load weights and config from a local folder or a Hub name onto ``device``, in train mode.

    Vision-language configs (those with a ``vision_config``) load through
    ``AutoModelForImageTextToText`` (e.g. ``Qwen2_5_VLForConditionalGeneration``), others through
    ``AutoModelForCausalLM``. Tied input / output embeddings stay tied.

    Args:
        name_or_path: local folder (``config.json`` + safetensors) or Hub repo id.
        dtype: parameter dtype (``"auto"``: see :func:`resolve_dtype`). Trainers that shard with
            FSDP2 load float32 master weights and compute in ``[policy] dtype`` through FSDP's mixed
            precision (see :func:`build_policy`).
        device: where the weights go (default CPU; generation calls ``.eval()`` on the result).
        revision: Hub revision (``[policy] model_revision``).
        attn_implementation: ``"sdpa"`` (default; CPU and GPU), ``"flash_attention_2"``, ``"eager"``.

    Raises:
        FileNotFoundError: ``name_or_path`` is neither a model folder nor a reachable Hub repo.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    source = _checked_source(name_or_path)
    try:
        config = AutoConfig.from_pretrained(source, revision=revision, trust_remote_code=trust_remote_code)
    except OSError as exc:
        raise _hub_lookup_error(source, exc) from exc
    auto_cls = AutoModelForImageTextToText if is_vision_language(config) else AutoModelForCausalLM
    kwargs: dict[str, Any] = {"dtype": resolve_dtype(dtype, device), "revision": revision,
                              "trust_remote_code": trust_remote_code}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    model = auto_cls.from_pretrained(source, config=config, **kwargs)
    model.config.use_cache = False
    model.train()
    return model.to(device)
