"""Weight sync from the trainer to rollout engines: in-process (colocated), bucketed
``torch.distributed`` broadcast (disaggregated, one job) and a weight server that rollout jobs
fetch from (disaggregated, separate jobs); the name maps per model family are ``cp.models``'."""

from cosmos_primitives.utils.lazy_module import lazy_exports

__all__ = [  # the public surface (tests/test_public_surface.py); the rest by module path
    "InProcessSync", "WeightClient", "WeightServer", "WeightTransferError",
]

# Loaded on first use: the queue signs and seals records with ``sync.run_auth``, and a process that
# only reads the queue (``python -m cosmos_primitives.queue.status``) should not import torch for it.
_EXPORTS = {
    "InProcessSync": "in_process",
    "SyncGroup": "broadcast",
    "SyncResult": "result",
    "WeightBroadcaster": "broadcast",
    "WeightClient": "weight_client",
    "WeightMismatchError": "checks",
    "WeightReceiver": "broadcast",
    "WeightServer": "weight_server",
    "WeightTransferError": "transfer_protocol",
    "bitwise_equal": "checks",
    "checksum": "checks",
    "new_sync_group": "broadcast",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
