"""Diffusers folder export of a trained flow transformer: the LoRA folded in, the adapters alone, and
the other pipeline components beside it.

Layout of ``out_dir`` (the one diffusers' ``DiffusionPipeline.from_pretrained`` reads)::

    model_index.json                         # pipeline class; components not written are null
    transformer/config.json                  # the base class's config (e.g. WanTransformer3DModel)
    transformer/diffusion_pytorch_model-0000i-of-0000n.safetensors + .index.json   # LoRA merged
    vae/, scheduler/, ...                    # the components given, via their save_pretrained
    lora/pytorch_lora_weights.safetensors    # the adapters alone (diffusers LoRA format, "transformer." names)
    lora/adapter_config.json                 # their peft LoraConfig (also in the safetensors metadata)

Load the transformer with ``TransformerClass.from_pretrained(out_dir, subfolder="transformer")``, the
pipeline with ``DiffusionPipeline.from_pretrained(out_dir, text_encoder=..., tokenizer=...)`` (the text
encoder is not trained and not copied), or the adapters onto the base model with
``pipe.load_lora_weights(out_dir / "lora")`` / ``transformer.load_lora_adapter(out_dir / "lora")``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cosmos_primitives.checkpoint.safetensors_export import GB, export_folder, write_safetensors_shards
from cosmos_primitives.models.lora import ADAPTER_PARTS, lora_layers, merge_lora_state_dict
from cosmos_primitives.utils.extras import require

TRANSFORMER_DIR = "transformer"
LORA_DIR = "lora"
LORA_WEIGHT_FILE = "pytorch_lora_weights.safetensors"
"""diffusers' file name for LoRA weights (``load_lora_weights`` / ``load_lora_adapter`` look for it)."""
PIPELINES = {"WanTransformer3DModel": "WanPipeline", "CosmosTransformer3DModel": "Cosmos2_5_PredictBasePipeline"}
"""The pipeline named in ``model_index.json`` for each transformer class (text-to-video / -world)."""


def diffusers_model_class(model: nn.Module) -> type:
    """The diffusers ``ModelMixin`` class of ``model`` (past the subclass FSDP2 swaps in)."""
    from diffusers import ModelMixin
    from torch.distributed.fsdp import FSDPModule

    for cls in type(model).__mro__:
        if issubclass(cls, ModelMixin) and not issubclass(cls, FSDPModule):
            return cls
    raise TypeError(f"{type(model).__name__} is not a diffusers model (ModelMixin); use export_safetensors")


def export_diffusers(model: nn.Module, out_dir: str | Path, *, components: Mapping[str, Any] | None = None,
                     pipeline_class: str | None = None, max_shard_size_gb: float = 4.0, dtype: str = "auto",
                     adapter_name: str = "default") -> Path:
    """Write ``model`` (a diffusers transformer, plain, LoRA-adapted and / or FSDP2-sharded) as a diffusers
    folder at ``out_dir`` (layout in the module docstring). Collective: every rank calls it, rank 0 writes
    ``<out_dir>.tmp`` and renames it into place, then ``Exported diffusers folder to <out_dir>`` is logged.

    Args:
        components: other pipeline parts by their ``model_index.json`` name, e.g. ``{"vae": vae,
            "scheduler": scheduler}``, each written with its ``save_pretrained``.
        pipeline_class: the diffusers pipeline named in ``model_index.json``; default by transformer
            class (:data:`PIPELINES`); the pipeline's components not given are written as null.
        dtype: ``"auto"`` (as trained), ``"bfloat16"``, ``"float16"`` or ``"float32"``.

    Returns:
        ``out_dir`` as a Path (on every rank, once rank 0 has finished).
    """
    require("diffusers", "exporting a diffusers folder")
    cls = diffusers_model_class(model)
    pipeline = pipeline_class or PIPELINES.get(cls.__name__)
    parts = dict(components or {})
    lora_config = getattr(model, "peft_config", {}).get(adapter_name) if lora_layers(model) else None

    def write(full_sd: dict[str, torch.Tensor], tmp: Path) -> None:
        if lora_config is not None:
            save_lora_adapter(full_sd, lora_config, tmp / LORA_DIR, adapter_name=adapter_name)
        merged = merge_lora_state_dict(full_sd, model)
        _save_config(cls, model.config, tmp / TRANSFORMER_DIR)
        write_safetensors_shards(merged, tmp / TRANSFORMER_DIR, int(max_shard_size_gb * GB),
                                 stem="diffusion_pytorch_model")
        for name, part in parts.items():
            part.save_pretrained(str(tmp / name))
        if pipeline is not None:
            write_model_index(tmp, pipeline, {TRANSFORMER_DIR: cls, **{k: type(v) for k, v in parts.items()}})

    return export_folder(model, out_dir, write, dtype=dtype, kind="diffusers folder")


def _save_config(cls: type, config: Mapping[str, Any], out: Path) -> None:
    """``config.json`` as ``cls`` writes it (a weightless copy, so FSDP2's class name stays out)."""
    out.mkdir(parents=True)
    with torch.device("meta"):
        skeleton = cls.from_config(dict(config))
    skeleton.save_config(str(out))


def save_lora_adapter(state_dict: Mapping[str, torch.Tensor], lora_config: Any, out: Path, *,
                      adapter_name: str = "default", prefix: str = "transformer") -> Path:
    """The adapter ``adapter_name`` of a peft state dict (``...to_q.lora_A.<adapter>.weight``) as
    diffusers' LoRA file ``out/pytorch_lora_weights.safetensors`` (``<prefix>...to_q.lora_A.weight``,
    the peft config in its ``lora_adapter_metadata``) plus ``out/adapter_config.json``."""
    from safetensors.torch import save_file

    marker = {f".{part}.{adapter_name}." for part in ADAPTER_PARTS}
    weights = {}
    for name, tensor in state_dict.items():
        hit = next((m for m in marker if m in f".{name}"), None)
        if hit is not None:
            plain = f".{name}".replace(hit, hit[: -len(adapter_name) - 1])[1:]
            weights[f"{prefix}.{plain}"] = tensor.detach().contiguous().clone()
    if not weights:
        raise ValueError(f"no weights of LoRA adapter '{adapter_name}' in the state dict")
    config = lora_config.to_dict()
    config = {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}
    out.mkdir(parents=True, exist_ok=True)
    meta = {f"{prefix}.{k}": v for k, v in config.items()}  # diffusers packs each model's config under its prefix
    save_file(weights, str(out / LORA_WEIGHT_FILE),
              metadata={"format": "pt", "lora_adapter_metadata": json.dumps(meta, sort_keys=True)})
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out / LORA_WEIGHT_FILE


def write_model_index(out: Path, pipeline_class: str, written: Mapping[str, type]) -> Path:
    """``model_index.json`` for ``pipeline_class``: the written components as ``[library, class]``, the
    pipeline's other components (text encoder, tokenizer, ...) as ``[null, null]``, loaded as None
    unless passed to ``from_pretrained``."""
    diffusers = require("diffusers", "exporting a diffusers folder")
    index: dict[str, Any] = {"_class_name": pipeline_class, "_diffusers_version": diffusers.__version__}
    pipe_cls = getattr(diffusers, pipeline_class, None)
    if pipe_cls is not None:
        expected, optional = pipe_cls._get_signature_keys(pipe_cls)
        optional_parts = getattr(pipe_cls, "_optional_components", [])
        for name in [*expected, *(n for n in optional if n in optional_parts)]:
            index[name] = [None, None]
    for name, cls in written.items():
        index[name] = [cls.__module__.split(".")[0], cls.__name__]
    path = out / "model_index.json"
    path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return path
