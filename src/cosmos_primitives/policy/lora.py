"""LoRA adapters (peft) on HF language / vision-language models and diffusers transformers.

An adapted linear layer computes ``W x + b + s * B (A x)`` with ``s = lora_alpha / r``, ``A``
``[r, in]``, ``B`` ``[out, r]``. Training updates only ``A`` and ``B``; the KL reference is the same
network with the adapters disabled, so it costs no memory. Rollout engines and exported checkpoints
need plain weights: :mod:`cosmos_primitives.models.lora` folds ``s * B A`` into ``W``
under the layer's original parameter names.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from cosmos_primitives.models.lora import lora_layers
from cosmos_primitives.utils.extras import require

MIN_PEFT = "0.15"
"""The oldest peft the ``lora`` extra allows (``pyproject.toml``)."""


def apply_lora(model: Any, lora: Any, adapter_name: str = "default", *, config_key: str = "[policy.lora]") -> Any:
    """Add a peft LoRA adapter to ``model`` in place and freeze everything else.

    Goes through peft's own ``inject_adapter_in_model``, not the ``add_adapter`` integration of
    ``transformers`` / ``diffusers`` (whose peft version gate can refuse a peft that works), so any
    ``torch.nn.Module`` takes adapters: ``transformers`` ``PreTrainedModel``, ``diffusers``
    ``ModelMixin`` or a plain module. Only the adapter's ``lora_A`` / ``lora_B`` weights are
    trainable afterwards; with ``init_lora_weights`` true (the default) ``B`` starts at 0, so the
    adapted model starts as the base model.

    Args:
        lora: ``r``, ``lora_alpha``, ``lora_dropout``, ``target_modules`` and optionally
            ``init_lora_weights`` (``[policy.lora]`` or ``[wfm.lora]``).
        config_key: the config table named in errors.

    Raises:
        ValueError: none of ``lora.target_modules`` names a module of ``model``.
        MissingExtraError: peft is not installed (the ``lora`` extra).
        RuntimeError: the installed peft cannot inject adapters (names its version and the fix).
    """
    peft = require("peft", "LoRA adapters")
    modules = [name for name, _ in model.named_modules()]
    if not any(name == t or name.endswith("." + t) for t in lora.target_modules for name in modules):
        raise ValueError(
            f"{config_key} target_modules {lora.target_modules} match no module of {type(model).__name__}; "
            f"its linear layers end in e.g. {sorted(_linear_suffixes(model))[:8]}"
        )
    inject = getattr(peft, "inject_adapter_in_model", None)
    if inject is None:
        raise RuntimeError(
            f"peft {peft.__version__} has no inject_adapter_in_model (LoRA needs peft >= {MIN_PEFT}); "
            f"install a supported one: pip install 'peft>={MIN_PEFT}' (or the lora extra: "
            f"pip install 'cosmos_primitives[lora]')"
        )
    config = peft.LoraConfig(r=lora.r, lora_alpha=lora.lora_alpha, lora_dropout=lora.lora_dropout,
                             target_modules=list(lora.target_modules),
                             init_lora_weights=getattr(lora, "init_lora_weights", True))
    model.requires_grad_(False)
    inject(config, model, adapter_name=adapter_name)
    for name, param in model.named_parameters():
        param.requires_grad_(any(f".{part}.{adapter_name}." in f".{name}" for part in ("lora_A", "lora_B")))
    return model


def _linear_suffixes(module: torch.nn.Module) -> set[str]:
    return {".".join(name.split(".")[-2:]) for name, m in module.named_modules() if isinstance(m, torch.nn.Linear)}


@contextmanager
def adapters_disabled(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Run ``model`` without its LoRA adapters inside the block (the KL reference).

    Switches every peft-adapted layer off and back on itself, so it needs neither the
    ``transformers`` / ``diffusers`` peft integration nor a peft version that integration accepts.
    """
    layers = list(lora_layers(model).values())
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield model
    finally:
        for layer in layers:
            layer.enable_adapters(True)
