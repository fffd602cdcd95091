"""What the memory plan needs to know about a model: parameter counts (total, trainable, outside
the repeated blocks, largest block) and the language model's dimensions, read from ``config.json``.

The counts come from the real Hugging Face class built on the ``meta`` device (no weights are
allocated or downloaded), so they are exact for any architecture ``transformers`` knows.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

from cosmos_primitives.parallel.fsdp import find_blocks


class ModelShape(NamedTuple):
    """Parameter counts and language-model dimensions of one model."""

    total_params: int
    trainable_params: int  # after freeze / trainable patterns, or the LoRA adapters alone
    root_params: int  # outside the repeated blocks: embeddings, LM head, final norm, vision merger (FSDP root unit)
    block_params: int  # the largest repeated block (decoder layer or vision block): one FSDP unit
    layers: int
    hidden: int
    intermediate: int
    kv_dim: int  # num_key_value_heads x head_dim
    vocab: int

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], *, freeze_patterns: Sequence[str] = (),
                       trainable_patterns: Sequence[str] = (), lora: Any = None) -> ModelShape:
        """The shape of the model ``config`` (``config.json`` contents; Qwen2 when it names no
        ``model_type``) trained as ``[policy]`` says: ``freeze_patterns`` / ``trainable_patterns``
        as ``cp.policy.apply_trainable_patterns`` applies them, or only ``[policy.lora]``'s
        adapters (``r x (in + out)`` per adapted linear layer) when ``lora`` is set."""
        model = _meta_model(config)
        counted: set[int] = set()
        total = trainable = 0
        freeze = [re.compile(p) for p in freeze_patterns]
        train = [re.compile(p) for p in trainable_patterns]
        names: dict[int, list[str]] = {}
        params: dict[int, torch.nn.Parameter] = {}
        for name, param in model.named_parameters(remove_duplicate=False):
            names.setdefault(id(param), []).append(name)
            params[id(param)] = param
        for pid, param_names in names.items():
            total += params[pid].numel()
            trains = not train or any(p.search(n) for p in train for n in param_names)
            if any(p.search(n) for p in freeze for n in param_names):
                trains = False
            trainable += params[pid].numel() if trains else 0
        if lora is not None:
            trainable = sum(lora.r * (m.in_features + m.out_features) for n, m in model.named_modules()
                            if isinstance(m, torch.nn.Linear) and n.rsplit(".", 1)[-1] in lora.target_modules)
        blocks = find_blocks(model)
        block_sizes = []
        for block in blocks:
            block_sizes.append(sum(p.numel() for p in block.parameters() if id(p) not in counted))
            counted.update(id(p) for p in block.parameters())
        text = model.config.get_text_config()
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        return cls(total_params=total, trainable_params=trainable, root_params=total - sum(block_sizes),
                   block_params=max(block_sizes, default=0), layers=text.num_hidden_layers, hidden=text.hidden_size,
                   intermediate=text.intermediate_size, kv_dim=text.num_key_value_heads * head_dim,
                   vocab=text.vocab_size)


def read_hf_config(model_name_or_path: str, revision: str | None = None) -> dict[str, Any]:
    """``config.json`` of a model folder, or of a Hub repo (fetches that one small file, or reads
    it from the local Hugging Face cache)."""
    folder = Path(model_name_or_path).expanduser()
    if folder.is_dir():
        path = folder / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{folder} holds no config.json: is [policy] model_name_or_path a model folder?")
    else:
        from huggingface_hub import hf_hub_download

        path = Path(hf_hub_download(model_name_or_path, "config.json", revision=revision))
    return json.loads(path.read_text())


def _meta_model(config: dict[str, Any]) -> torch.nn.Module:
    """The Hugging Face model of ``config`` with its parameters on the meta device."""
    import transformers

    fields = {k: v for k, v in config.items()
              if not k.startswith("_") and k not in ("architectures", "transformers_version")}
    model_type = fields.pop("model_type", "qwen2")
    hf_config = transformers.AutoConfig.for_model(model_type, **fields)
    auto = transformers.AutoModelForImageTextToText if "vision_config" in fields else transformers.AutoModelForCausalLM
    with torch.device("meta"):
        return auto.from_config(hf_config)
