"""Small shared pieces at the bottom of the import graph: optional extras, run directories, seeding."""

from cosmos_primitives.utils.extras import MissingExtraError, require
from cosmos_primitives.utils.run_dir import make_run_dir
from cosmos_primitives.utils.seeding import capture_rng_state, restore_rng_state, seed_everything

__all__ = [
    "MissingExtraError",
    "capture_rng_state",
    "make_run_dir",
    "require",
    "restore_rng_state",
    "seed_everything",
]
