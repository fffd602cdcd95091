"""Video <-> normalised latents through a diffusers video VAE (``AutoencoderKLWan`` and alike).

The transformer works on normalised latents: ``(raw - latents_mean) / latents_std`` when the VAE
config has per-channel ``latents_mean`` / ``latents_std`` (Wan, Cosmos), else
``(raw - shift_factor) * scaling_factor``.
"""

from __future__ import annotations

from typing import Any

import torch


def _normalisation(vae: Any, channels: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(offset, scale)`` as ``[1, C, 1, 1, 1]`` float32 so that ``normalised = (raw - offset) / scale``."""
    cfg = vae.config
    mean, std = getattr(cfg, "latents_mean", None), getattr(cfg, "latents_std", None)
    if mean is not None and std is not None:
        offset = torch.tensor(mean, dtype=torch.float32, device=device)
        scale = torch.tensor(std, dtype=torch.float32, device=device)
    else:
        offset = torch.full((channels,), float(getattr(cfg, "shift_factor", None) or 0.0), device=device)
        scale = torch.full((channels,), 1.0 / float(getattr(cfg, "scaling_factor", None) or 1.0), device=device)
    if offset.shape != (channels,):
        raise ValueError(f"VAE config has {offset.shape[0]} latents_mean entries for {channels} latent channels")
    return offset.view(1, -1, 1, 1, 1), scale.view(1, -1, 1, 1, 1)


@torch.no_grad()
def encode_video(vae: Any, video: torch.Tensor, *, sample: bool = False,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """Encode ``video [B, 3, T, H, W]`` in ``[-1, 1]`` to normalised latents ``[B, C, T', H', W']`` float32.

    ``sample = False`` takes the posterior mean (deterministic), else a posterior sample.
    """
    dtype = next(vae.parameters()).dtype
    dist = vae.encode(video.to(dtype)).latent_dist
    raw = (dist.sample(generator=generator) if sample else dist.mode()).float()
    offset, scale = _normalisation(vae, raw.shape[1], raw.device)
    return (raw - offset) / scale


@torch.no_grad()
def decode_video(vae: Any, latents: torch.Tensor) -> torch.Tensor:
    """Decode normalised latents ``[B, C, T', H', W']`` to video ``[B, 3, T, H, W]`` float32 in ``[-1, 1]``."""
    offset, scale = _normalisation(vae, latents.shape[1], latents.device)
    raw = latents.float() * scale + offset
    dtype = next(vae.parameters()).dtype
    return vae.decode(raw.to(dtype), return_dict=False)[0].float().clamp(-1.0, 1.0)


def video_to_uint8(video: torch.Tensor) -> torch.Tensor:
    """``[B, 3, T, H, W]`` in ``[-1, 1]`` -> uint8 ``[B, 3, T, H, W]`` (what the reward service takes)."""
    return ((video.float().clamp(-1.0, 1.0) + 1.0) * 127.5).round().to(torch.uint8)
