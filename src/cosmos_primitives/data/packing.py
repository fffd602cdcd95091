"""Batch encoded samples: packed rows (several samples per row, no attention across them) or padding.

Batch contract (what the trainer passes to a Hugging Face Qwen2.5-VL / Qwen2 model):

- ``input_ids`` ``[B, T]`` int64; ``labels`` ``[B, T]`` int64, ``-100`` = not trained, aligned
  like HF (``labels[t]`` is the target at position ``t``; the loss shifts by one);
- ``position_ids``: restarting at 0 for every packed sample;
- media, when present, concatenated over the batch in row-major sample order: ``pixel_values``
  ``[P, 1176]``, ``image_grid_thw`` ``[num_images, 3]``, ``pixel_values_videos`` ``[Pv, 1176]``,
  ``video_grid_thw`` ``[num_videos, 3]``, ``second_per_grid_ts`` ``[num_videos]``.

Packed batches (:func:`collate_packed`) carry NO ``attention_mask``: its absence is what makes
transformers derive the sample boundaries from the position ids (a position that does not follow
its predecessor by +1 starts a new sample), giving a block-diagonal causal mask under sdpa / eager
/ flex attention and per-sample ``cu_seqlens`` under flash-attention (which needs ``B == 1``: use
one row per batch there). For Qwen2.5-VL, ``position_ids`` is ``[4, B, T]``: row 0 the text
position (``0..len-1`` per sample, used only to find boundaries), rows 1-3 the mRoPE temporal /
height / width positions; text models get ``[B, T]``. The model must run with ``use_cache=False``
(transformers turns the packed-sequence mask off when a KV cache object exists):
:func:`model_inputs` drops ``labels`` and adds it.

Padded batches (:func:`collate_padded`) carry ``attention_mask`` ``[B, T]`` (1 = real token,
right padding) and ``position_ids`` ``[3, B, T]`` (VL) or ``[B, T]`` (text).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from cosmos_primitives.data.qwen_vl_encoding import IGNORE_INDEX, MEDIA_KEYS, EncodedSample


def plan_rows(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Group sample indices into rows of at most ``budget`` tokens (first-fit decreasing).

    Each row starts with the oldest unplaced sample (so no sample waits forever) and is filled with
    the longest remaining samples that still fit.

    Raises:
        ValueError: a sample is longer than ``budget``.
    """
    for i, n in enumerate(lengths):
        if n > budget:
            raise ValueError(f"sample {i} has {n} tokens, more than the packing budget of {budget}")
    unplaced = list(range(len(lengths)))
    by_length = sorted(unplaced, key=lambda i: (-lengths[i], i))
    placed = [False] * len(lengths)
    rows: list[list[int]] = []
    for seed in unplaced:
        if placed[seed]:
            continue
        row, room = [seed], budget - lengths[seed]
        placed[seed] = True
        for i in by_length:
            if not placed[i] and lengths[i] <= room:
                row.append(i)
                room -= lengths[i]
                placed[i] = True
        rows.append(row)
    return rows


def collate_packed(rows: Sequence[Sequence[EncodedSample]], pad_token_id: int,
                   pad_to: int | None = None) -> dict[str, torch.Tensor]:
    """Packed batch of ``B = len(rows)`` rows, each the concatenation of its samples, right-padded
    to the longest row (or to ``pad_to``). See the module docstring for the keys and shapes.

    The first label of every sample is ``-100`` (with HF's shift it would be predicted from the
    previous sample's last token). The padding tail of a row gets positions ``0..n-1`` so it forms
    its own (label-free) segment that no real token can see.
    """
    if not rows or any(not row for row in rows):
        raise ValueError("collate_packed needs at least one row and no empty rows")
    samples = [s for row in rows for s in row]
    vl = _check_same_kind(samples)
    lengths = [sum(len(s) for s in row) for row in rows]
    width = max(lengths) if pad_to is None else pad_to
    if width < max(lengths):
        raise ValueError(f"pad_to={pad_to} is shorter than the longest packed row ({max(lengths)} tokens)")
    batch = len(rows)
    input_ids = torch.full((batch, width), pad_token_id, dtype=torch.long)
    labels = torch.full((batch, width), IGNORE_INDEX, dtype=torch.long)
    positions = torch.zeros((4 if vl else 1, batch, width), dtype=torch.long)
    for b, row in enumerate(rows):
        offset = 0
        for s in row:
            n = len(s)
            input_ids[b, offset:offset + n] = s.input_ids
            labels[b, offset:offset + n] = s.labels
            labels[b, offset] = IGNORE_INDEX
            positions[0, b, offset:offset + n] = torch.arange(n)
            if vl:
                positions[1:, b, offset:offset + n] = s.position_ids
            offset += n
        tail = width - offset
        positions[:, b, offset:] = torch.arange(tail)
    out = {"input_ids": input_ids, "labels": labels, "position_ids": positions if vl else positions[0]}
    out.update(_concat_media(samples))
    return out


def collate_padded(samples: Sequence[EncodedSample], pad_token_id: int,
                   pad_to: int | None = None) -> dict[str, torch.Tensor]:
    """Padded batch: one sample per row, right-padded to the longest (or ``pad_to``), with
    ``attention_mask`` ``[B, T]``; see the module docstring."""
    if not samples:
        raise ValueError("collate_padded needs at least one sample")
    vl = _check_same_kind(samples)
    width = max(len(s) for s in samples) if pad_to is None else pad_to
    batch = len(samples)
    input_ids = torch.full((batch, width), pad_token_id, dtype=torch.long)
    labels = torch.full((batch, width), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((batch, width), dtype=torch.long)
    positions = torch.zeros((3 if vl else 1, batch, width), dtype=torch.long)
    for b, s in enumerate(samples):
        n = len(s)
        if n > width:
            raise ValueError(f"sample {s.source or b} has {n} tokens, more than pad_to={pad_to}")
        input_ids[b, :n] = s.input_ids
        labels[b, :n] = s.labels
        attention_mask[b, :n] = 1
        positions[:, b, :n] = s.position_ids if vl else s.position_ids.view(1, n)
    out = {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask,
           "position_ids": positions if vl else positions[0]}
    out.update(_concat_media(samples))
    return out


def model_inputs(batch: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments for ``model(**...)``: the batch without ``labels``, with ``use_cache=False``."""
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    inputs["use_cache"] = False
    return inputs


def padding_stats(batch: dict[str, torch.Tensor], pad_token_id: int | None = None) -> tuple[int, int]:
    """``(real tokens, total slots)`` of a collated batch: real = attention_mask ones when present,
    else the tokens not in a packed row's padding tail."""
    if "attention_mask" in batch:
        return int(batch["attention_mask"].sum()), int(batch["attention_mask"].numel())
    text_pos = batch["position_ids"][0] if batch["position_ids"].dim() == 3 else batch["position_ids"]
    ids = batch["input_ids"]
    real = 0
    for b in range(ids.shape[0]):
        # the tail is the last segment when it is made of pad tokens only and carries no labels
        starts = (text_pos[b] == 0).nonzero().flatten().tolist()
        tail = starts[-1]
        is_tail = (pad_token_id is None or bool((ids[b, tail:] == pad_token_id).all())) and bool(
            (batch["labels"][b, tail:] == IGNORE_INDEX).all()) and len(starts) > 1
        real += tail if is_tail else ids.shape[1]
    return real, int(ids.numel())


def _check_same_kind(samples: Sequence[EncodedSample]) -> bool:
    kinds = {s.is_multimodal_rope for s in samples}
    if len(kinds) != 1:
        raise ValueError("cannot batch Qwen2.5-VL samples (3-D positions) with text-model samples (1-D positions)")
    return kinds.pop()


def _concat_media(samples: Sequence[EncodedSample]) -> dict[str, torch.Tensor]:
    out = {}
    for key in MEDIA_KEYS:
        parts = [getattr(s, key) for s in samples if getattr(s, key) is not None]
        if parts:
            out[key] = torch.cat(parts, dim=0)
    return out
