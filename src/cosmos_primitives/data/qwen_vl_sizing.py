"""How many frames, which ones and what size: qwen-vl-utils' rules for Qwen-VL images and videos.

cosmos-rl's Qwen2.5-VL / Qwen3-VL data packers hand every image and video part of a conversation to
qwen-vl-utils (``process_vision_info`` -> ``fetch_image`` / ``fetch_video``); the frames and sizes it
chooses decide the vision tokens. These are its rules, as pure functions of the part's keys and the
file's geometry (no I/O), so that :mod:`cosmos_primitives.data.video_sampling` and
:mod:`cosmos_primitives.data.media` produce the same frames:

- frame count (:func:`smart_nframes`): ``total / source_fps * fps`` clamped to
  ``[min_frames, max_frames]`` (defaults 4 and ``min(768, total)``, rounded up / down to even) and
  to the clip, then *floored* to an even number; or the part's ``nframes`` rounded to even;
- frames (:func:`frame_indices`): ``round(linspace(start, end, n))``, as torch computes it;
  ``video_start`` / ``video_end`` (seconds) narrow ``[start, end]`` (:func:`frame_range`);
- frame size (:func:`video_frame_size`): :func:`smart_resize` within ``[min_pixels, max_pixels]``
  where ``min_pixels`` defaults to 128 tokens and ``max_pixels`` is the part's, capped by
  ``max(min(768 tokens, total_pixels / n * 2), 1.05 * min_pixels)``;
- image size (:func:`image_size`): :func:`smart_resize` within 4 .. 16384 tokens by default.

One token here is ``factor**2`` pixels, ``factor = patch_size * 2`` (28 for Qwen2.5-VL, 32 for
Qwen3-VL). Where qwen-vl-utils versions differ: ``min_pixels > max_pixels`` (Cosmos-Reason1's
scripts set ``max_pixels = 81920`` for videos, under the 100352 default ``min_pixels``) follows
0.0.11, which Cosmos-Reason1's lock pins: a frame above ``max_pixels`` shrinks to fit it, a frame
below grows to ``min_pixels``; 0.0.14 refuses those settings (``AssertionError``).
"""

from __future__ import annotations

import math

import attrs
import torch

FRAME_FACTOR = 2  # the temporal patch: frames come in pairs
SPATIAL_MERGE_SIZE = 2  # patches merged per side into one token
MAX_ASPECT_RATIO = 200  # the long side may be at most this many times the short one
DEFAULT_FPS = 2.0
FPS_MIN_FRAMES = 4
FPS_MAX_FRAMES = 768
IMAGE_MIN_TOKENS = 4
IMAGE_MAX_TOKENS = 16384
VIDEO_MIN_TOKENS = 128
VIDEO_MAX_TOKENS = 768
MODEL_SEQ_LEN = 128000  # qwen-vl-utils' default total_pixels is 0.9 x this many tokens


def pixel_factor(patch_size: int = 14) -> int:
    """Pixels per side of one vision token: ``patch_size * SPATIAL_MERGE_SIZE`` (28 or 32)."""
    return patch_size * SPATIAL_MERGE_SIZE


def smart_resize(height: int, width: int, factor: int = 28, min_pixels: float | None = None,
                 max_pixels: float | None = None) -> tuple[int, int]:
    """``(H', W')``, multiples of ``factor`` near ``(height, width)`` with ``H' * W'`` within
    ``[min_pixels, max_pixels]`` (defaults: 4 and 16384 tokens), keeping the aspect ratio.

    The sides are first rounded to ``factor``; if that is over ``max_pixels`` both sides are scaled
    down and floored, else if under ``min_pixels`` scaled up and ceiled. ``max_pixels`` is checked
    first, so with ``min_pixels > max_pixels`` a large frame ends at most ``max_pixels`` and a
    small one at least ``min_pixels`` (qwen-vl-utils 0.0.11).

    Raises:
        ValueError: an aspect ratio over :data:`MAX_ASPECT_RATIO` (which the processor refuses too),
            a non-positive side, or a side that would shrink to 0 px.
    """
    if min(height, width) <= 0:
        raise ValueError(f"image / frame size must be positive, got {height}x{width} (H x W)")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f"extreme aspect ratio: {height}x{width} (H x W) has a long side over {MAX_ASPECT_RATIO} "
                         f"times the short one, which qwen-vl-utils and the Qwen-VL processor refuse; crop or pad "
                         f"the file")
    max_pixels = IMAGE_MAX_TOKENS * factor**2 if max_pixels is None else max_pixels
    min_pixels = IMAGE_MIN_TOKENS * factor**2 if min_pixels is None else min_pixels
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = math.floor(height / beta / factor) * factor
        w = math.floor(width / beta / factor) * factor
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    if min(h, w) <= 0:
        raise ValueError(f"{height}x{width} (H x W) within max_pixels={max_pixels} leaves a side under {factor} px; "
                         f"raise max_pixels or crop the file")
    return int(h), int(w)


def image_size(height: int, width: int, *, factor: int = 28, min_pixels: float | None = None,
               max_pixels: float | None = None, resized_height: int | None = None,
               resized_width: int | None = None) -> tuple[int, int]:
    """``(H', W')`` of an image (``fetch_image``): :func:`smart_resize` of the file's size within the
    part's ``min_pixels`` / ``max_pixels``, or of ``(resized_height, resized_width)`` when the part
    gives both (then within the default bounds)."""
    if resized_height is not None and resized_width is not None:
        return smart_resize(resized_height, resized_width, factor)
    return smart_resize(height, width, factor, min_pixels, max_pixels)


def smart_nframes(total_frames: int, video_fps: float, *, fps: float | None = None, nframes: int | None = None,
                  min_frames: int | None = None, max_frames: int | None = None) -> int:
    """How many frames to sample from a clip (or range) of ``total_frames`` at ``video_fps``.

    ``nframes``: that many, rounded to even. Else ``total_frames / video_fps * fps`` (``fps``
    default 2.0), clamped to ``[min_frames, max_frames]`` (default 4 rounded up to even, and
    ``min(768, total_frames)`` rounded down to even), then to ``total_frames``, then floored to even.

    Raises:
        ValueError: both ``fps`` and ``nframes`` given, or the count is not within
            ``[2, total_frames]`` (a clip of fewer than 2 frames, or an ``nframes`` past its end).
    """
    if fps is not None and nframes is not None:
        raise ValueError(f"a video part takes either 'fps' or 'nframes', not both (got fps={fps}, nframes={nframes})")
    if nframes is not None:
        count = round(nframes / FRAME_FACTOR) * FRAME_FACTOR
    else:
        fps = DEFAULT_FPS if fps is None else fps
        lower = math.ceil((FPS_MIN_FRAMES if min_frames is None else min_frames) / FRAME_FACTOR) * FRAME_FACTOR
        upper_key = min(FPS_MAX_FRAMES, total_frames) if max_frames is None else max_frames
        upper = math.floor(upper_key / FRAME_FACTOR) * FRAME_FACTOR
        wanted = total_frames / video_fps * fps
        count = math.floor(min(min(max(wanted, lower), upper), total_frames) / FRAME_FACTOR) * FRAME_FACTOR
    if not FRAME_FACTOR <= count <= total_frames:
        raise ValueError(f"{count} frames to sample is outside [{FRAME_FACTOR}, {total_frames}] (the clip's frames"
                         f"{'' if nframes is None else '; nframes=' + str(nframes)}); a clip needs at least "
                         f"{FRAME_FACTOR} frames")
    return int(count)


def frame_range(total_frames: int, video_fps: float, video_start: float | None = None,
                video_end: float | None = None) -> tuple[int, int, int]:
    """``(first, last, count)`` frame indices of the part's ``[video_start, video_end]`` seconds
    (the whole clip without them): start ceiled, end floored, both clamped to the clip.

    Raises:
        ValueError: no frames or fps, or a range that leaves ``first >= last``.
    """
    if video_fps <= 0 or total_frames <= 0:
        raise ValueError(f"the clip needs a positive frame rate and frame count, got {video_fps} fps, "
                         f"{total_frames} frames")
    if video_start is None and video_end is None:
        return 0, total_frames - 1, total_frames
    duration = total_frames / video_fps
    first = 0 if video_start is None else math.ceil(max(0.0, min(video_start, duration)) * video_fps)
    last = total_frames - 1
    if video_end is not None:
        last = min(math.floor(max(0.0, min(video_end, duration)) * video_fps), total_frames - 1)
    if first >= last:
        raise ValueError(f"video_start={video_start} / video_end={video_end} leave frames {first}..{last} of a "
                         f"{duration:.2f} s clip ({total_frames} frames at {video_fps:g} fps); give a longer range")
    return first, last, last - first + 1


def frame_indices(first: int, last: int, count: int) -> list[int]:
    """``count`` indices spread over ``[first, last]``: ``round(linspace(first, last, count))``
    (halves to even), computed by torch in float32 as qwen-vl-utils computes it."""
    return [int(i) for i in torch.linspace(first, last, count).round().long().tolist()]


def video_pixel_bounds(num_frames: int, *, factor: int = 28, min_pixels: float | None = None,
                       max_pixels: float | None = None, total_pixels: float | None = None) -> tuple[float, float]:
    """``(min_pixels, max_pixels)`` per frame of a video of ``num_frames`` sampled frames.

    ``min_pixels`` defaults to 128 tokens; ``max_pixels`` is the part's (if any) capped by
    ``max(min(768 tokens, total_pixels / num_frames * 2), int(1.05 * min_pixels))``, where
    ``total_pixels`` defaults to ``0.9 * 128000`` tokens (qwen-vl-utils reads that 128000 from
    ``MODEL_SEQ_LEN``; here it is the part's ``total_pixels``).
    """
    lower = VIDEO_MIN_TOKENS * factor**2 if min_pixels is None else min_pixels
    total = MODEL_SEQ_LEN * factor * factor * 0.9 if total_pixels is None else total_pixels
    limit = max(min(VIDEO_MAX_TOKENS * factor**2, total / num_frames * FRAME_FACTOR), int(lower * 1.05))
    return lower, limit if max_pixels is None else min(max_pixels, limit)


def video_frame_size(height: int, width: int, num_frames: int, *, factor: int = 28,
                     min_pixels: float | None = None, max_pixels: float | None = None,
                     total_pixels: float | None = None, resized_height: int | None = None,
                     resized_width: int | None = None) -> tuple[int, int]:
    """``(H', W')`` every sampled frame is resized to (``fetch_video``): :func:`smart_resize` of the
    clip's size within :func:`video_pixel_bounds`, or of ``(resized_height, resized_width)`` when the
    part gives both (then within the image defaults)."""
    if resized_height is not None and resized_width is not None:
        return smart_resize(resized_height, resized_width, factor)
    lower, upper = video_pixel_bounds(num_frames, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels,
                                      total_pixels=total_pixels)
    return smart_resize(height, width, factor, lower, upper)


@attrs.define(frozen=True)
class VideoPlan:
    """What to take from one clip: ``indices`` (source frames, non-decreasing), ``size`` ``(H, W)``
    of every frame after resizing, ``sample_fps`` (frames per second of video time handed to the
    processor: ``len(indices) / range_frames * source_fps``), ``range_frames`` (frames in the
    sampled range)."""

    indices: list[int]
    size: tuple[int, int]
    sample_fps: float
    range_frames: int


def plan_video(total_frames: int, source_fps: float, height: int, width: int, *, factor: int = 28,
               fps: float | None = None, nframes: int | None = None, min_frames: int | None = None,
               max_frames: int | None = None, min_pixels: float | None = None, max_pixels: float | None = None,
               total_pixels: float | None = None, resized_height: int | None = None,
               resized_width: int | None = None, video_start: float | None = None,
               video_end: float | None = None) -> VideoPlan:
    """The frames and size qwen-vl-utils' ``fetch_video`` takes from a clip of ``total_frames`` at
    ``source_fps`` and ``height x width``, for a part with these keys (None: its default).

    Raises:
        ValueError: settings or a clip qwen-vl-utils refuses (see :func:`smart_nframes`,
            :func:`frame_range`, :func:`smart_resize`).
    """
    first, last, count = frame_range(total_frames, source_fps, video_start, video_end)
    n = smart_nframes(count, source_fps, fps=fps, nframes=nframes, min_frames=min_frames, max_frames=max_frames)
    size = video_frame_size(height, width, n, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels,
                            total_pixels=total_pixels, resized_height=resized_height, resized_width=resized_width)
    return VideoPlan(frame_indices(first, last, n), size, n / max(count, 1e-6) * source_fps, count)
