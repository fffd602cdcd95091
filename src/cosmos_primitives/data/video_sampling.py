"""Sample a video file's frames the way cosmos-rl's Qwen-VL packers do, decoding only what is kept.

Which frames and what size follow qwen-vl-utils (:mod:`cosmos_primitives.data.qwen_vl_sizing`);
the pixels too: each kept frame is decoded at the file's size and resized with torch's bicubic,
antialiased interpolation, clamped and rounded to uint8 (torchvision's ``resize`` of a uint8 frame,
which ``fetch_video`` applies), so the frames equal qwen-vl-utils' frame for frame.

Memory: decord decodes only the chosen indices, a few at a time; the PyAV fallback walks the stream
once, converting only the chosen frames and stopping after the last one. Each chunk is resized as
soon as it is decoded, so at most the sampled frames at their final size plus one chunk of
full-size frames (``CHUNK_BYTES`` as float32) are held — never the clip. qwen-vl-utils itself holds
every sampled frame at full size, then a float32 copy of all of them to resize (and, without decord
or torchcodec, the whole clip).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import attrs
import numpy as np
import torch

from cosmos_primitives.data.bad_samples import BadSampleError
from cosmos_primitives.data.qwen_vl_sizing import VideoPlan, pixel_factor, plan_video
from cosmos_primitives.utils.extras import MissingExtraError, require

CHUNK_BYTES = 64 * 2**20  # float32 full-size frames resized at once


class VideoDecodeError(BadSampleError):
    """A video is missing or no backend could decode it."""


@attrs.define
class SampledVideo:
    """Frames sampled from one clip.

    ``frames``: ``[T, H, W, 3]`` uint8 RGB, ``T`` even, ``H`` and ``W`` multiples of the model's
    pixel factor (28 for Qwen2.5-VL); ``indices``: the ``T`` source frame indices (0-based,
    non-decreasing); ``fps``: the sampling rate handed to the processor, frames per second of video
    time (``T / range_frames * source_fps``); ``source_fps`` / ``total_frames`` / ``source_size``
    (``(H, W)``): of the file; ``backend``: the decoder that produced the frames; ``range_frames``:
    source frames in the sampled range (``video_start`` .. ``video_end``; the whole clip without them).
    """

    frames: np.ndarray
    indices: list[int]
    fps: float
    source_fps: float
    total_frames: int
    source_size: tuple[int, int]
    backend: str
    path: str
    range_frames: int = 0

    @property
    def metadata(self) -> dict[str, Any]:
        """The processor's video metadata of these frames (:func:`video_metadata`): source fps and
        source frame indices, so timestamps are those of the source frames."""
        return {"fps": self.source_fps, "frames_indices": list(self.indices),
                "total_num_frames": self.range_frames or self.total_frames}


def video_metadata(num_frames: int, fps: float, metadata: dict[str, Any] | None = None) -> Any:
    """A ``transformers`` ``VideoMetadata`` for ``num_frames`` already-sampled frames.

    ``metadata`` (:attr:`SampledVideo.metadata`: ``fps`` of the source, ``frames_indices`` of the
    source frames, ``total_num_frames`` in the sampled range) gives real timestamps (Qwen3-VL's
    ``<t seconds>``: ``index / fps``) and, as ``sampled_fps``, the effective rate (Qwen2.5-VL's
    ``second_per_grid_ts``). Without it the frames are taken as consecutive at ``fps``.

    Raises:
        ValueError: ``metadata`` names a different number of frames than ``num_frames``.
    """
    from transformers.video_utils import VideoMetadata

    if metadata is None:
        return VideoMetadata(total_num_frames=num_frames, fps=float(fps), frames_indices=list(range(num_frames)))
    indices = [int(i) for i in metadata["frames_indices"]]
    if len(indices) != num_frames:
        raise ValueError(f"video metadata lists {len(indices)} frame indices for a video of {num_frames} frames; "
                         "give the metadata of the frames passed (SampledVideo.metadata)")
    return VideoMetadata(total_num_frames=int(metadata["total_num_frames"]), fps=float(metadata["fps"]),
                         frames_indices=indices)


def resize_frames(frames: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """``[N, H, W, 3]`` uint8 -> ``[N, size[0], size[1], 3]`` uint8: bicubic, antialiased, clamped
    to [0, 255] and rounded (torchvision's ``resize`` of a uint8 ``[N, 3, H, W]`` tensor); frames
    already at ``size`` are returned as they are."""
    if tuple(frames.shape[1:3]) == tuple(size):
        return frames
    # NCHW contiguous, as a decoder hands qwen-vl-utils its frames (another layout may round differently)
    x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).contiguous().to(torch.float32)
    y = torch.nn.functional.interpolate(x, size=list(size), mode="bicubic", align_corners=False, antialias=True)
    return y.clamp_(0, 255).round_().to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()


def sample_video(path: str | Path, *, fps: float | None = None, nframes: int | None = None,
                 min_frames: int | None = None, max_frames: int | None = None, min_pixels: float | None = None,
                 max_pixels: float | None = None, total_pixels: float | None = None,
                 resized_height: int | None = None, resized_width: int | None = None,
                 video_start: float | None = None, video_end: float | None = None, patch_size: int = 14,
                 backend: Literal["auto", "decord", "pyav"] = "auto") -> SampledVideo:
    """Decode the frames of ``path`` that qwen-vl-utils' ``fetch_video`` keeps, at its size.

    Args:
        fps, nframes, min_frames, max_frames, min_pixels, max_pixels, total_pixels, resized_height,
            resized_width, video_start, video_end: the video part's qwen-vl-utils keys; None: its
            default (see :func:`cosmos_primitives.data.qwen_vl_sizing.plan_video`).
        patch_size: the vision encoder's patch (14: Qwen2.5-VL, 16: Qwen3-VL); sides are multiples
            of twice this.
        backend: ``"auto"`` tries decord, then PyAV when decord is missing or fails.

    Raises:
        VideoDecodeError: the file is missing, or every backend failed (each failure is named; a
            clip or settings qwen-vl-utils refuses fail the same way).
    """
    path = Path(path)
    if not path.is_file():
        raise VideoDecodeError(str(path), "video file not found")
    keys = dict(fps=fps, nframes=nframes, min_frames=min_frames, max_frames=max_frames, min_pixels=min_pixels,
                max_pixels=max_pixels, total_pixels=total_pixels, resized_height=resized_height,
                resized_width=resized_width, video_start=video_start, video_end=video_end)

    def plan(total: int, source_fps: float, height: int, width: int) -> VideoPlan:
        return plan_video(total, source_fps, height, width, factor=pixel_factor(patch_size), **keys)

    order = {"auto": ("decord", "pyav"), "decord": ("decord",), "pyav": ("pyav",)}[backend]
    failures = []
    for name in order:
        try:
            module = require("decord" if name == "decord" else "av", "video decoding")
        except MissingExtraError as exc:
            failures.append(f"{name}: {exc}")
            continue
        try:
            return (_read_decord if name == "decord" else _read_pyav)(module, path, plan)
        except Exception as exc:  # any decoder failure makes the clip a bad sample
            failures.append(f"{name}: {type(exc).__name__}: {str(exc).strip()[:300]}")
    raise VideoDecodeError(str(path), "could not decode video (" + "; ".join(failures) + ")")


def _chunk_frames(height: int, width: int) -> int:
    return max(1, CHUNK_BYTES // (height * width * 3 * 4))


def _read_decord(decord, path: Path, plan) -> SampledVideo:
    height, width = _native_size(decord, path)
    reader = decord.VideoReader(str(path), num_threads=1)
    total, source_fps = len(reader), float(reader.get_avg_fps())
    chosen = plan(total, source_fps, height, width)
    out = np.empty((len(chosen.indices), *chosen.size, 3), dtype=np.uint8)
    step = _chunk_frames(height, width)
    for start in range(0, len(chosen.indices), step):
        batch = reader.get_batch(chosen.indices[start:start + step]).asnumpy()
        if batch.shape[1:] != (height, width, 3):
            raise RuntimeError(f"decord returned frames of shape {batch.shape[1:]}, expected {(height, width, 3)}")
        out[start:start + len(batch)] = resize_frames(batch, chosen.size)
    return SampledVideo(out, chosen.indices, chosen.sample_fps, source_fps, total, (height, width), "decord",
                        str(path), chosen.range_frames)


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


def _read_pyav(av, path: Path, plan) -> SampledVideo:
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
        chosen = plan(total, source_fps, height, width)
        wanted: dict[int, int] = {}
        for i in chosen.indices:
            wanted[i] = wanted.get(i, 0) + 1
        out = np.empty((len(chosen.indices), *chosen.size, 3), dtype=np.uint8)
        step, pending, filled, last = _chunk_frames(height, width), [], 0, chosen.indices[-1]
        stream.thread_type = "AUTO"
        for position, frame in enumerate(container.decode(stream)):
            if position in wanted:
                pending.extend([frame.to_ndarray(format="rgb24")] * wanted[position])
            if len(pending) >= step or (position >= last and pending):
                out[filled:filled + len(pending)] = resize_frames(np.stack(pending), chosen.size)
                filled, pending = filled + len(pending), []
            if position >= last:
                break
    if filled != len(chosen.indices):
        raise RuntimeError(f"stream ended after {filled} of {len(chosen.indices)} wanted frames "
                           f"(header says {total} frames)")
    return SampledVideo(out, chosen.indices, chosen.sample_fps, source_fps, total, (height, width), "pyav",
                        str(path), chosen.range_frames)
