"""Model inputs of prompts: :class:`Prompt` objects -> processor tensors (chat template + images + videos)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import torch

from cosmos_primitives.data.records import Prompt
from cosmos_primitives.data.video_sampling import video_metadata
from cosmos_primitives.data.vl_family import video_processor_kwargs

# Keys of a Qwen2.5-VL processor output that have one row per sequence.
PER_SEQUENCE_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids")


def render_prompt(processor: Any, prompt: Prompt) -> str:
    """The model's input text of ``prompt``: its conversation through the chat template, ending with
    the assistant header; a plain-text prompt (a ``str``) as it is."""
    if isinstance(prompt.conversation, str):
        if prompt.images or prompt.videos:
            raise ValueError(f"prompt {prompt.prompt_id!r} is plain text with images or videos; plain text has no "
                             "media placeholders: give it as a conversation with image / video parts")
        return prompt.conversation
    template_owner = processor if hasattr(processor, "apply_chat_template") else processor.tokenizer
    try:
        return template_owner.apply_chat_template(prompt.conversation, tokenize=False, add_generation_prompt=True)
    except Exception as exc:
        raise ValueError(f"prompt {prompt.prompt_id!r}: the chat template failed on its conversation: {exc}") from exc


def encode_prompts(processor: Any, prompts: Sequence[Prompt]) -> dict[str, torch.Tensor]:
    """Left-padded processor batch of ``prompts`` (one row each), media included.

    Returns the processor's tensors: ``input_ids`` / ``attention_mask`` ``[P, L]`` and, for VLM
    processors, ``pixel_values`` / ``image_grid_thw`` / ``pixel_values_videos`` /
    ``video_grid_thw`` / ``second_per_grid_ts`` for the prompts' media in order. Images and videos go
    in as loaded (:class:`~cosmos_primitives.data.MediaSettings` sizes them as qwen-vl-utils does,
    so the processor keeps their size), each video with its ``video_metadata`` (source fps and frame
    indices: Qwen3-VL's timestamps) or else as consecutive frames at its ``video_fps``.
    """
    given = [p.token_ids is not None for p in prompts]
    if any(given):
        return _token_id_batch(processor, prompts) if all(given) else _mixed_batch(processor, prompts)
    texts = [render_prompt(processor, p) for p in prompts]
    images = [img for p in prompts for img in p.images]
    videos = [vid for p in prompts for vid in p.videos]
    kwargs: dict[str, Any] = {"text": texts, "return_tensors": "pt", "padding": True, "padding_side": "left"}
    if images:
        kwargs["images"] = images
    if videos:
        fps = [f for p in prompts for f in (p.video_fps or [2.0] * len(p.videos))]
        metadata = [m for p in prompts for m in (p.video_metadata or [None] * len(p.videos))]
        if len(fps) != len(videos) or len(metadata) != len(videos):
            raise ValueError(f"{len(videos)} videos but {len(fps)} video_fps and {len(metadata)} video_metadata "
                             "entries over the prompts; give one per video (or none) in each prompt")
        kwargs["videos"] = videos
        # videos_kwargs, not top-level keys: do_resize there would reach the image processor too
        kwargs["videos_kwargs"] = {
            "video_metadata": [video_metadata(len(v), f, m) for v, f, m in zip(videos, fps, metadata)],
            **video_processor_kwargs(processor, videos)}
    # padding_side is a call argument (a tokenizer and a processor both take it), so the caller's
    # tokenizer keeps its own padding_side
    return dict(processor(**kwargs))


def media_inputs(processor: Any, prompts: Sequence[Prompt]) -> dict[str, torch.Tensor]:
    """The media tensors of ``prompts``' images and videos, as :func:`encode_prompts` gives them for
    the prompts themselves, without any token rows: ``pixel_values`` / ``image_grid_thw`` /
    ``pixel_values_videos`` / ``video_grid_thw`` / ``second_per_grid_ts``, prompt by prompt in order.

    The processor sizes every image and video on its own, so a conversation holding only the same
    media (encoded here) gives the same tensors as the prompt's own.
    """
    carriers = [attrs.evolve(p, token_ids=None, conversation=[{"role": "user", "content": [
        *({"type": "image"} for _ in p.images), *({"type": "video"} for _ in p.videos),
        {"type": "text", "text": "."}]}]) for p in prompts]
    return {k: v for k, v in encode_prompts(processor, carriers).items() if k not in PER_SEQUENCE_KEYS}


def _token_id_batch(processor: Any, prompts: Sequence[Prompt]) -> dict[str, torch.Tensor]:
    """Left-padded ``input_ids`` / ``attention_mask`` ``[P, L]`` of prompts given as token ids; with
    their media (:func:`media_inputs`) and ``mm_token_type_ids`` ``[P, L]`` when they hold images or
    videos, whose placeholders the ids must hold already expanded (one pad per merged patch)."""
    with_media = any(p.images or p.videos for p in prompts)
    if with_media and not hasattr(processor, "create_mm_token_type_ids"):
        raise ValueError(f"prompts {[p.prompt_id for p in prompts if p.images or p.videos]} give token_ids and media, "
                         f"but {type(processor).__name__} is no multimodal processor (no create_mm_token_type_ids); "
                         "pass the model's AutoProcessor")
    pad = getattr(processor, "tokenizer", processor).pad_token_id
    width = max(len(p.token_ids) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        if p.token_ids:
            input_ids[row, width - len(p.token_ids):] = torch.tensor(p.token_ids, dtype=torch.long)
            attention_mask[row, width - len(p.token_ids):] = 1
    out = {"input_ids": input_ids, "attention_mask": attention_mask}
    if with_media:
        # the pads are no placeholders, so marking every id of a row as the processor does is exact
        out["mm_token_type_ids"] = torch.tensor(processor.create_mm_token_type_ids(input_ids.tolist()),
                                                dtype=torch.long)
        out.update(media_inputs(processor, prompts))
    return out


def _mixed_batch(processor: Any, prompts: Sequence[Prompt]) -> dict[str, torch.Tensor]:
    """Prompts given as token ids beside text prompts: the text ones are encoded first (text only)."""
    tokenizer = getattr(processor, "tokenizer", processor)
    for p in prompts:
        if p.images or p.videos:
            raise ValueError(f"prompt {p.prompt_id!r}: a batch mixing prompts given as token ids with others holds "
                             "text only; generate media prompts in a batch of their own")
    ids = [p.token_ids if p.token_ids is not None
           else tokenizer(render_prompt(processor, p))["input_ids"] for p in prompts]
    return _token_id_batch(processor, [attrs.evolve(p, token_ids=list(i)) for p, i in zip(prompts, ids)])


def repeat_batch(batch: dict[str, torch.Tensor], prompts: Sequence[Prompt], n: int) -> dict[str, torch.Tensor]:
    """Repeat every prompt row (and its media rows) ``n`` times, keeping copies adjacent.

    ``pixel_values`` holds one block of ``t*h*w`` patch rows per image (``image_grid_thw``), in
    prompt order; blocks are repeated with the sequence they belong to.
    """
    if n == 1:
        return batch
    out = {k: v.repeat_interleave(n, dim=0) for k, v in batch.items() if k in PER_SEQUENCE_KEYS}
    media = (
        ("pixel_values", "image_grid_thw", [len(p.images) for p in prompts]),
        ("pixel_values_videos", "video_grid_thw", [len(p.videos) for p in prompts]),
    )
    for values_key, grid_key, per_prompt in media:
        if values_key not in batch:
            continue
        grid = batch[grid_key]
        rows = torch.split(batch[values_key], grid.prod(dim=-1).tolist())
        values, grids, start = [], [], 0
        for count in per_prompt:
            block = list(range(start, start + count))
            start += count
            for _ in range(n):
                values.extend(rows[i] for i in block)
                grids.extend(grid[i] for i in block)
        out[values_key] = torch.cat(values) if values else batch[values_key][:0]
        out[grid_key] = torch.stack(grids) if grids else grid[:0]
    if "second_per_grid_ts" in batch:
        per_video = batch["second_per_grid_ts"]
        ts, start = [], 0
        for p in prompts:
            block = per_video[start:start + len(p.videos)]
            start += len(p.videos)
            ts.extend([block] * n)
        out["second_per_grid_ts"] = torch.cat(ts) if ts else per_video[:0]
    for k, v in batch.items():
        out.setdefault(k, v)
    return out
