"""Media settings, media path resolution and image loading shared by the dataset adapters."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import attrs
import numpy as np

from cosmos_primitives.data.bad_samples import BadSampleError
from cosmos_primitives.data.video_sampling import PIXEL_FACTOR, SampledVideo, fit_pixel_budget, sample_video


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


def resolve_media_path(path: str, media_dir: str | Path | None) -> Path:
    """An absolute path for a media reference: ``file://`` prefixes are dropped, relative paths are
    taken under ``media_dir`` (or the working directory when there is none)."""
    text = str(path)
    if text.startswith("file://"):
        text = text[len("file://"):]
    candidate = Path(text).expanduser()
    if candidate.is_absolute() or not media_dir:
        return candidate.resolve()
    return (Path(media_dir).expanduser() / candidate).resolve()


def load_image(path: str | Path, max_pixels: int | None = None, min_pixels: int = 4 * PIXEL_FACTOR**2) -> np.ndarray:
    """Read an image file as ``[H, W, 3]`` uint8 RGB, resized to multiples of 28 px within
    ``[min_pixels, max_pixels]`` when ``max_pixels`` is given.

    Raises:
        BadSampleError: missing or unreadable file.
    """
    from PIL import Image

    path = Path(path)
    if not path.is_file():
        raise BadSampleError(str(path), "image file not found")
    try:
        with Image.open(path) as img:
            img = img.convert("RGB")
            if max_pixels:
                h, w = fit_pixel_budget(img.height, img.width, max_pixels, min_pixels)
                if (h, w) != (img.height, img.width):
                    img = img.resize((w, h), Image.Resampling.BICUBIC)
            return np.asarray(img, dtype=np.uint8).copy()
    except OSError as exc:
        raise BadSampleError(str(path), f"could not read image: {exc}") from exc
