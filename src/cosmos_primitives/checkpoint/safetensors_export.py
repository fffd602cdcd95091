"""Hugging Face folder export: full weights gathered from FSDP2 / TP shards, written by rank 0 as
safetensors shards + index, with config, generation config, tokenizer and processor files.

For a ``transformers`` model the model's own ``save_pretrained`` writes the weights (called on a
weightless meta-device copy with the gathered state dict), so the in-memory names of e.g.
Qwen2.5-VL (``model.language_model.*``, ``model.visual.*``) become the on-disk names
``from_pretrained`` and vLLM expect (``model.*``, ``visual.*``) and tied weights are dropped exactly
as ``transformers`` itself does. Any other module is written under its state-dict names.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from cosmos_primitives.checkpoint.layout import TMP_SUFFIX, publish, remove_tree
from cosmos_primitives.logging.console import get_logger
from cosmos_primitives.models.lora import merge_lora_state_dict
from cosmos_primitives.parallel.distributed import broadcast_object, get_rank

GB = 10**9
INDEX_FILE = "model.safetensors.index.json"
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
# the level of the "Exported <kind> to <dir>" line: a context variable, so that the checkpoint
# thread's own lines keep theirs while the main thread exports quietly
_EXPORT_LOG_LEVEL: contextvars.ContextVar[int] = contextvars.ContextVar("export_log_level", default=logging.INFO)


@contextlib.contextmanager
def quiet_exports() -> Iterator[None]:
    """Exports in this block log ``Exported <kind> to <dir>`` at DEBUG (the exports of periodic saves,
    which the checkpoint's own line already reports)."""
    token = _EXPORT_LOG_LEVEL.set(logging.DEBUG)
    try:
        yield
    finally:
        _EXPORT_LOG_LEVEL.reset(token)


def gather_full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Collective over the model's ranks: full (unsharded) CPU tensors on rank 0, ``{}`` elsewhere.

    Works for FSDP2 / TP (DTensor) parameters and for plain modules; without a process group the
    single process gets everything.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def export_safetensors(
    model: nn.Module,
    out_dir: str | Path,
    *,
    processor: Any = None,
    tokenizer: Any = None,
    max_shard_size_gb: float = 4.0,
    dtype: str = "auto",
) -> Path:
    """Write ``model`` as a Hugging Face folder at ``out_dir``. Every rank must call it; rank 0 writes.

    The folder is written as ``<out_dir>.tmp`` and renamed into place when complete (an existing
    ``out_dir`` is replaced), then ``Exported safetensors to <out_dir>`` is logged.

    Args:
        model: the trained module, possibly FSDP2-sharded; a ``transformers`` ``PreTrainedModel``
            (or a wrapper holding one as ``.hf_model``, like ``cp.policy.CausalLMPolicy``) gets a
            ``from_pretrained``-loadable folder with ``config.json`` and ``generation_config.json``.
        out_dir: e.g. ``<run_dir>/safetensors/final``.
        processor: saved with its own ``save_pretrained`` (tokenizer, ``processor_config.json``,
            chat template); ``preprocessor_config.json`` (image processor),
            ``video_preprocessor_config.json`` and ``chat_template.json`` are added when missing,
            because vLLM and older ``transformers`` read those names.
        tokenizer: saved when given (not needed when ``processor`` holds it).
        max_shard_size_gb: largest shard in GB (10**9 bytes); a single larger tensor gets its own shard.
        dtype: ``"auto"`` (as trained), ``"bfloat16"``, ``"float16"`` or ``"float32"``.

    Returns:
        ``out_dir`` as a Path (on every rank, once rank 0 has finished).

    Raises:
        RuntimeError: on every rank, when rank 0 failed to write (its error is in the message).
    """
    if max_shard_size_gb <= 0:
        raise ValueError(f"[train.ckpt] max_shard_size_gb must be > 0, got {max_shard_size_gb}")
    # a training wrapper (e.g. cp.policy.CausalLMPolicy) exposes the transformers model it owns
    model = getattr(model, "hf_model", model)

    def write(full_sd: dict[str, torch.Tensor], tmp: Path) -> None:
        _write_folder(model, full_sd, tmp, processor, tokenizer, int(max_shard_size_gb * GB))

    return export_folder(model, out_dir, write, dtype=dtype, kind="safetensors")


def export_folder(model: nn.Module, out_dir: str | Path, write: Callable[[dict[str, torch.Tensor], Path], None], *,
                  dtype: str = "auto", kind: str = "safetensors") -> Path:
    """The collective part of an export: gather ``model``'s full state dict (cast to ``dtype``), let rank
    0 ``write(state_dict, tmp_dir)``, rename ``<out_dir>.tmp`` into place, log ``Exported <kind> to <out_dir>``.

    Raises:
        RuntimeError: on every rank, when rank 0 failed to write (its error is in the message).
    """
    if dtype != "auto" and dtype not in _DTYPES:
        raise ValueError(f"export dtype must be 'auto' or one of {sorted(_DTYPES)}, got {dtype!r}")
    out_dir = Path(out_dir)
    log = get_logger()
    if get_rank() == 0:
        log.debug("Prepare to export %s to %s at rank 0", kind, out_dir)
    full_sd = gather_full_state_dict(model)
    error: str | None = None
    if get_rank() == 0:
        try:
            if dtype != "auto":
                target = _DTYPES[dtype]
                full_sd = {k: v.to(target) if v.is_floating_point() else v for k, v in full_sd.items()}
            tmp = out_dir.with_name(out_dir.name + TMP_SUFFIX)
            remove_tree(tmp)
            tmp.mkdir(parents=True)
            write(full_sd, tmp)
            publish(tmp, out_dir)
        except Exception as exc:  # reported to every rank below, then raised everywhere
            error = f"{type(exc).__name__}: {exc}"
            log.exception("Export of %s to %s failed", kind, out_dir)
    del full_sd
    if dist.is_initialized() and dist.get_world_size() > 1:
        error = broadcast_object(error)
    if error is not None:
        raise RuntimeError(f"exporting {kind} to {out_dir} failed on rank 0: {error}")
    if get_rank() == 0:
        log.log(_EXPORT_LOG_LEVEL.get(), "Exported %s to %s", kind, out_dir)
    return out_dir


def _write_folder(model: nn.Module, full_sd: dict[str, torch.Tensor], tmp: Path, processor: Any,
                  tokenizer: Any, max_shard_bytes: int) -> None:
    # LoRA adapters are folded into the base weights: the folder is a plain model of the base class
    full_sd = merge_lora_state_dict(full_sd, model)
    hf_class = _transformers_class(model)
    if hf_class is not None:
        _save_with_transformers(model, hf_class, full_sd, tmp, max_shard_bytes)
    else:
        write_safetensors_shards(full_sd, tmp, max_shard_bytes)
    if processor is not None:
        processor.save_pretrained(str(tmp))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(tmp))
    _add_files_readers_expect(tmp, processor, tokenizer)
    log = get_logger()
    for i, shard in enumerate(sorted(tmp.glob("*.safetensors"))):
        log.debug("Saved chunk %d to %s (%.2f GB)", i, shard.name, shard.stat().st_size / GB)


def _transformers_class(model: nn.Module) -> type | None:
    """The ``PreTrainedModel`` class behind ``model`` (FSDP2 swaps in a subclass; look past it)."""
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover - transformers is a core dependency
        return None
    from torch.distributed.fsdp import FSDPModule

    for cls in type(model).__mro__:
        if issubclass(cls, PreTrainedModel) and not issubclass(cls, FSDPModule):
            return cls
    return None


def _save_with_transformers(model: nn.Module, hf_class: type, full_sd: dict[str, torch.Tensor], out: Path,
                            max_shard_bytes: int) -> None:
    # A weightless copy of the same class: save_pretrained needs the class's name conversions and
    # tied-weight table, while calling it on the live (sharded) module would touch its parameters.
    with torch.device("meta"):
        skeleton = hf_class(copy.deepcopy(model.config))
    floating = [v.dtype for v in full_sd.values() if v.is_floating_point()]
    if floating:
        skeleton.to(floating[0])
    if getattr(model, "generation_config", None) is not None:
        skeleton.generation_config = copy.deepcopy(model.generation_config)
    # Gathering FSDP2 shards gives tied parameters (lm_head / embed_tokens) separate copies, and
    # save_pretrained drops a tied duplicate only when it shares storage with its source: share it again.
    full_sd = dict(full_sd)
    for target, source in (getattr(skeleton, "all_tied_weights_keys", None) or {}).items():
        if target in full_sd and source in full_sd and torch.equal(full_sd[target], full_sd[source]):
            full_sd[target] = full_sd[source]
    with _no_transformers_bars():  # a "Writing model shards" bar per export would bury the training bar
        skeleton.save_pretrained(str(out), state_dict=full_sd, max_shard_size=max_shard_bytes)
    _index_single_file(out)
    if not (out / "generation_config.json").exists() and skeleton.can_generate():
        from transformers import GenerationConfig

        GenerationConfig.from_model_config(model.config).save_pretrained(str(out))


@contextlib.contextmanager
def _no_transformers_bars() -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def _index_single_file(out: Path) -> None:
    """Give a one-file export (``model.safetensors``, a model under one shard) its index too, so every
    export folder has ``model.safetensors.index.json`` for tools that read the index."""
    single = out / "model.safetensors"
    if (out / INDEX_FILE).exists() or not single.exists():
        return
    with single.open("rb") as f:  # the safetensors header: u64 length, then JSON name -> offsets
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    header.pop("__metadata__", None)
    names = sorted(header)
    total = sum(entry["data_offsets"][1] - entry["data_offsets"][0] for entry in header.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict.fromkeys(names, single.name)}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True))


def write_safetensors_shards(state_dict: dict[str, torch.Tensor], out: Path, max_shard_bytes: int, *,
                             stem: str = "model") -> list[Path]:
    """Write ``state_dict`` as ``<stem>-0000i-of-0000n.safetensors`` + ``<stem>.safetensors.index.json``
    (``stem = "diffusion_pytorch_model"`` gives the names diffusers models load).

    Tensors are packed in order into shards of at most ``max_shard_bytes``; a larger tensor gets a
    shard of its own. Used for modules that are not ``transformers`` models.
    """
    from safetensors.torch import save_file

    shards: list[dict[str, torch.Tensor]] = [{}]
    sizes = [0]
    for name, tensor in state_dict.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and sizes[-1] + nbytes > max_shard_bytes:
            shards.append({})
            sizes.append(0)
        # contiguous private copies: safetensors refuses views and tensors sharing storage
        shards[-1][name] = tensor.detach().contiguous().clone()
        sizes[-1] += nbytes
    total = len(shards)
    weight_map: dict[str, str] = {}
    paths = []
    for i, shard in enumerate(shards, start=1):
        name = f"{stem}-{i:05d}-of-{total:05d}.safetensors"
        save_file(shard, str(out / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
        paths.append(out / name)
    index = {"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map}
    (out / f"{stem}.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True))
    return paths


def _add_files_readers_expect(out: Path, processor: Any, tokenizer: Any) -> None:
    """``transformers`` 5 folds processor settings into ``processor_config.json`` and the chat template
    into ``chat_template.jinja``; vLLM and ``transformers`` 4 look for the older file names."""
    image_processor = getattr(processor, "image_processor", None)
    if image_processor is not None and not (out / "preprocessor_config.json").exists():
        image_processor.save_pretrained(str(out))
    video_processor = getattr(processor, "video_processor", None)
    if video_processor is not None and not (out / "video_preprocessor_config.json").exists():
        video_processor.save_pretrained(str(out))
    template = getattr(processor, "chat_template", None) or getattr(tokenizer, "chat_template", None)
    if isinstance(template, str) and not (out / "chat_template.json").exists():
        (out / "chat_template.json").write_text(json.dumps({"chat_template": template}, indent=2) + "\n")
