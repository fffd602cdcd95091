"""The trainer side of a sync: its parameters under clean names, and their full (unsharded) values."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from cosmos_primitives.models.lora import ADAPTER_PARTS, active_adapters, lora_layers, merged_weight
from cosmos_primitives.parallel.param_names import WRAPPER_PARTS, clean_name


class MergedLoraWeight:
    """The effective weight of a LoRA-adapted linear layer, ``W + sum(s * B @ A)``, read on demand.

    Stands in for a parameter among the sources: it has the base weight's shape, dtype and
    device, and :func:`full_tensor` computes its value (gathering ``W``, ``A`` and ``B`` first when
    they are FSDP2 shards: a collective, like reading any sharded source). It is never shared with
    an engine, since no storage holds it.
    """

    def __init__(self, base: torch.Tensor, pairs: list[tuple[torch.Tensor, torch.Tensor, float]]) -> None:
        self.base = base
        self.pairs = pairs
        self.shape = base.shape
        self.dtype = base.dtype

    @property
    def device(self) -> torch.device:
        return local_device(self.base)

    def numel(self) -> int:
        return self.base.numel()

    def element_size(self) -> int:
        return self.base.element_size()

    def is_floating_point(self) -> bool:
        return self.base.is_floating_point()

    def value(self) -> torch.Tensor:
        return merged_weight(full_tensor(self.base), [(full_tensor(a), full_tensor(b), s) for a, b, s in self.pairs])


def named_sources(model: nn.Module) -> dict[str, torch.Tensor]:
    """The trainer's parameters by clean name, in ``named_parameters()`` order.

    Tied parameters appear once (under their first name, e.g. the input embedding). Values are
    the parameters themselves: plain tensors, or FSDP2 ``DTensor`` shards (see :func:`full_tensor`).
    A LoRA-adapted layer (peft) appears as its base layer would, ``<layer>.weight`` (a
    :class:`MergedLoraWeight`: the adapters folded in) and ``<layer>.bias``; its adapter
    parameters are not listed, so engines receive plain merged weights.
    """
    layers = lora_layers(model)
    adapter_params = {id(p) for layer in layers.values() for part in ADAPTER_PARTS
                      if isinstance(getattr(layer, part, None), nn.Module) for p in getattr(layer, part).parameters()}
    out: dict[str, torch.Tensor] = {}
    for raw, param in model.named_parameters():
        if id(param) in adapter_params:
            continue
        name = clean_name(raw)
        layer_name, _, rest = name.rpartition(".base_layer.")
        if layer_name in layers and "." not in rest:
            layer = layers[layer_name]
            name = f"{layer_name}.{rest}"
            if rest == "weight":
                pairs = [(layer.lora_A[a].weight, layer.lora_B[a].weight, float(layer.scaling[a]))
                         for a in active_adapters(layer)]
                param = MergedLoraWeight(param, pairs)
        if name in out:
            raise ValueError(f"two parameters of {type(model).__name__} have the name '{name}' after "
                             f"removing wrapper prefixes {WRAPPER_PARTS}")
        out[name] = param
    return out


def is_sharded(t: torch.Tensor) -> bool:
    """True for a ``DTensor`` (FSDP2 / TP) or a merged LoRA weight: reading its full value is
    computed (a collective for a DTensor), and no engine tensor can alias it."""
    return isinstance(t, (DTensor, MergedLoraWeight))


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The full value of ``t`` without autograd history: ``DTensor.full_tensor()`` (an all-gather
    every rank of its mesh must join, in the same order), a merged LoRA weight, or ``t`` itself."""
    if isinstance(t, MergedLoraWeight):
        with torch.no_grad():
            return t.value()
    if isinstance(t, DTensor):
        return t.detach().full_tensor()
    return t.detach()


def local_device(t: torch.Tensor) -> torch.device:
    """Where this rank's part of ``t`` lives."""
    if isinstance(t, MergedLoraWeight):
        return t.device
    return t.to_local().device if isinstance(t, DTensor) else t.device


def ties_embeddings(model: nn.Module) -> bool:
    """Whether a HF model ties its output embedding to its input embedding."""
    config = getattr(model, "config", None)
    if config is None:
        return False
    get_text = getattr(config, "get_text_config", None)
    text = get_text() if callable(get_text) else config
    return bool(getattr(text, "tie_word_embeddings", getattr(config, "tie_word_embeddings", False)))


def fused_shape(name: str, sources: tuple[str, ...], parts: list[torch.Tensor]) -> tuple[int, ...]:
    """Shape of the engine tensor ``name`` made of ``parts`` (several: concatenated along dim 0)."""
    if len(parts) == 1:
        return tuple(parts[0].shape)
    tails = {tuple(p.shape[1:]) for p in parts}
    dtypes = {p.dtype for p in parts}
    if len(tails) != 1 or len(dtypes) != 1:
        raise ValueError(
            f"cannot fuse {list(sources)} into '{name}' along dim 0: shapes "
            f"{[tuple(p.shape) for p in parts]}, dtypes {sorted(map(str, dtypes))}"
        )
    return (sum(p.shape[0] for p in parts), *tails.pop())
