"""Media settings, media path resolution and image loading shared by the dataset adapters.

Images and videos are read the way cosmos-rl's Qwen-VL packers read them (qwen-vl-utils' rules,
:mod:`cosmos_primitives.data.qwen_vl_sizing`): a conversation part's own qwen-vl-utils keys
(``fps``, ``max_pixels``, ...) win, then :class:`MediaSettings`, then qwen-vl-utils' defaults.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Literal

import attrs
import numpy as np

from cosmos_primitives.config.dataset import DatasetConfig
from cosmos_primitives.data.bad_samples import BadSampleError, bad_sample_boundary
from cosmos_primitives.data.qwen_vl_sizing import image_size, pixel_factor
from cosmos_primitives.data.video_sampling import SampledVideo, sample_video
from cosmos_primitives.data.vl_family import pixel_patch_size

VIDEO_KEYS = ("fps", "nframes", "min_frames", "max_frames", "min_pixels", "max_pixels", "total_pixels",
              "resized_height", "resized_width", "video_start", "video_end")
"""The qwen-vl-utils keys a video part may carry."""
IMAGE_KEYS = ("min_pixels", "max_pixels", "resized_height", "resized_width")
"""The qwen-vl-utils keys an image part may carry."""
_INTEGER_KEYS = ("nframes", "min_frames", "max_frames", "resized_height", "resized_width")


@attrs.define
class MediaSettings:
    """How media are read when a conversation part does not say otherwise.

    Each field is a default for the qwen-vl-utils key of the same name; None leaves qwen-vl-utils'
    own default (what cosmos-rl's packers get for a part without the key): ``fps`` 2.0 video samples
    per second; ``max_pixels`` / ``min_pixels`` per frame (or image): videos 128 tokens up to
    ``max(min(768 tokens, total_pixels / frames * 2), 1.05 x min_pixels)``, images 4 .. 16384
    tokens; ``max_frames`` / ``min_frames`` ``min(768, frames in the clip)`` / 4; ``total_pixels``
    0.9 x 128000 tokens (one token = ``(2 * patch_size)**2`` pixels). ``max_pixels`` /
    ``min_pixels`` apply to images and videos alike. ``patch_size``: the vision encoder's (14:
    Qwen2.5-VL, 16: Qwen3-VL); ``backend``: video decoder choice.

    A part's own keys (:data:`VIDEO_KEYS`, :data:`IMAGE_KEYS`) win; a part giving ``nframes`` takes
    no ``fps`` from here.
    """

    fps: float | None = None
    max_pixels: int | None = None
    min_pixels: int | None = None
    max_frames: int | None = None
    backend: Literal["auto", "decord", "pyav"] = "auto"
    min_frames: int | None = None
    total_pixels: int | None = None
    patch_size: int = 14

    @classmethod
    def from_config(cls, cfg: DatasetConfig, processor: Any = None) -> MediaSettings:
        """From a :class:`cosmos_primitives.config.DatasetConfig`, sizing media for ``processor``'s
        patch size (:func:`~cosmos_primitives.data.vl_family.pixel_patch_size`; 14 without one)."""
        return cls(fps=cfg.fps, max_pixels=cfg.max_pixels, min_pixels=cfg.min_pixels, max_frames=cfg.max_frames,
                   total_pixels=cfg.total_pixels, backend=cfg.video_backend, patch_size=pixel_patch_size(processor))

    def video_keys(self, part: dict[str, Any] | None = None, where: str = "video part") -> dict[str, Any]:
        """The qwen-vl-utils keys a video is sampled with: ``part``'s, then these settings'.

        Raises:
            ValueError: a key of ``part`` is not a number (naming ``where`` and the key).
        """
        keys = _part_keys(part or {}, VIDEO_KEYS, where)
        defaults = {"max_pixels": self.max_pixels, "min_pixels": self.min_pixels, "max_frames": self.max_frames,
                    "min_frames": self.min_frames, "total_pixels": self.total_pixels}
        if "nframes" not in keys:
            defaults["fps"] = self.fps
        for key, value in defaults.items():
            if key not in keys and value is not None:
                keys[key] = value
        return keys

    def image_keys(self, part: dict[str, Any] | None = None, where: str = "image part") -> dict[str, Any]:
        """The qwen-vl-utils keys an image is sized with: ``part``'s, then these settings'."""
        keys = _part_keys(part or {}, IMAGE_KEYS, where)
        for key, value in (("max_pixels", self.max_pixels), ("min_pixels", self.min_pixels)):
            if key not in keys and value is not None:
                keys[key] = value
        return keys

    def video(self, path: str | Path, part: dict[str, Any] | None = None) -> SampledVideo:
        """Sample the video at ``path`` with these settings, overridden by ``part``'s keys."""
        return sample_video(path, **self.video_keys(part, str(path)), patch_size=self.patch_size,
                            backend=self.backend)

    def image(self, path: str | Path, part: dict[str, Any] | None = None) -> np.ndarray:
        """Load the image at ``path`` as ``[H, W, 3]`` uint8 at qwen-vl-utils' size for it."""
        return load_image(path, **self.image_keys(part, str(path)), patch_size=self.patch_size)


def _part_keys(part: dict[str, Any], names: tuple[str, ...], where: str) -> dict[str, Any]:
    keys: dict[str, Any] = {}
    for name in names:
        value = part.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where}: '{name}' must be a number, got {value!r}; give it as a number in the "
                             "conversation part (qwen-vl-utils reads it as one)")
        keys[name] = int(value) if name in _INTEGER_KEYS and float(value).is_integer() else value
    return keys


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


def load_image(path: str | Path, *, min_pixels: float | None = None, max_pixels: float | None = None,
               resized_height: int | None = None, resized_width: int | None = None,
               patch_size: int = 14) -> np.ndarray:
    """Read an image file as ``[H, W, 3]`` uint8 RGB as qwen-vl-utils' ``fetch_image`` does: RGBA
    composited over white (other modes converted), then resized (Pillow bicubic) to
    :func:`~cosmos_primitives.data.qwen_vl_sizing.image_size`, multiples of ``2 * patch_size``
    within ``[min_pixels, max_pixels]`` (None: 4 and 16384 tokens).

    Raises:
        BadSampleError: missing or unreadable file (any reader failure: a decompression bomb, a
            truncated file...), or an aspect ratio the Qwen-VL processor refuses.
    """
    from PIL import Image

    path = Path(path)
    if not path.is_file():
        raise BadSampleError(str(path), "image file not found")
    with bad_sample_boundary(str(path), "could not read image"), Image.open(path) as img:
        if img.mode == "RGBA":
            rgb = Image.new("RGB", img.size, (255, 255, 255))
            rgb.paste(img, mask=img.split()[3])
        else:
            rgb = img.convert("RGB")
        h, w = image_size(rgb.height, rgb.width, factor=pixel_factor(patch_size), min_pixels=min_pixels,
                          max_pixels=max_pixels, resized_height=resized_height, resized_width=resized_width)
        return np.asarray(rgb.resize((w, h), Image.Resampling.BICUBIC), dtype=np.uint8).copy()
