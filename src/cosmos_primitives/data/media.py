"""Media settings, media path resolution and image loading shared by the dataset adapters."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Literal

import attrs
import numpy as np

from cosmos_primitives.data.bad_samples import BadSampleError, bad_sample_boundary
from cosmos_primitives.data.video_sampling import (
    PIXEL_FACTOR,
    SampledVideo,
    check_aspect_ratio,
    fit_pixel_budget,
    sample_video,
)


@attrs.define
class MediaSettings:
    """How media are read when a conversation part does not say otherwise.

    ``fps``: video samples per second; ``max_pixels`` / ``min_pixels``: per-frame (or per-image)
    pixel bounds; ``max_frames``: frames per video; ``backend``: video decoder choice.
    A part's own ``"fps"``, ``"max_pixels"``, ``"min_pixels"``, ``"max_frames"`` override these.
    """

    fps: float = 2.0
    max_pixels: int = 81920
    min_pixels: int = 4 * PIXEL_FACTOR**2
    max_frames: int = 32
    backend: Literal["auto", "decord", "pyav"] = "auto"

    @classmethod
    def from_config(cls, cfg: Any) -> MediaSettings:
        """From a :class:`cosmos_primitives.config.DatasetConfig`."""
        return cls(fps=cfg.fps, max_pixels=cfg.max_pixels, min_pixels=cfg.min_pixels, max_frames=cfg.max_frames,
                   backend=cfg.video_backend)

    def video(self, path: str | Path, part: dict[str, Any] | None = None) -> SampledVideo:
        """Sample the video at ``path`` with these settings, overridden by ``part``'s keys."""
        part = part or {}
        return sample_video(
            path,
            fps=float(part.get("fps") or self.fps),
            max_pixels=int(part.get("max_pixels") or self.max_pixels),
            min_pixels=int(part.get("min_pixels") or self.min_pixels),
            max_frames=int(part.get("max_frames") or self.max_frames),
            backend=self.backend,
        )

    def image(self, path: str | Path, part: dict[str, Any] | None = None) -> np.ndarray:
        """Load the image at ``path`` as ``[H, W, 3]`` uint8 within the pixel bounds."""
        part = part or {}
        return load_image(path, max_pixels=int(part.get("max_pixels") or self.max_pixels),
                          min_pixels=int(part.get("min_pixels") or self.min_pixels))


MEDIA_SUFFIXES = (".mp4", ".avi", ".mov", ".mkv", ".webm", ".jpg", ".jpeg", ".png", ".webp", ".bmp")
"""File endings indexed by :func:`resolve_media_path`'s look-up by file name."""


def resolve_media_path(path: str, media_dir: str | Path | None) -> Path:
    """An absolute path for a media reference.

    ``file://`` prefixes are dropped; relative paths are taken under ``media_dir`` (or the working
    directory when there is none). When that file does not exist and there is a ``media_dir``, the
    reference's file name is looked up anywhere below ``media_dir`` (datasets such as
    Cosmos-Reason1 store paths of the machine that made them; their clips are found by name, as
    cosmos-rl does). Returns the direct path when neither exists, so the error names it.

    Raises:
        BadSampleError: the path cannot be resolved (a symlink loop), naming it.
    """
    text = str(path)
    if text.startswith("file://"):
        text = text[len("file://"):]
    candidate = Path(text).expanduser()
    unresolved = candidate if candidate.is_absolute() or not media_dir else Path(media_dir).expanduser() / candidate
    with bad_sample_boundary(str(unresolved.absolute()), "cannot resolve the media path"):
        direct = unresolved.resolve()  # a symlink loop raises RuntimeError (Python < 3.13)
    if media_dir and not direct.exists():
        found = _files_by_name(str(Path(media_dir).expanduser().resolve())).get(candidate.name)
        if found is not None:
            return Path(found)
    return direct


@functools.lru_cache(maxsize=16)
def _files_by_name(media_dir: str) -> dict[str, str]:
    """``file name -> path`` of the media files below ``media_dir`` (walked once per folder and
    process; the first of several files with one name wins)."""
    index: dict[str, str] = {}
    for root, _, files in os.walk(media_dir):
        for name in sorted(files):
            if name.lower().endswith(MEDIA_SUFFIXES):
                index.setdefault(name, os.path.join(root, name))
    return index


def cosmos_cache_clip_dir(name: str, subset: str = "") -> Path | None:
    """Where cosmos-rl keeps the clips of the Hub dataset ``name``, if that folder exists:
    ``$COSMOS_CACHE/datasets/<owner>/<dataset>/<subset>/video_clips`` (``COSMOS_CACHE`` defaults to
    ``~/.cache/cosmos``)."""
    root = Path(os.environ.get("COSMOS_CACHE") or Path.home() / ".cache" / "cosmos").expanduser()
    parts = [p for p in name.strip().strip("/").split("/") if p][-2:]
    if not parts:
        return None
    folder = root / "datasets" / Path(*parts) / subset / "video_clips"
    return folder if folder.is_dir() else None


def default_media_dir(cfg: Any) -> str | None:
    """The folder relative media paths of ``cfg``'s dataset resolve under.

    ``[...dataset] media_dir`` when set; else a local dataset's own folder; else, for a Hub
    dataset, cosmos-rl's clip folder under ``COSMOS_CACHE`` when it exists
    (:func:`cosmos_cache_clip_dir`); else None (the working directory).
    """
    if cfg.media_dir:
        return cfg.media_dir
    if not cfg.name:
        return None
    local = Path(cfg.name).expanduser()
    if local.exists():
        return str(local if local.is_dir() else local.parent)
    cached = cosmos_cache_clip_dir(cfg.name, cfg.subset)
    return str(cached) if cached is not None else None


def load_image(path: str | Path, max_pixels: int | None = None, min_pixels: int = 4 * PIXEL_FACTOR**2) -> np.ndarray:
    """Read an image file as ``[H, W, 3]`` uint8 RGB, resized to multiples of 28 px within
    ``[min_pixels, max_pixels]`` when ``max_pixels`` is given.

    Raises:
        BadSampleError: missing or unreadable file (any reader failure: a decompression bomb, a
            truncated file...), or an aspect ratio the Qwen2.5-VL processor refuses.
    """
    from PIL import Image

    path = Path(path)
    if not path.is_file():
        raise BadSampleError(str(path), "image file not found")
    with bad_sample_boundary(str(path), "could not read image"), Image.open(path) as img:
        if max_pixels:
            h, w = fit_pixel_budget(img.height, img.width, max_pixels, min_pixels)
        else:
            h, w = img.height, img.width
            check_aspect_ratio(h, w)
        img = img.convert("RGB")
        if (h, w) != (img.height, img.width):
            img = img.resize((w, h), Image.Resampling.BICUBIC)
        return np.asarray(img, dtype=np.uint8).copy()
