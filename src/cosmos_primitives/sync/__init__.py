"""Weight sync from the trainer to rollout engines: in-process (colocated) and bucketed
``torch.distributed`` broadcast (disaggregated), with name maps per model family."""

from cosmos_primitives.sync.broadcast import (
    DEFAULT_BUCKET_BYTES,
    SyncGroup,
    WeightBroadcaster,
    WeightReceiver,
    new_sync_group,
)
from cosmos_primitives.sync.checks import WeightMismatchError, bitwise_equal, checksum
from cosmos_primitives.sync.in_process import InProcessSync, PlanEntry
from cosmos_primitives.sync.name_maps import (
    LAYOUTS,
    FamilyNameMap,
    Fusion,
    NameMapError,
    TargetSpec,
    UnknownFamilyError,
    family_of,
    get_family,
    known_families,
    map_names,
    register_family,
    resolve_family,
)
from cosmos_primitives.sync.result import SyncResult

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "LAYOUTS",
    "FamilyNameMap",
    "Fusion",
    "InProcessSync",
    "NameMapError",
    "PlanEntry",
    "SyncGroup",
    "SyncResult",
    "TargetSpec",
    "UnknownFamilyError",
    "WeightBroadcaster",
    "WeightMismatchError",
    "WeightReceiver",
    "bitwise_equal",
    "checksum",
    "family_of",
    "get_family",
    "known_families",
    "map_names",
    "new_sync_group",
    "register_family",
    "resolve_family",
]
