"""What one weight sync did, for logs and metrics."""

from __future__ import annotations

import attrs


@attrs.frozen
class SyncResult:
    """One sync, as seen by the rank that ran it.

    Attributes:
        version: the weight version the engine is tagged with afterwards.
        seconds: wall time of the sync (on CUDA, after synchronising the device).
        bytes_moved: bytes copied or sent by this rank (0 when every tensor is shared).
        num_shared: tensors the engine aliases (nothing to move).
        num_copied: tensors copied / sent.
        num_buckets: flat buckets sent or received (broadcast transport; 0 in-process).
        verified: this sync ran the equality check and it passed.
    """

    version: int
    seconds: float
    bytes_moved: int = 0
    num_shared: int = 0
    num_copied: int = 0
    num_buckets: int = 0
    verified: bool = False

    def metrics(self, prefix: str = "sync/") -> dict[str, float]:
        """``{"sync/time_s": .., "sync/bytes": .., "sync/version": ..}`` for ``MetricsTracker.log_metrics``."""
        return {
            f"{prefix}time_s": self.seconds,
            f"{prefix}bytes": float(self.bytes_moved),
            f"{prefix}version": float(self.version),
        }
