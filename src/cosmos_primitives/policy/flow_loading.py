"""Load a diffusers flow-matching video model: its transformer, VAE and noise scheduler."""

from __future__ import annotations

from typing import Any

import torch

from cosmos_primitives.config.policy import PolicyConfig
from cosmos_primitives.utils.extras import require


def load_flow_model(policy: PolicyConfig, *, dtype: torch.dtype) -> tuple[Any, Any, Any]:
    """``(transformer, vae, noise_scheduler)`` of the diffusers folder or Hub id ``[policy]
    model_name_or_path`` (at ``model_revision``, a Hub branch, when set), on the CPU.

    The transformer is loaded with ``torch_dtype = dtype`` (diffusers keeps the modules the model
    wants in float32, such as norms and the time embedding, there); the VAE in its saved dtype. The
    folder names its scheduler class (``FlowMatchEulerDiscreteScheduler`` for Wan, a flow-sigma
    ``UniPCMultistepScheduler`` for Cosmos-Predict2.5): only its sigma grid is used.
    """
    diffusers = require("diffusers", "loading a flow transformer")
    path = policy.model_name_or_path
    revision = {"revision": policy.model_revision} if policy.model_revision else {}
    transformer = diffusers.AutoModel.from_pretrained(path, subfolder="transformer", torch_dtype=dtype, **revision)
    vae = diffusers.AutoModel.from_pretrained(path, subfolder="vae", **revision)
    scheduler_config = diffusers.FlowMatchEulerDiscreteScheduler.load_config(path, subfolder="scheduler", **revision)
    scheduler = getattr(diffusers, scheduler_config["_class_name"]).from_config(scheduler_config)
    return transformer, vae, scheduler
