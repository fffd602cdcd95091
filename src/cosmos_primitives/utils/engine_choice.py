"""``[rollout] backend = "auto"`` resolved by what builds the engine (``cp.rollout.build_rollout_engine``,
the memory plan, the rollout job's layout): vLLM when it is installed and a GPU is present, HF otherwise
(cosmos-rl's default is vLLM; it needs a GPU). The loader never probes the machine, so one file reads
the same everywhere. Here, at the bottom of the import graph, so that every such builder can ask."""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from pathlib import Path


def _gpu_present() -> bool:
    """A CUDA GPU is visible. torch is asked only when it is already imported, else the NVIDIA device
    files are looked for."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    torch = sys.modules.get("torch")
    if torch is not None:
        return bool(torch.cuda.is_available())
    return any(Path("/dev").glob("nvidia[0-9]*"))


def default_backend() -> tuple[str, str]:
    """``(engine, why)``: ``"vllm"`` when vLLM is installed and a GPU is present, else ``"hf"``."""
    try:
        found = importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):  # a finder that refuses it, or a half-installed package
        found = False
    if not found:
        return "hf", "vLLM is not installed"
    if not _gpu_present():
        return "hf", "no GPU is present"
    return "vllm", "vLLM is installed and a GPU is present"


def resolve_backend(backend: str, *, log: bool = True) -> str:
    """The engine ``[rollout] backend`` names on this machine: ``"hf"`` / ``"vllm"`` as they are;
    ``"auto"``: :func:`default_backend`, logged with the reason when ``log``."""
    if backend != "auto":
        return backend
    engine, why = default_backend()
    if log:
        logging.getLogger("cosmos").info(f"rollout.backend = 'auto': using {engine!r} ({why})")
    return engine
