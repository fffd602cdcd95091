"""A packed copy of the trainer's weights at one version, and sending it over a sync group.

The weight server takes a snapshot when the trainer publishes (the gathers are collective over
the trainer ranks) and serves it afterwards, to any number of members, at any time, while the
trainer keeps training: the snapshot is the bucket buffers of the in-job broadcast, filled once
and kept. Sending it speaks the same wire protocol as
:class:`~cosmos_primitives.sync.broadcast.WeightBroadcaster` (header, plan on a group's first
transfer, buckets, checksums on a checked transfer), so a
:class:`~cosmos_primitives.sync.broadcast.WeightReceiver` receives it unchanged.
"""

from __future__ import annotations

import hashlib
import threading
import time

import torch

from cosmos_primitives.sync.broadcast import SyncGroup, send_checksums, send_header
from cosmos_primitives.sync.checks import add_checksums, checksum
from cosmos_primitives.sync.result import SyncResult
from cosmos_primitives.sync.send_plan import SendPlan
from cosmos_primitives.sync.sources import full_tensor


class WeightSnapshot:
    """The weights at ``version`` as the plan's buckets: ``buffers[b]`` is bucket ``b``
    (``uint8``, ``bucket_used[b]`` bytes, on ``device``).

    ``users`` counts transfers reading it (the server reuses its buffers only at 0).
    """

    def __init__(self, version: int, buffers: list[torch.Tensor], device: torch.device) -> None:
        self.version = version
        self.buffers = buffers
        self.device = device
        self.nbytes = sum(b.numel() for b in buffers)
        self.users = 0
        self._sums: list[tuple[int, int]] | None = None
        self._lock = threading.Lock()

    def checksums(self, plan: SendPlan) -> list[tuple[int, int]]:
        """Per engine tensor checksums of the packed values (computed once, on first use)."""
        with self._lock:
            if self._sums is None:
                sums = [(0, 0)] * len(plan.target_names)
                for b, pieces in enumerate(plan.buckets):
                    for p in pieces:
                        wire = plan.wire[p.target]
                        size = torch.empty((), dtype=wire).element_size()
                        data = self.buffers[b][p.byte_offset:p.byte_offset + p.numel * size].view(wire)
                        sums[p.target] = add_checksums(sums[p.target], checksum(data, p.target_offset))
                self._sums = sums
            return self._sums


def bucket_digest(data: torch.Tensor) -> str:
    """SHA-256 (hex) of a bucket's bytes (``uint8``, any device; copied to the CPU to hash)."""
    return hashlib.sha256(memoryview(data.detach().cpu().contiguous().numpy())).hexdigest()


def snapshot_digests(snapshot: WeightSnapshot) -> list[str]:
    """:func:`bucket_digest` of every bucket of ``snapshot`` (what a member checks before loading one)."""
    return [bucket_digest(b) if b.numel() else "" for b in snapshot.buffers]


def take_snapshot(plan: SendPlan, version: int, *, is_src: bool, device: torch.device | None = None,
                  reuse: list[torch.Tensor] | None = None) -> WeightSnapshot | None:
    """Gather every parameter once (every trainer rank calls this: FSDP2 gathers are collective)
    and, on the sending rank, pack it into the buckets.

    Args:
        device: where the buckets live (default: the trainer's device; CPU for a gloo transfer
            of a CUDA model).
        reuse: the buffers of a snapshot no transfer reads any more (same plan), filled again
            instead of allocating new ones.

    Returns:
        The snapshot on the sending rank, ``None`` elsewhere.
    """
    used = plan.layout.bucket_used
    device = plan.device if device is None else torch.device(device)
    buffers: list[torch.Tensor] = []
    if is_src:
        buffers = reuse if reuse is not None else [torch.empty(n, dtype=torch.uint8, device=device) for n in used]
    with torch.no_grad():
        current, flat = -1, torch.empty(0)
        for p in plan.layout.pieces:
            if p.source != current:
                current, flat = p.source, full_tensor(plan.sources[p.source]).reshape(-1)
            if is_src:
                plan.pack(buffers[p.bucket], p, flat)
        if plan.device.type == "cuda":
            torch.cuda.synchronize()
    return WeightSnapshot(version, buffers, device) if is_src else None


def send_snapshot(snapshot: WeightSnapshot, plan: SendPlan, group: SyncGroup, *, with_plan: bool,
                  verify: bool) -> SyncResult:
    """Send ``snapshot`` to the receivers of ``group`` (the sender calls this; the receivers call
    ``WeightReceiver.sync()``).

    Args:
        with_plan: send the plan first (a receiver of the group lacks it).
        verify: end with the checksum round (raises ``WeightMismatchError`` when a receiver differs).
    """
    start = time.perf_counter()
    blob = plan.blob if with_plan else b""
    send_header(group, snapshot.device, snapshot.version, plan.fingerprint, verify, blob, len(plan.target_names))
    works = [group.broadcast(snapshot.buffers[b], async_op=True) for b in plan.active_buckets]
    for work in works:
        work.wait()
    if snapshot.device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    if verify:
        send_checksums(group, snapshot.device, snapshot.checksums(plan), plan.target_names)
    return SyncResult(version=snapshot.version, seconds=seconds, bytes_moved=snapshot.nbytes,
                      num_copied=len(plan.target_names), num_buckets=len(works), verified=verify)
