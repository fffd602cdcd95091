"""cosmos_primitives: composable building blocks for post-training physical-AI models.

Use it as ``import cosmos_primitives as cp``. Sub-packages are imported on first use, so
``import cosmos_primitives`` stays cheap and works with the core dependencies alone.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_SUBPACKAGES = (
    "algo",
    "checkpoint",
    "config",
    "data",
    "eval",
    "logging",
    "models",
    "parallel",
    "plan",
    "policy",
    "queue",
    "rewards",
    "rollout",
    "run",
    "sync",
    "testing",
    "utils",
)

# Names re-exported at the top level: name -> module that defines it.
_SHORTCUTS = {
    "load_config": "cosmos_primitives.config",
    "Config": "cosmos_primitives.config",
    "ConfigError": "cosmos_primitives.config",
    "MissingExtraError": "cosmos_primitives.utils.extras",
}

__all__ = ["__version__", *_SUBPACKAGES, *_SHORTCUTS]

if TYPE_CHECKING:  # pragma: no cover
    from cosmos_primitives.config import Config, ConfigError, load_config  # noqa: F401
    from cosmos_primitives.utils.extras import MissingExtraError  # noqa: F401


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        module = importlib.import_module(f"cosmos_primitives.{name}")
        globals()[name] = module
        return module
    if name in _SHORTCUTS:
        value = getattr(importlib.import_module(_SHORTCUTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'cosmos_primitives' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
