"""Built-in reward functions of the reference reward server: simple image / video statistics.

They need no model, so tests and demos can score real pixels (e.g. FlowGRPO learning to make clips
brighter). Every function follows the server's reward signature::

    fn(media, *, media_type, prompts, video_infos) -> {score key: [B] float}

Pixel values are read in [0, 1] (uint8 / 255). Layouts: ``image`` [B, H, W, C], ``video``
[B, C, T, H, W], C = 1 (grey), 3 (RGB) or 4 (RGBA, alpha ignored).

``latent`` [B, C, T, H, W] media cannot be decoded without the model's VAE. Unless the server was
given a latent decoder (which turns latents into ``video`` before any reward runs), ``brightness``
and ``contrast`` treat the latent as a signal normalised to [-1, 1] (the diffusers pixel
convention), map it to [0, 1] by ``(clip(x, -1, 1) + 1) / 2`` and use all its channels as grey
levels; ``colorfulness`` needs colours and fails for latents (every item scores -1.0).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

# ITU-R BT.601 luma weights of R, G, B
_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)


def unit_pixels(media: np.ndarray, media_type: str) -> Iterator[np.ndarray]:
    """Yield each item as ``[C, N]`` float32 in [0, 1] (N = pixels, T*H*W for videos; alpha dropped)."""
    for item in media:
        if media_type == "image":
            flat = item.reshape(-1, item.shape[-1]).T
        else:
            flat = item.reshape(item.shape[0], -1)
        if media_type == "latent":
            yield (np.clip(flat.astype(np.float32), -1.0, 1.0) + 1.0) / 2.0
            continue
        if flat.shape[0] == 4:
            flat = flat[:3]
        yield flat.astype(np.float32) / 255.0


def _luma(pixels: np.ndarray, media_type: str) -> np.ndarray:
    """``[N]`` grey level of ``[C, N]`` pixels (latents: every channel value counts as a grey level)."""
    if media_type == "latent" or pixels.shape[0] == 1:
        return pixels.reshape(-1)
    return _LUMA @ pixels


def brightness(media: np.ndarray, *, media_type: str, **_: Any) -> dict[str, list[float]]:
    """``brightness``: mean pixel value in [0, 1] per item (over colour channels and all pixels / frames)."""
    return {"brightness": [float(p.mean()) for p in unit_pixels(media, media_type)]}


def contrast(media: np.ndarray, *, media_type: str, **_: Any) -> dict[str, list[float]]:
    """``contrast``: RMS contrast, the standard deviation of the luma in [0, 1], per item (0 = flat)."""
    return {"contrast": [float(_luma(p, media_type).std()) for p in unit_pixels(media, media_type)]}


def _colorfulness_of(pixels: np.ndarray) -> float:
    if pixels.shape[0] == 1:
        return 0.0
    r, g, b = pixels[0], pixels[1], pixels[2]
    rg = r - g
    yb = 0.5 * (r + g) - b
    spread = np.sqrt(rg.std() ** 2 + yb.std() ** 2)
    offset = np.sqrt(rg.mean() ** 2 + yb.mean() ** 2)
    return float(spread + 0.3 * offset)


def colorfulness(media: np.ndarray, *, media_type: str, **_: Any) -> dict[str, list[float]]:
    """``colorfulness``: Hasler & Suesstrunk (2003) metric ``sigma_rgyb + 0.3 * mu_rgyb`` on [0, 1] pixels.

    ``rg = R - G``, ``yb = (R + G) / 2 - B``; 0 for grey media. Needs decoded pixels (fails for latents).
    """
    if media_type == "latent":
        raise ValueError(
            "colorfulness needs decoded RGB pixels; send media_type 'image' / 'video' or start the server "
            "with a latent decoder (--latent-decoder module:function)"
        )
    return {"colorfulness": [_colorfulness_of(p) for p in unit_pixels(media, media_type)]}


def media_stats(media: np.ndarray, *, media_type: str, **kwargs: Any) -> dict[str, list[float]]:
    """``media_stats``: the keys ``brightness``, ``contrast`` (and ``colorfulness`` for pixels) in one reply."""
    out = {**brightness(media, media_type=media_type), **contrast(media, media_type=media_type)}
    if media_type != "latent":
        out.update(colorfulness(media, media_type=media_type))
    return out


BUILTIN_REWARDS: dict[str, Callable[..., Any]] = {
    "brightness": brightness,
    "contrast": contrast,
    "colorfulness": colorfulness,
    "media_stats": media_stats,
}
