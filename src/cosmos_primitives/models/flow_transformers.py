"""How the flow transformers of world models (Cosmos-Predict2.5's ``CosmosTransformer3DModel``, Wan and
other diffusers flow transformers) are called as a velocity field
(:data:`cosmos_primitives.algo.flow_step.VelocityFn`): their input conventions (condition-mask
channel, padding mask, timestep scale) in one place, for the rollout sampler and the policy alike.
"""

from __future__ import annotations

from typing import Any

import torch

from cosmos_primitives.algo.flow_step import VelocityFn


def diffusers_velocity_fn(transformer: Any, **forward_kwargs: Any) -> VelocityFn:
    """Wrap a diffusers flow transformer (``WanTransformer3DModel`` and alike) as a :data:`VelocityFn`.

    Inputs are cast to the transformer's dtype, the velocity comes back as float32.
    ``forward_kwargs`` are passed on every call (e.g. ``fps`` or ``padding_mask`` for Cosmos models).
    Conditioning frames (``num_condition_frames``) reach the model as the clean frames the sampler put in
    the latents (frame replacement; the model has no mask input).
    """

    def velocity(latents: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor,
                 num_condition_frames: int = 0) -> torch.Tensor:
        dtype = next(transformer.parameters()).dtype
        out = transformer(hidden_states=latents.to(dtype), timestep=timestep, encoder_hidden_states=text.to(dtype),
                          return_dict=False, **forward_kwargs)[0]
        return out.float()

    return velocity


def cosmos_velocity_fn(transformer: Any, *, num_train_timesteps: float = 1000.0, **forward_kwargs: Any) -> VelocityFn:
    """Wrap a Cosmos-Predict2.5 ``CosmosTransformer3DModel`` (text-to-world) as a :data:`VelocityFn`.

    The model takes what diffusers' Cosmos-Predict2.5 pipeline gives it: the latents with a
    condition-mask channel appended (ones on the ``num_condition_frames`` first latent frames, the
    clean conditioning frames of image- / video-to-world; all zeros for text-to-world), a ``[1, 1, H, W]`` zero
    padding mask, and the noise level itself as ``timestep`` (sigma in ``[0, 1]``, i.e. the
    sampler's ``timestep / num_train_timesteps``). Inputs are cast to the transformer's dtype, the
    velocity comes back as float32.
    """

    def velocity(latents: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor,
                 num_condition_frames: int = 0) -> torch.Tensor:
        dtype = next(transformer.parameters()).dtype
        b, _, t, h, w = latents.shape
        condition_mask = latents.new_zeros(b, 1, t, h, w, dtype=dtype)
        condition_mask[:, :, :num_condition_frames] = 1.0
        sigma = (timestep.float() / num_train_timesteps).expand(b)
        out = transformer(hidden_states=latents.to(dtype), condition_mask=condition_mask, timestep=sigma,
                          encoder_hidden_states=text.to(dtype), padding_mask=latents.new_zeros(1, 1, h, w, dtype=dtype),
                          return_dict=False, **forward_kwargs)[0]
        return out.float()

    return velocity


def flow_velocity_fn(transformer: Any, *, num_train_timesteps: float = 1000.0, **forward_kwargs: Any) -> VelocityFn:
    """:func:`cosmos_velocity_fn` for a ``CosmosTransformer3DModel``, :func:`diffusers_velocity_fn` otherwise."""
    if any(c.__name__ == "CosmosTransformer3DModel" for c in type(transformer).__mro__):  # FSDP2 subclasses too
        return cosmos_velocity_fn(transformer, num_train_timesteps=num_train_timesteps, **forward_kwargs)
    return diffusers_velocity_fn(transformer, **forward_kwargs)
