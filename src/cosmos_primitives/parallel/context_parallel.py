"""Context parallelism (Ulysses) for Hugging Face decoder stacks: each rank of the ``cp`` group runs the
decoder layers on one contiguous slice of every row's tokens.

Inside attention, an all-to-all trades the sequence split for a head split: rank ``r`` gets heads
``[r H / cp, (r + 1) H / cp)`` of the whole sequence, attends with a causal mask that also keeps
packed samples apart (segments from the text positions) and hides padding keys, and a second
all-to-all returns its slice of tokens with every head. RoPE / mRoPE is applied before attention
with each token's global position, so it needs nothing else. Embeddings and a vision tower run on
the whole sequence on every rank; the decoder sees only the rank's slice (a forward pre-hook), and so
does every per-token decoder input: the position ids (when the model gives none, the decoder's own
default ``0..T-1`` over the whole row, so that a slice keeps its global positions rather than
restarting at 0) and the rows a token mask selects (Qwen3-VL's deepstack features, added to the first
decoder layers at its visual tokens: each rank keeps the rows of its own visual tokens;
:data:`MASKED_ROW_INPUTS`). A per-token input the hook does not know is an error, not a silent
mismatch.

Gradients: the loss is built identically on every cp rank (log-probs are gathered, sums are
all-reduced, each with a backward that keeps only the rank's own share), so after ``backward`` each
rank holds the gradient of its own tokens, scaled by the cp size so that an *average* over the cp
ranks is their sum: FSDP2 sharding over dp_shard x cp averages as it always does, and without FSDP
:func:`all_reduce_context_parallel_grads` averages. Works on gloo (CPU tests) and NCCL alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

ATTN_IMPLEMENTATION = "cosmos_context_parallel"


@dataclass
class _Split:
    """One forward's split: ``segments`` / ``key_valid`` ``[B, T]`` over the padded global sequence."""

    group: dist.ProcessGroup
    rank: int
    size: int
    length: int  # T, padded to a multiple of size
    segments: torch.Tensor
    key_valid: torch.Tensor
    mask: torch.Tensor | None = field(default=None)

    @property
    def local(self) -> slice:
        chunk = self.length // self.size
        return slice(self.rank * chunk, (self.rank + 1) * chunk)

    def attention_mask(self) -> torch.Tensor:
        """``[B, 1, T, T]`` bool: causal, same segment, valid key (and every token sees itself)."""
        if self.mask is None:
            t = self.length
            causal = torch.ones(t, t, dtype=torch.bool, device=self.segments.device).tril()
            same = self.segments[:, :, None] == self.segments[:, None, :]
            allowed = causal & same & self.key_valid[:, None, :]
            allowed |= torch.eye(t, dtype=torch.bool, device=allowed.device)
            self.mask = allowed[:, None]
        return self.mask


_ACTIVE: ContextVar[_Split | None] = ContextVar("cosmos_context_parallel_split", default=None)


class _AllToAll(torch.autograd.Function):
    """Exchange the ``size`` chunks of dim 0 (chunk ``s`` goes to rank ``s``); its own inverse."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        x = x.contiguous()  # before empty_like: a transposed input would give ``out`` its strides
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad, group=ctx.group)
        return out, None


def seq_to_heads(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """``[B, H, L, D]`` (all heads, this rank's ``L`` tokens) -> ``[B, H / cp, cp * L, D]`` (this rank's
    head slice, every rank's tokens in rank order); ``cp`` is ``group``'s size, which must divide ``H``."""
    size = dist.get_world_size(group)
    b, h, n, d = x.shape
    chunks = x.reshape(b, size, h // size, n, d).transpose(0, 1)
    got = _AllToAll.apply(chunks, group)  # [cp (source rank = token slice), B, H / cp, L, D]
    return got.permute(1, 2, 0, 3, 4).reshape(b, h // size, size * n, d)


def heads_to_seq(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Inverse of :func:`seq_to_heads`: ``[B, H / cp, T, D]`` -> ``[B, H, T / cp, D]``."""
    size = dist.get_world_size(group)
    b, hs, t, d = x.shape
    n = t // size
    chunks = x.reshape(b, hs, size, n, d).permute(2, 0, 1, 3, 4)
    got = _AllToAll.apply(chunks, group)  # [cp (source rank = head slice), B, H / cp, L, D]
    return got.transpose(0, 1).reshape(b, size * hs, n, d)


def context_parallel_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                               value: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float = 0.0,
                               scaling: float | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """HF attention function (registered as ``ATTN_IMPLEMENTATION``); outside
    :func:`context_parallel_split` it is HF's SDPA attention.

    Args:
        query: ``[B, Hq, L, D]`` local tokens, RoPE applied. key, value: ``[B, Hkv, L, D]``.

    Returns:
        ``([B, L, Hq, D], None)`` as HF attention functions return.
    """
    split = _ACTIVE.get()
    if split is None:  # the same model used without a split (e.g. generation): plain SDPA
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads % split.size:
        raise ValueError(f"{heads} attention heads do not split over cp_size={split.size} ranks; "
                         "choose a cp_size that divides num_attention_heads")
    if kv_heads % split.size:  # grouped KV heads that do not split: give every query head its own copy
        key = key.repeat_interleave(heads // kv_heads, dim=1)
        value = value.repeat_interleave(heads // kv_heads, dim=1)
        kv_heads = heads
    q, k, v = (seq_to_heads(x, split.group) for x in (query, key, value))
    if kv_heads != heads:
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=split.attention_mask(), dropout_p=dropout if module.training else 0.0, scale=scaling)
    return heads_to_seq(out, split.group).transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, context_parallel_attention)


def decoder_of(backbone: torch.nn.Module) -> torch.nn.Module:
    """The module that runs the decoder layers on ``inputs_embeds`` / ``input_ids`` (Qwen2.5-VL:
    ``language_model``; text models: the backbone itself)."""
    return getattr(backbone, "language_model", backbone)


MASKED_ROW_INPUTS = {"deepstack_visual_embeds": "visual_pos_masks"}
"""Decoder inputs holding one row per token that a ``[B, T]`` bool mask selects (in row-major order),
keyed by the input, valued by the mask's name. Qwen3-VL's deepstack features (a list with one
``[N_visual, H]`` tensor per early decoder layer, added at ``visual_pos_masks``) are one; a family
whose decoder takes another such input adds its names here."""

_SEQUENCE_INPUTS = ("input_ids", "inputs_embeds", "position_ids", "attention_mask",
                    *MASKED_ROW_INPUTS, *MASKED_ROW_INPUTS.values())


def _local_rows(values: torch.Tensor | list[torch.Tensor], mask: torch.Tensor, part: slice) -> Any:
    """The rows of ``values`` (``[N, ...]``, one per ``True`` of ``mask`` ``[B, T]``, or a list of such)
    whose tokens lie in ``part``."""
    in_part = torch.zeros_like(mask, dtype=torch.bool)
    in_part[:, part] = True
    keep = in_part[mask.bool()]  # [N]
    if isinstance(values, torch.Tensor):
        return values[keep]
    return [v[keep] for v in values]


def _slice_decoder_inputs(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict]:
    split = _ACTIVE.get()
    if split is None:
        return args, kwargs
    if args:
        raise TypeError("context parallel: call the decoder with keyword arguments")
    tokens = kwargs["inputs_embeds"] if kwargs.get("inputs_embeds") is not None else kwargs["input_ids"]
    batch, length = tokens.shape[:2]
    for name, value in kwargs.items():
        if (name not in _SEQUENCE_INPUTS and isinstance(value, torch.Tensor) and value.dim() >= 2
                and tuple(value.shape[:2]) == (batch, length)):
            raise NotImplementedError(
                f"context parallel: the decoder input {name!r} {tuple(value.shape)} has one entry per token, "
                "and context parallel does not know how to split it; add it to "
                "cosmos_primitives.parallel.context_parallel.MASKED_ROW_INPUTS or run without cp")
    part = split.local
    if kwargs.get("position_ids") is None:
        # the decoder's own default (0..T-1) taken before the split: each slice keeps its global positions
        kwargs["position_ids"] = torch.arange(length, device=tokens.device).expand(batch, length)
    for values_name, mask_name in MASKED_ROW_INPUTS.items():
        if kwargs.get(values_name) is not None:
            kwargs[values_name] = _local_rows(kwargs[values_name], kwargs[mask_name], part)
            kwargs[mask_name] = kwargs[mask_name][:, part]
    for name in ("input_ids", "inputs_embeds"):
        if kwargs.get(name) is not None:
            kwargs[name] = kwargs[name][:, part]
    kwargs["position_ids"] = kwargs["position_ids"][..., part]
    kwargs["attention_mask"] = None  # the split's own mask replaces it
    kwargs.pop("cache_position", None)
    return args, kwargs


def enable_context_parallel(hf_model: torch.nn.Module, backbone: torch.nn.Module) -> None:
    """Route the decoder's attention through :func:`context_parallel_attention` and slice its inputs
    (idempotent). A vision tower keeps its own attention implementation."""
    if getattr(hf_model, "_cosmos_context_parallel", False):
        return
    _register()
    hf_model.config.get_text_config()._attn_implementation = ATTN_IMPLEMENTATION
    decoder_of(backbone).register_forward_pre_hook(_slice_decoder_inputs, with_kwargs=True)
    hf_model._cosmos_context_parallel = True


def text_positions(input_ids: torch.Tensor, position_ids: torch.Tensor | None) -> torch.Tensor:
    """``[B, T]`` text positions: row 0 of 4-row mRoPE ids (packed), the ids themselves when 2-D,
    else ``0..T-1`` (one sample per row)."""
    if position_ids is None or (position_ids.dim() == 3 and position_ids.shape[0] != 4):
        return torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
    return position_ids[0] if position_ids.dim() == 3 else position_ids


@contextlib.contextmanager
def context_parallel_split(group: dist.ProcessGroup, length: int, positions: torch.Tensor,
                           attention_mask: torch.Tensor | None = None) -> Iterator[_Split]:
    """Make the decoder run on this rank's slice for the duration of one forward.

    Args:
        group: the cp process group.
        length: padded sequence length ``T`` (a multiple of the group size).
        positions: ``[B, T]`` text positions; a new packed sample starts where they restart at 0.
        attention_mask: ``[B, T]`` 1 for real tokens (padded batches), or None.
    """
    segments = torch.cumsum((positions == 0).long(), dim=1)
    valid = torch.ones_like(positions, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    split = _Split(group, dist.get_rank(group), dist.get_world_size(group), length, segments, valid)
    token = _ACTIVE.set(split)
    try:
        yield split
    finally:
        _ACTIVE.reset(token)


class GatherSequence(torch.autograd.Function):
    """All-gather ``[B, L]`` slices into ``[B, cp * L]``; backward keeps this rank's slice of the
    gradient (every rank computes the same loss from the gathered tensor), times cp (see above)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.rank, ctx.width, ctx.size = dist.get_rank(group), x.shape[1], dist.get_world_size(group)
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x, group=group)
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad[:, ctx.rank * ctx.width:(ctx.rank + 1) * ctx.width] * ctx.size, None


class SumAcross(torch.autograd.Function):
    """All-reduce sum; backward passes the gradient through (each rank owns its own term), times cp."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.size = dist.get_world_size(group)
        out = x.detach().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.size, None


def all_reduce_context_parallel_grads(model: torch.nn.Module, group: dist.ProcessGroup) -> None:
    """Average each parameter's gradient over the cp group, giving the sum of the ranks' shares
    (call after ``backward``, before clipping; not needed under FSDP2 over dp_shard x cp)."""
    size = dist.get_world_size(group)
    for param in model.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad, group=group)
            param.grad.div_(size)
