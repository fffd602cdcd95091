"""Weight sync from the trainer to rollout engines: in-process (colocated), bucketed
``torch.distributed`` broadcast (disaggregated, one job) and a weight server that rollout jobs
fetch from (disaggregated, separate jobs); the name maps per model family are ``cp.models``'."""

from cosmos_primitives.sync.broadcast import SyncGroup, WeightBroadcaster, WeightReceiver, new_sync_group
from cosmos_primitives.sync.checks import WeightMismatchError, bitwise_equal, checksum
from cosmos_primitives.sync.in_process import InProcessSync
from cosmos_primitives.sync.result import SyncResult
from cosmos_primitives.sync.transfer_protocol import WeightTransferError
from cosmos_primitives.sync.weight_client import WeightClient
from cosmos_primitives.sync.weight_server import WeightServer

__all__ = [  # the public surface (tests/test_public_surface.py); the rest by module path
    "InProcessSync", "WeightClient", "WeightServer", "WeightTransferError",
]
