"""Small shared pieces at the bottom of the import graph: optional extras, run directories, seeding.

Attributes load on first use so that ``cosmos_primitives.utils.extras`` (used by light-weight
processes such as the reward server) does not import torch.
"""

from __future__ import annotations

from cosmos_primitives.utils.lazy_module import lazy_exports

_EXPORTS = {
    "MissingExtraError": "cosmos_primitives.utils.extras",
    "require": "cosmos_primitives.utils.extras",
    "import_object": "cosmos_primitives.utils.imports",
    "is_import_path": "cosmos_primitives.utils.imports",
    "make_run_dir": "cosmos_primitives.utils.run_dir",
    "latest_run_dir": "cosmos_primitives.utils.run_dir",
    "resolve_backend": "cosmos_primitives.utils.engine_choice",
    "seed_everything": "cosmos_primitives.utils.seeding",
    "derived_seed": "cosmos_primitives.utils.seeding",
    "derived_generator": "cosmos_primitives.utils.seeding",
    "capture_rng_state": "cosmos_primitives.utils.seeding",
    "restore_rng_state": "cosmos_primitives.utils.seeding",
}

__all__ = [  # the public surface (tests/test_public_surface.py); the rest by module path
    "derived_generator", "derived_seed", "latest_run_dir", "resolve_backend", "seed_everything",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
