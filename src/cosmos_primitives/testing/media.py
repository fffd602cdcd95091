"""Generated media for tests and demos: solid-colour images and mp4 clips whose frames say their index."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cosmos_primitives.logging.samples import write_mp4 as encode_mp4

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 180, 40),
    "blue": (30, 60, 220),
    "yellow": (230, 210, 30),
}


def color_image(color: str | tuple[int, int, int], size: tuple[int, int] = (56, 56), noise: float = 0.0,
                seed: int = 0) -> np.ndarray:
    """A solid-colour RGB image ``[H, W, 3]`` uint8, optionally with Gaussian pixel noise (std in 0..255)."""
    rgb = np.array(COLOURS[color] if isinstance(color, str) else color, dtype=np.float32)
    img = np.broadcast_to(rgb, (size[0], size[1], 3)).copy()
    if noise:
        img += np.random.default_rng(seed).normal(0.0, noise, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def write_image(path: str | Path, image: np.ndarray) -> Path:
    """Save an ``[H, W, 3]`` uint8 array as PNG / JPEG (by suffix)."""
    from PIL import Image

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(image).save(path)
    return path


def frame_index_pattern(index: int, size: tuple[int, int]) -> np.ndarray:
    """Frame ``index`` as ``[H, W, 3]`` uint8: the top half's grey level is ``(index * 8) % 256``
    (so decoding can tell which frame it got, within codec error), the bottom half a colour ramp."""
    h, w = size
    frame = np.zeros((h, w, 3), dtype=np.uint8)
    frame[: h // 2] = (index * 8) % 256
    ramp = np.linspace(0, 255, w, dtype=np.float32)
    frame[h // 2 :, :, 0] = ramp.astype(np.uint8)
    frame[h // 2 :, :, 2] = (255 - ramp).astype(np.uint8)
    return frame


def decode_frame_index(frame: np.ndarray) -> int:
    """Inverse of :func:`frame_index_pattern` for indices below 32."""
    h = frame.shape[0]
    grey = float(frame[: h // 4].mean())
    return round(grey / 8.0)


def write_mp4(path: str | Path, num_frames: int = 16, fps: float = 8.0, size: tuple[int, int] = (64, 64),
              frames: np.ndarray | None = None) -> Path:
    """Encode an H.264 mp4 with PyAV.

    Args:
        frames: ``[T, H, W, 3]`` uint8; default: ``num_frames`` frames of :func:`frame_index_pattern`.
        size: ``(H, W)``, both even (yuv420p).
    """
    if frames is None:
        frames = np.stack([frame_index_pattern(i, size) for i in range(num_frames)])
    return encode_mp4(path, frames, fps, crf=10)


def write_corrupt_mp4(path: str | Path, num_bytes: int = 2048, seed: int = 0) -> Path:
    """A file named ``.mp4`` holding random bytes (no decoder can read it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(np.random.default_rng(seed).integers(0, 256, num_bytes, dtype=np.uint8).tobytes())
    return path
