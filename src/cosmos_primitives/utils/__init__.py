"""Small shared pieces at the bottom of the import graph: optional extras, run directories, seeding.

Attributes load on first use so that ``cosmos_primitives.utils.extras`` (used by light-weight
processes such as the reward server) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "MissingExtraError": "cosmos_primitives.utils.extras",
    "require": "cosmos_primitives.utils.extras",
    "import_object": "cosmos_primitives.utils.imports",
    "is_import_path": "cosmos_primitives.utils.imports",
    "make_run_dir": "cosmos_primitives.utils.run_dir",
    "latest_run_dir": "cosmos_primitives.utils.run_dir",
    "seed_everything": "cosmos_primitives.utils.seeding",
    "derived_seed": "cosmos_primitives.utils.seeding",
    "derived_generator": "cosmos_primitives.utils.seeding",
    "capture_rng_state": "cosmos_primitives.utils.seeding",
    "restore_rng_state": "cosmos_primitives.utils.seeding",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'cosmos_primitives.utils' has no attribute {name!r}")
