"""The memory plan of a configured run: model shape from ``config.json``, estimate, log block.

``mode = "wfm"`` (``examples/wfm_rl.py``; chosen by default when ``[policy] model_name_or_path`` is a
diffusers folder with ``transformer/config.json``) plans a world-model RL step
(:func:`cosmos_primitives.plan.wfm.estimate_wfm_memory`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch

from cosmos_primitives.config.root import Config
from cosmos_primitives.logging.console import get_logger
from cosmos_primitives.plan.estimate import MemoryEstimate, estimate_memory
from cosmos_primitives.plan.shape import ModelShape, read_hf_config
from cosmos_primitives.plan.wfm import WFMMemoryEstimate, WFMShape, estimate_wfm_memory, read_diffusers_configs

Mode = Literal["sft", "colocated", "disaggregated", "wfm"]


def is_diffusers_folder(model_name_or_path: str) -> bool:
    """Whether ``model_name_or_path`` is a local diffusers folder holding ``transformer/config.json``."""
    return (Path(model_name_or_path).expanduser() / "transformer" / "config.json").is_file()


def plan_for_config(cfg: Config, world_size: int, *, mode: Mode | None = None,
                    device: Literal["cuda", "cpu"] = "cuda", device_memory: int | None = None,
                    hf_config: dict[str, Any] | None = None,
                    tokens: int | None = None) -> MemoryEstimate | WFMMemoryEstimate:
    """:func:`estimate_memory` of ``cfg`` with the shape of ``[policy] model_name_or_path``
    (its ``config.json``, or ``hf_config``) trained as ``[policy]`` says (patterns, LoRA);
    ``tokens``: tokens per micro-batch (default: from the config, an upper bound for GRPO).

    ``mode = "wfm"`` (the default for a diffusers folder): :func:`estimate_wfm_memory` with the
    folder's ``transformer/config.json`` and ``vae/config.json`` (``hf_config``: the transformer's,
    with the Wan2.1 VAE)."""
    if mode is None and hf_config is None and is_diffusers_folder(cfg.policy.model_name_or_path):
        mode = "wfm"
    if mode == "wfm":
        vae_config = None
        if hf_config is None:
            hf_config, vae_config = read_diffusers_configs(cfg.policy.model_name_or_path, cfg.policy.model_revision)
        shape = WFMShape.from_diffusers_config(hf_config, lora=cfg.policy.lora, vae_config=vae_config)
        return estimate_wfm_memory(cfg, shape, world_size=world_size, device_memory=device_memory)
    if hf_config is None:
        hf_config = read_hf_config(cfg.policy.model_name_or_path, cfg.policy.model_revision)
    shape = ModelShape.from_hf_config(hf_config, freeze_patterns=cfg.policy.freeze_patterns,
                                      trainable_patterns=cfg.policy.trainable_patterns, lora=cfg.policy.lora)
    return estimate_memory(cfg, shape, world_size=world_size, mode=mode, device=device, device_memory=device_memory,
                           tokens=tokens)


def log_memory_plan(cfg: Config, world_size: int, device: torch.device | str,
                    mode: Mode | None = None) -> MemoryEstimate | WFMMemoryEstimate | None:
    """Log the memory plan on rank 0 (a warning when it exceeds the device); every rank may call it.

    A model whose ``config.json`` cannot be read (no network, a non-Hugging-Face folder) logs why
    and returns None: the plan never stops a run.
    """
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_rank() != 0:
        return None
    log = get_logger()
    device = torch.device(device)
    device_memory = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    try:
        estimate = plan_for_config(cfg, world_size, mode=mode, device="cuda" if device.type == "cuda" else "cpu",
                                   device_memory=device_memory)
    except (OSError, ValueError, KeyError, ImportError) as exc:
        log.info(f"memory plan skipped: cannot read the shape of {cfg.policy.model_name_or_path!r} ({exc})")
        return None
    report = estimate.report(device_memory)
    if device_memory and estimate.total > device_memory:
        log.warning(report)
    else:
        log.info(report)
    return estimate
