"""Sample frames from a video file at a target fps and pixel budget, decoding only what is kept.

Frame choice follows the Qwen2.5-VL convention (qwen-vl-utils): ``n = round(duration * fps)``
rounded to a multiple of the temporal patch (2 frames), clamped to ``[min_frames, max_frames]`` and
to the clip length, spread evenly over the clip with ``round(linspace(0, N - 1, n))``. The
effective rate handed to the processor is ``n / N * source_fps`` frames per second.

Memory: decord decodes only the chosen indices and scales inside the decoder; the PyAV fallback
walks the stream once, converting (and scaling) only the chosen frames and stopping after the last
one. Either way at most the sampled frames, at their reduced size, are held — never the clip.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import attrs
import numpy as np

from cosmos_primitives.data.bad_samples import BadSampleError
from cosmos_primitives.utils.extras import MissingExtraError, require

FRAME_FACTOR = 2  # Qwen2.5-VL temporal patch: frames come in pairs
PIXEL_FACTOR = 28  # patch 14 x spatial merge 2: frame sides are multiples of this
MAX_ASPECT_RATIO = 200  # Qwen2.5-VL's smart_resize refuses frames whose long side is more than this x the short


class VideoDecodeError(BadSampleError):
    """A video is missing or no backend could decode it."""


@attrs.define
class SampledVideo:
    """Frames sampled from one clip.

    ``frames``: ``[T, H, W, 3]`` uint8 RGB, ``T`` even, ``H`` and ``W`` multiples of 28;
    ``indices``: the ``T`` source frame indices (0-based, non-decreasing);
    ``fps``: effective sampling rate in frames per second of video time (``T / N * source_fps``);
    ``source_fps`` / ``total_frames`` / ``source_size`` (``(H, W)``): of the file; ``backend``: the
    decoder that produced the frames.
    """

    frames: np.ndarray
    indices: list[int]
    fps: float
    source_fps: float
    total_frames: int
    source_size: tuple[int, int]
    backend: str
    path: str


def fit_pixel_budget(height: int, width: int, max_pixels: int, min_pixels: int = 4 * PIXEL_FACTOR**2,
                     factor: int = PIXEL_FACTOR) -> tuple[int, int]:
    """``(H', W')``: multiples of ``factor`` with ``min_pixels <= H' * W' <= max_pixels`` (when the
    bounds allow), keeping the aspect ratio as closely as possible (the Qwen2-VL ``smart_resize``
    rule, so the processor keeps this size unchanged)."""
    if min(height, width) <= 0:
        raise ValueError(f"frame size must be positive, got {height}x{width}")
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    check_aspect_ratio(h, w, source=(height, width))
    return h, w


def check_aspect_ratio(height: int, width: int, source: tuple[int, int] | None = None) -> None:
    """Refuse, before the processor does, a frame the Qwen2.5-VL processor cannot take.

    Raises:
        ValueError: ``max(height, width) / min(height, width) > MAX_ASPECT_RATIO`` (``source``: the
            file's own ``(H, W)``, named in the message).
    """
    if max(height, width) > MAX_ASPECT_RATIO * min(height, width):
        size = f"{source[0]}x{source[1]} (H x W, {height}x{width} after resizing)" if source else f"{height}x{width}"
        raise ValueError(f"extreme aspect ratio: {size} has a long side over {MAX_ASPECT_RATIO} times the short one, "
                         f"which the Qwen2.5-VL processor refuses; crop or pad the file")


def plan_frame_indices(total_frames: int, source_fps: float, fps: float, max_frames: int,
                       min_frames: int = 4) -> list[int]:
    """Source frame indices to keep (an even count, at least 2).

    Args:
        total_frames: frames in the clip (``N``).
        source_fps: the clip's frame rate.
        fps: wanted samples per second of video.
        max_frames, min_frames: bounds on the count (rounded to even numbers; never above ``N``
            rounded down to even, except that a 1-frame clip gives its frame twice).
    """
    if total_frames <= 0:
        raise ValueError(f"total_frames must be positive, got {total_frames}")
    if fps <= 0 or source_fps <= 0:
        raise ValueError(f"fps and source_fps must be positive, got fps={fps}, source_fps={source_fps}")
    upper = max(FRAME_FACTOR, (min(max_frames, total_frames) // FRAME_FACTOR) * FRAME_FACTOR)
    lower = min(upper, max(FRAME_FACTOR, math.ceil(min_frames / FRAME_FACTOR) * FRAME_FACTOR))
    wanted = round(total_frames / source_fps * fps / FRAME_FACTOR) * FRAME_FACTOR
    n = min(max(wanted, lower), upper)
    return [int(i) for i in np.round(np.linspace(0, total_frames - 1, n))]


def sample_video(path: str | Path, fps: float = 2.0, max_pixels: int = 81920, max_frames: int = 32,
                 min_frames: int = 4, min_pixels: int = 4 * PIXEL_FACTOR**2,
                 backend: Literal["auto", "decord", "pyav"] = "auto") -> SampledVideo:
    """Decode the frames of ``path`` that a Qwen2.5-VL sampler at ``fps`` keeps.

    Args:
        fps: wanted frames per second of video time.
        max_pixels: per-frame pixel budget; frames are scaled inside the decoder to
            :func:`fit_pixel_budget` of the source size.
        max_frames, min_frames: bounds on the number of frames (see :func:`plan_frame_indices`).
        backend: ``"auto"`` tries decord, then PyAV when decord is missing or fails.

    Raises:
        VideoDecodeError: the file is missing, or every backend failed (each failure is named).
    """
    path = Path(path)
    if not path.is_file():
        raise VideoDecodeError(str(path), "video file not found")
    order = {"auto": ("decord", "pyav"), "decord": ("decord",), "pyav": ("pyav",)}[backend]
    failures = []
    for name in order:
        try:
            module = require("decord" if name == "decord" else "av", "video decoding")
        except MissingExtraError as exc:
            failures.append(f"{name}: {exc}")
            continue
        try:
            reader = _read_decord if name == "decord" else _read_pyav
            return reader(module, path, fps, max_pixels, max_frames, min_frames, min_pixels)
        except Exception as exc:  # any decoder failure makes the clip a bad sample
            failures.append(f"{name}: {type(exc).__name__}: {str(exc).strip()[:300]}")
    raise VideoDecodeError(str(path), "could not decode video (" + "; ".join(failures) + ")")


def _read_decord(decord, path: Path, fps, max_pixels, max_frames, min_frames, min_pixels) -> SampledVideo:
    height, width = _native_size(decord, path)
    out_h, out_w = fit_pixel_budget(height, width, max_pixels, min_pixels)
    # The reader scales inside the decoder, so full-size frames are never materialised.
    reader = decord.VideoReader(str(path), width=out_w, height=out_h, num_threads=1)
    total, source_fps = len(reader), float(reader.get_avg_fps())
    indices = plan_frame_indices(total, source_fps, fps, max_frames, min_frames)
    frames = reader.get_batch(indices).asnumpy()
    if frames.shape != (len(indices), out_h, out_w, 3):
        raise RuntimeError(f"decord returned frames of shape {frames.shape}")
    return SampledVideo(frames, indices, len(indices) / total * source_fps, source_fps, total, (height, width),
                        "decord", str(path))


def _native_size(decord, path: Path) -> tuple[int, int]:
    """``(H, W)`` of the stream: from the container header when PyAV is present (nothing decoded),
    else from decord's first frame (decord exposes no size without decoding)."""
    try:
        av = require("av")
        with av.open(str(path)) as container:
            context = container.streams.video[0].codec_context
            if context.height and context.width:
                return int(context.height), int(context.width)
    except Exception:  # fall back to decoding one frame with decord
        pass
    first = decord.VideoReader(str(path), num_threads=1)[0].shape
    return int(first[0]), int(first[1])


def _read_pyav(av, path: Path, fps, max_pixels, max_frames, min_frames, min_pixels) -> SampledVideo:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        source_fps = float(stream.average_rate or stream.guessed_rate or 0)
        height, width = stream.codec_context.height, stream.codec_context.width
        total = int(stream.frames or 0)
        if total <= 0:
            # Container without a frame count: count packets (demuxing only, nothing decoded).
            total = sum(1 for packet in container.demux(stream) if packet.size)
            container.seek(0)
        if source_fps <= 0 or total <= 0:
            raise RuntimeError(f"no frame rate ({source_fps}) or no frames ({total}) in the video stream")
        indices = plan_frame_indices(total, source_fps, fps, max_frames, min_frames)
        out_h, out_w = fit_pixel_budget(height, width, max_pixels, min_pixels)
        wanted: dict[int, int] = {}
        for i in indices:
            wanted[i] = wanted.get(i, 0) + 1
        frames: list[np.ndarray] = []
        last = indices[-1]
        stream.thread_type = "AUTO"
        for position, frame in enumerate(container.decode(stream)):
            if position in wanted:
                image = frame.to_ndarray(format="rgb24", width=out_w, height=out_h)
                frames.extend([image] * wanted[position])
            if position >= last:
                break
    if len(frames) != len(indices):
        raise RuntimeError(f"stream ended after {len(frames)} of {len(indices)} wanted frames "
                           f"(header says {total} frames)")
    return SampledVideo(np.stack(frames), indices, len(indices) / total * source_fps, source_fps, total,
                        (height, width), "pyav", str(path))
