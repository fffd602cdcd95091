"""Variable-length attention for packed rows of Hugging Face decoders: every packed sample attends
causally to itself only, and no ``[B, 1, T, T]`` mask is ever built.

transformers' SDPA path turns packed rows (``position_ids`` restarting per sample, no
``attention_mask``) into a dense boolean mask; with a mask, SDPA leaves its flash kernel, GQA's K / V
are copied per query head, and the kernel computes the whole ``T x T`` square. Here the decoder's
attention is one registered implementation, :data:`VARLEN_ATTENTION`, made of

- a mask function that gives the layers no mask for a batch without padding (packed or not); a
  padding mask or a KV-cache step still gets transformers' own SDPA mask;
- an attention function that, without a mask, attends within the samples described by
  transformers' ``FlashAttentionKwargs`` (``cu_seq_lens_q`` / ``cu_seq_lens_k`` / ``max_length_q``
  / ``max_length_k``, see :func:`packed_attention_kwargs`), or, when the caller gave none, found
  from the text ``position_ids`` the decoder layers pass down. A sample starts at each row start and
  where a position is not its predecessor's + 1 (transformers' own rule for packed rows). On a CUDA
  device in bfloat16 / float16 it calls a varlen flash kernel (:func:`available_varlen_kernels`);
  elsewhere it runs SDPA once per sample (exact, and the reference the kernels are tested against).
  Rows holding a single sample use SDPA's ``is_causal`` (flash on CUDA), and padded batches, decode
  steps (query length != key length) and non-causal calls are transformers' SDPA attention, so
  ``generate`` on the same model object behaves as under ``"sdpa"``.

Host syncs: given the kwargs (``token_logprobs`` computes them on the host from the loader's CPU
``position_ids``), the CUDA path makes none and has no data-dependent Python branch, so it traces
under ``torch.compile`` without graph breaks. Without them, every attention call derives the
samples from the device ``position_ids`` and waits for the device (one sync per layer). The
per-sample fallback reads the sample offsets on the host (``.tolist()``).

transformers itself inspects packed ``position_ids`` once per forward
(``masking_utils.find_packed_sequence_indices``, one host sync) before asking the mask function,
unless the decoder is handed a ready mask mapping: ``token_logprobs`` passes
:func:`no_mask_mapping` (``{"full_attention": None}``) to the decoders that accept one (Qwen2,
Qwen3, Qwen2.5-VL), so their forward and backward make no host sync; Qwen3-VL keeps that one.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

VARLEN_ATTENTION = "cosmos_varlen"
"""The ``_attn_implementation`` name under which the attention and mask functions are registered."""

KERNEL_ORDER = ("flash_attn", "aten._flash_attention_forward", "torch.varlen_attn")
"""CUDA varlen kernels, in the order the default picks the first available one. torch's flash kernel
called directly comes before its ``varlen_attn`` wrapper: on an H100 (torch 2.11, 2 rows x 4,096
tokens, 12 / 2 heads of 128, bf16, forward + backward) it took 0.85 ms against the wrapper's 1.30 ms
and the dense-mask SDPA's 2.61 ms (``benchmarks/RESULTS.md``)."""

_KERNELS: dict[str, Callable[..., torch.Tensor]] | None = None


def _text_positions(position_ids: torch.Tensor | None) -> torch.Tensor | None:
    """``[B, T]`` (or ``[1, T]``) text positions as transformers' decoders pass them to the layers:
    the ids themselves when 2-D, row 0 of 4-row mRoPE ids, None for 3-row mRoPE ids or none at all."""
    if position_ids is None:
        return None
    if position_ids.dim() == 2:
        return position_ids
    if position_ids.dim() == 3 and position_ids.shape[0] == 4:
        return position_ids[0]
    if position_ids.dim() == 3 and position_ids.shape[0] == 3:
        return None
    raise ValueError(f"position_ids of shape {tuple(position_ids.shape)}: expected [B, T], [4, B, T] (text row + "
                     "mRoPE) or [3, B, T] (mRoPE only)")


def _sample_offsets(positions: torch.Tensor | None, batch: int, length: int, device: torch.device) -> dict[str, Any]:
    """The kwargs of :func:`packed_attention_kwargs` from ``[B, T]`` / ``[1, T]`` text positions (None:
    one sample per row), computed on ``positions``' device (a host sync when that is an accelerator)."""
    starts = torch.zeros(batch, length, dtype=torch.bool, device=device)
    starts[:, 0] = True
    if positions is not None:
        if positions.shape[-1] != length or positions.shape[0] not in (1, batch):
            raise ValueError(f"text position_ids of shape {tuple(positions.shape)} do not fit rows of shape "
                             f"[{batch}, {length}]")
        positions = positions.expand(batch, length)
        starts[:, 1:] = positions[:, 1:] != positions[:, :-1] + 1
    first = starts.flatten().nonzero().flatten()
    cu = torch.cat([first, first.new_tensor([batch * length])]).to(torch.int32)
    longest = int((cu[1:] - cu[:-1]).max())
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}


def no_mask_mapping(model: torch.nn.Module) -> dict[str, None] | None:
    """``{"full_attention": None}`` for a decoder whose layers are all full attention and that takes a
    prepared mask mapping as its ``attention_mask`` (transformers 5: its config lists ``layer_types``),
    else None. Handed to such a decoder with :func:`packed_attention_kwargs`, it skips transformers'
    mask builder, whose check for packed rows waits for the device once per forward."""
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layer_types = set(getattr(text, "layer_types", None) or ())
    return {"full_attention": None} if layer_types == {"full_attention"} else None


def packed_attention_kwargs(input_ids: torch.Tensor, position_ids: torch.Tensor | None = None) -> dict[str, Any]:
    """transformers' ``FlashAttentionKwargs`` for a batch without ``attention_mask``, computed where
    the tensors are: on the host for a loader's CPU batch (no device sync; move the tensors with the
    batch). Pass them to the model with the batch (``model(**batch, **kwargs)``).

    Args:
        input_ids: ``[B, T]`` (only its shape is read).
        position_ids: ``[B, T]`` text positions, or ``[4, B, T]`` (Qwen2.5-VL / Qwen3-VL packed rows:
            row 0 is the text position). ``[3, B, T]`` (mRoPE only) or None: one sample per row, as
            transformers assumes for them.

    Returns:
        ``cu_seq_lens_q`` and ``cu_seq_lens_k`` (the same tensor): ``[S + 1]`` int32 offsets of the
        ``S`` samples in the ``B * T`` row-major flattened tokens, from 0 to ``B * T``; a sample
        starts at every row start and where a text position is not its predecessor's + 1 (a packed
        row's padding tail, numbered from 0, is a sample of its own). ``max_length_q`` =
        ``max_length_k``: the longest sample, a Python int.
    """
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids of shape {tuple(input_ids.shape)}: expected [B, T]")
    batch, length = input_ids.shape
    positions = _text_positions(position_ids)
    return _sample_offsets(positions, batch, length, input_ids.device if positions is None else positions.device)


def varlen_attention_enabled(model: torch.nn.Module) -> bool:
    """Whether ``model``'s text decoder (a HF model, or a module with its ``.config``, e.g.
    ``CausalLMPolicy``) attends with :data:`VARLEN_ATTENTION`."""
    config = getattr(model, "config", None)
    if config is None:
        return False
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, "_attn_implementation", None) == VARLEN_ATTENTION


def enable_varlen_attention(hf_model: torch.nn.Module) -> bool:
    """Make ``hf_model``'s text decoder attend with :data:`VARLEN_ATTENTION` (idempotent); a vision
    tower keeps its own implementation.

    Returns:
        True when the decoder uses it (now or already); False, changing nothing, for a decoder with
        sliding-window or non-causal layers (their masks are not plain causal: keep theirs).
    """
    text = hf_model.config.get_text_config()
    if text._attn_implementation == VARLEN_ATTENTION:
        return True
    layer_types = set(getattr(text, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"} or not getattr(text, "is_causal", True):
        return False
    register_varlen_attention()
    text._attn_implementation = VARLEN_ATTENTION
    return True


def register_varlen_attention() -> None:
    """Register :func:`varlen_attention_forward` and :func:`varlen_attention_mask` with transformers
    as :data:`VARLEN_ATTENTION` (idempotent; :func:`enable_varlen_attention` does it)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(VARLEN_ATTENTION, varlen_attention_forward)
    AttentionMaskInterface.register(VARLEN_ATTENTION, varlen_attention_mask)
    _kernels()  # resolved outside any compiled region


def varlen_attention_mask(**kwargs: Any) -> torch.Tensor | None:
    """transformers mask function (``AttentionMaskInterface``) for :data:`VARLEN_ATTENTION`.

    No ``attention_mask`` and queries that are all the keys (training, a prefill without a cache):
    None, packed rows included (the attention function separates the samples). Anything else
    (padding, a KV-cache step, extra mask functions): transformers' SDPA mask (``[B, 1, q, kv]``
    bool, or None where SDPA's ``is_causal`` is exact), which the attention function hands to SDPA.
    """
    from transformers.masking_utils import sdpa_mask

    q_length = kwargs["q_length"] if "q_length" in kwargs else kwargs["cache_position"].shape[0]
    offsets = [kwargs.get("q_offset", 0), kwargs.get("kv_offset", 0)]
    if (kwargs.get("attention_mask") is None and kwargs["kv_length"] == q_length and not kwargs.get("use_vmap")
            and all(isinstance(o, int) and o == 0 for o in offsets)):
        return None
    return sdpa_mask(**kwargs)


def _sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
          attention_mask: torch.Tensor | None, dropout: float, scaling: float | None,
          **kwargs: Any) -> tuple[torch.Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  **kwargs)


def varlen_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                             **kwargs: Any) -> tuple[torch.Tensor, None]:
    """HF attention function registered as :data:`VARLEN_ATTENTION` (see the module docstring).

    Args:
        query: ``[B, Hq, Tq, D]``, RoPE applied. key, value: ``[B, Hkv, Tk, D]``, ``Hq`` a multiple of
            ``Hkv``.
        attention_mask: what :func:`varlen_attention_mask` gave: None, or a mask for SDPA.
        **kwargs: ``cu_seq_lens_q`` / ``cu_seq_lens_k`` (``[S + 1]`` int32 offsets into the ``B * T``
            flattened tokens) and ``max_length_q`` / ``max_length_k`` (ints) when the caller passed
            them; else ``position_ids`` ``[B, T]`` (or ``[1, T]``) text positions; ``is_causal``,
            ``sliding_window`` from the layer.

    Returns:
        ``([B, Tq, Hq, D], None)`` as HF attention functions return.
    """
    causal = kwargs.get("is_causal")
    causal = getattr(module, "is_causal", True) if causal is None else causal
    if attention_mask is not None or query.shape[2] != key.shape[2] or not causal:
        return _sdpa(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    if kwargs.get("sliding_window") is not None:
        raise NotImplementedError(f"{VARLEN_ATTENTION} attention has no sliding window (layer "
                                  f"{getattr(module, 'layer_idx', '?')}); use 'sdpa' for this model")
    batch, heads, length, _ = query.shape
    positions = _text_positions(kwargs.get("position_ids"))
    if kwargs.get("cu_seq_lens_q") is not None:
        cu_q, cu_k = kwargs["cu_seq_lens_q"], kwargs.get("cu_seq_lens_k")
        max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
        cu_k = cu_q if cu_k is None else cu_k
        if max_q is None:  # not a caller of this module: read it from the offsets (a host sync)
            max_q = int((cu_q[1:] - cu_q[:-1]).max())
        max_k = max_q if max_k is None else max_k
    elif positions is not None:
        found = _sample_offsets(positions, batch, length, query.device)
        cu_q = cu_k = found["cu_seq_lens_q"]
        max_q = max_k = found["max_length_q"]
    else:
        cu_q = None
    if cu_q is None or cu_q.shape[0] - 1 == batch:  # one sample per row: SDPA's own causal kernel
        return _sdpa(module, query, key, value, None, dropout, scaling, **kwargs)
    flat = [x.transpose(1, 2).reshape(batch * length, x.shape[1], x.shape[3]) for x in (query, key, value)]
    cu_q = cu_q.to(query.device, torch.int32, non_blocking=True)
    cu_k = cu_k.to(query.device, torch.int32, non_blocking=True)
    out = varlen_attention(*flat, cu_q, cu_k, max_q, max_k, scale=scaling, dropout=dropout)
    return out.view(batch, length, heads, value.shape[-1]), None


def varlen_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seq_lens_q: torch.Tensor,
                     cu_seq_lens_k: torch.Tensor, max_length_q: int, max_length_k: int, *,
                     scale: float | None = None, dropout: float = 0.0, kernel: str | None = None) -> torch.Tensor:
    """Causal attention within each sample of flattened tokens.

    Args:
        query: ``[N, Hq, D]``; key, value: ``[N, Hkv, D]`` (``Hq`` a multiple of ``Hkv``), the
            samples' tokens one after another.
        cu_seq_lens_q, cu_seq_lens_k: ``[S + 1]`` int32 sample offsets (0 .. N) on the tensors'
            device; equal for self-attention.
        max_length_q, max_length_k: the longest sample (ints; the flash kernels size their grid with
            them).
        scale: softmax scale (None: ``D ** -0.5``).
        dropout: attention dropout probability (a nonzero value takes the per-sample SDPA path).
        kernel: one of :func:`available_varlen_kernels`, or ``"sdpa_per_sample"`` (the exact path);
            None: :func:`varlen_kernel_name`.

    Returns:
        ``[N, Hq, D]`` in ``query``'s dtype.
    """
    kernel = varlen_kernel_name(query, key, dropout) if kernel is None else kernel
    if kernel == "sdpa_per_sample":
        return _per_sample_sdpa(query, key, value, cu_seq_lens_q, cu_seq_lens_k, scale, dropout)
    if kernel not in _kernels():
        raise ValueError(f"varlen kernel {kernel!r} is not available here; available: {available_varlen_kernels()}")
    return _kernels()[kernel](query, key, value, cu_seq_lens_q, cu_seq_lens_k, max_length_q, max_length_k, scale)


def varlen_kernel_name(query: torch.Tensor, key: torch.Tensor, dropout: float = 0.0) -> str:
    """The path :func:`varlen_attention` takes by default for these tensors: the first of
    :func:`available_varlen_kernels` on a CUDA device in bfloat16 / float16 with a head size that is
    a multiple of 8 up to 256 and no dropout, else ``"sdpa_per_sample"``."""
    head_size = query.shape[-1]
    fits = (query.is_cuda and query.dtype in (torch.bfloat16, torch.float16) and key.dtype == query.dtype
            and dropout == 0.0 and head_size % 8 == 0 and head_size <= 256)
    names = available_varlen_kernels() if fits else []
    return names[0] if names else "sdpa_per_sample"


def _per_sample_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_q: torch.Tensor,
                     cu_k: torch.Tensor, scale: float | None, dropout: float) -> torch.Tensor:
    """The exact path: causal SDPA on each sample's ``[H, L, D]`` slice (reads the offsets on the host)."""
    gqa = query.shape[1] != key.shape[1]
    q_bounds, k_bounds = cu_q.tolist(), cu_k.tolist()
    outs = []
    for qs, qe, ks, ke in zip(q_bounds[:-1], q_bounds[1:], k_bounds[:-1], k_bounds[1:]):
        q, k, v = (x.transpose(0, 1) for x in (query[qs:qe], key[ks:ke], value[ks:ke]))
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, scale=scale, enable_gqa=gqa)
        outs.append(out.transpose(0, 1))
    return torch.cat(outs)


def available_varlen_kernels() -> list[str]:
    """The CUDA varlen kernels this installation offers, in :data:`KERNEL_ORDER`:
    ``"flash_attn"`` (the flash-attn package, when installed), ``"aten._flash_attention_forward"``
    (torch's flash kernel with ``cum_seq_q`` / ``cum_seq_k``, differentiable) and
    ``"torch.varlen_attn"`` (``torch.nn.attention.varlen.varlen_attn``, its signature inspected:
    ``window_size=(-1, 0)`` or ``is_causal=True`` for causality, ``enable_gqa`` where it has one).
    All take grouped K / V heads without copying them."""
    return [name for name in KERNEL_ORDER if name in _kernels()]


def _kernels() -> dict[str, Callable[..., torch.Tensor]]:
    global _KERNELS
    if _KERNELS is None:
        found = {}
        makers = {"flash_attn": _flash_attn_kernel, "torch.varlen_attn": _torch_varlen_kernel,
                  "aten._flash_attention_forward": _aten_kernel}
        for name, make in ((name, makers[name]) for name in KERNEL_ORDER):
            kernel = make()
            if kernel is not None:
                found[name] = kernel
        _KERNELS = found
    return _KERNELS


def _flash_attn_kernel() -> Callable[..., torch.Tensor] | None:
    try:
        from flash_attn import flash_attn_varlen_func
    except Exception:  # absent, or built for another torch / CUDA: not usable either way
        return None

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
            max_q: int, max_k: int, scale: float | None) -> torch.Tensor:
        out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=0.0, softmax_scale=scale,
                                     causal=True)
        return out[0] if isinstance(out, tuple) else out

    return run


def _torch_varlen_kernel() -> Callable[..., torch.Tensor] | None:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    if "window_size" in params:
        static: dict[str, Any] = {"window_size": (-1, 0)}
    elif "is_causal" in params:
        static = {"is_causal": True}
    else:
        return None
    if "scale" not in params:
        return None
    gqa_flag = "enable_gqa" in params

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
            max_q: int, max_k: int, scale: float | None) -> torch.Tensor:
        extra = {"enable_gqa": q.shape[1] != k.shape[1]} if gqa_flag else {}
        return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, scale=scale, **static, **extra)

    return run


def _aten_kernel() -> Callable[..., torch.Tensor] | None:
    if not hasattr(torch.ops.aten, "_flash_attention_forward"):
        return None

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
            max_q: int, max_k: int, scale: float | None) -> torch.Tensor:
        # positional: dropout_p, is_causal, return_debug_mask (stable across torch 2.x)
        return torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, True, False,
                                                       scale=scale)[0]

    return run
