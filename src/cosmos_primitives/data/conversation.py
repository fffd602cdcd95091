"""The chat-conversation sample every VLM dataset adapter produces, and media loading for it.

A conversation is a list of ``{"role": "system" | "user" | "assistant", "content": ...}`` where
``content`` is a string or a list of parts: ``{"type": "text", "text": ...}``,
``{"type": "image", "image": path}`` or ``{"type": "video", "video": path, "fps": 4,
"max_pixels": 81920}`` (Qwen2.5-VL / Cosmos-Reason style).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from cosmos_primitives.data.bad_samples import BadSampleError, bad_sample_boundary
from cosmos_primitives.data.media import MediaSettings, resolve_media_path

_ROLES = ("system", "user", "assistant")


@attrs.define
class ConversationSample:
    """One conversation with its media loaded.

    ``images``: ``[H, W, 3]`` uint8 arrays and ``videos``: ``[T, H, W, 3]`` uint8 arrays, each in
    the order their parts appear; ``video_fps``: effective sampling rate of each video (frames per
    second of video time); ``frame_indices``: the source frame indices of each video;
    ``video_metadata``: each video's source fps, frame indices and range
    (:attr:`~cosmos_primitives.data.SampledVideo.metadata`);
    ``media_paths``: resolved paths of all media; ``sample_id``: the row / file id.
    """

    conversation: list[dict[str, Any]]
    sample_id: str = ""
    images: list[np.ndarray] = attrs.field(factory=list)
    videos: list[np.ndarray] = attrs.field(factory=list)
    video_fps: list[float] = attrs.field(factory=list)
    frame_indices: list[list[int]] = attrs.field(factory=list)
    video_metadata: list[dict[str, Any]] = attrs.field(factory=list)
    media_paths: list[str] = attrs.field(factory=list)


def normalize_conversation(raw: Any, where: str = "conversation") -> list[dict[str, Any]]:
    """Check and tidy a conversation as stored in a dataset.

    Accepts a list of messages or its JSON text; drops ``None`` fields that Arrow adds to parts
    (every part of a column shares one struct type); infers a missing part ``type`` from its
    ``image`` / ``video`` / ``text`` key.

    Raises:
        BadSampleError: naming ``where`` and what is wrong.
    """
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise BadSampleError(where, f"conversation is a string but not JSON: {exc}") from exc
    if not isinstance(raw, list) or not raw:
        raise BadSampleError(where, f"conversation must be a non-empty list of messages, got {type(raw).__name__}")
    messages = []
    for i, message in enumerate(raw):
        if not isinstance(message, dict) or message.get("role") not in _ROLES or "content" not in message:
            raise BadSampleError(where, f"message {i} must be {{'role': one of {_ROLES}, 'content': ...}}, "
                                        f"got {str(message)[:200]}")
        content = message["content"]
        if isinstance(content, list):
            content = [_normalize_part(part, f"{where} message {i}") for part in content]
        elif not isinstance(content, str):
            raise BadSampleError(where, f"message {i} content must be a string or a list of parts")
        messages.append({"role": message["role"], "content": content})
    if not any(m["role"] == "assistant" for m in messages):
        raise BadSampleError(where, "conversation has no assistant message to train on")
    return messages


def _normalize_part(part: Any, where: str) -> dict[str, Any]:
    if isinstance(part, str):
        return {"type": "text", "text": part}
    if not isinstance(part, dict):
        raise BadSampleError(where, f"content part must be a dict, got {type(part).__name__}")
    part = {k: v for k, v in part.items() if v is not None}
    kind = part.get("type") or next((k for k in ("video", "image", "text") if k in part), None)
    if kind == "image_url":
        kind = "image"
        url = part.get("image_url")
        part["image"] = url.get("url") if isinstance(url, dict) else url
    if kind not in ("text", "image", "video") or (kind != "text" and not part.get(kind)):
        raise BadSampleError(where, f"content part needs a type text / image / video and its value, got {part}")
    part["type"] = kind
    if kind == "text":
        part["text"] = str(part.get("text", ""))
    return part


def load_conversation(conversation: list[dict[str, Any]], media_dir: str | Path | None, settings: MediaSettings,
                      sample_id: str = "") -> ConversationSample:
    """Resolve every media path of a (normalized) conversation and load the media.

    The returned conversation holds absolute media paths (the parts' other keys as they were); the
    sample's ``video_fps`` the rate each video was sampled at.

    Raises:
        BadSampleError: a media file is missing or cannot be decoded (``.path`` names it).
    """
    sample = ConversationSample(conversation=[], sample_id=sample_id)
    for message in conversation:
        content = message["content"]
        if isinstance(content, list):
            content = [_load_part(part, media_dir, settings, sample) for part in content]
        sample.conversation.append({"role": message["role"], "content": content})
    return sample


def _load_part(part: dict[str, Any], media_dir, settings: MediaSettings, sample: ConversationSample) -> dict:
    kind = part["type"]
    if kind == "text":
        return dict(part)
    path = resolve_media_path(part[kind], media_dir)
    with bad_sample_boundary(str(path), f"could not load {kind}"):  # whatever a reader raises names the file
        media = settings.image(path, part) if kind == "image" else settings.video(path, part)
    if kind == "image":
        sample.images.append(media)
    else:
        sample.videos.append(media.frames)
        sample.video_fps.append(media.fps)
        sample.frame_indices.append(media.indices)
        sample.video_metadata.append(media.metadata)
    sample.media_paths.append(str(path))
    loaded = dict(part)
    # Only the path changes: the part's own sampling keys stay, so re-reading it with the same
    # settings (a rollout record on the trainer side) takes the same frames.
    loaded[kind] = str(path)
    return loaded
