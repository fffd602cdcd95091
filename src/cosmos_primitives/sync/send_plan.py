"""The trainer side's plan of a bucketed weight transfer: which engine tensor each parameter
feeds, its wire dtype, and where each piece of it goes in which bucket.

Built identically on every trainer rank from the model alone (names, shapes, dtypes), so the
ranks that only join the gathers agree with the sender. Shared by the in-job broadcast
(:class:`~cosmos_primitives.sync.broadcast.WeightBroadcaster`) and the cross-job server
(:class:`~cosmos_primitives.sync.weight_server.WeightServer`).
"""

from __future__ import annotations

import hashlib

import msgspec
import torch
from torch import nn

from cosmos_primitives.models.name_maps import map_names, resolve_family
from cosmos_primitives.sync.buckets import BucketLayout, Piece, layout_buckets
from cosmos_primitives.sync.sources import fused_shape, local_device, named_sources, ties_embeddings

DEFAULT_BUCKET_BYTES = 256 << 20


class WirePlan(msgspec.Struct, array_like=True):
    """What receivers need: per engine tensor ``(name, shape, wire dtype)``; per piece
    ``(target, target_offset, numel, bucket, byte_offset)``; bytes used per bucket."""

    targets: list[tuple[str, list[int], str]]
    pieces: list[tuple[int, int, int, int, int]]
    bucket_used: list[int]
    bucket_bytes: int


def wire_dtype(name: str) -> torch.dtype:
    """The dtype a plan names (``"torch.bfloat16"``)."""
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype '{name}' in the weight plan")
    return dtype


def fingerprint(blob: bytes) -> int:
    """A 56-bit hash of a plan blob (fits an int64 header slot)."""
    return int.from_bytes(hashlib.blake2b(blob, digest_size=7).digest(), "little")


class SendPlan:
    """The sender's plan for ``model``.

    Attributes:
        sources: the trainer's parameters (plain tensors, FSDP2 shards or merged LoRA weights), in order.
        source_names: their clean names.
        wire: per engine tensor, its dtype on the wire.
        place: source index -> (engine tensor index, element offset inside it).
        layout: the bucket layout; ``buckets`` its pieces grouped per bucket.
        blob: the msgspec JSON of the :class:`WirePlan` receivers get; ``fingerprint`` its hash.
        target_names: engine tensor names.
        device: where this rank's part of the parameters lives.

    Raises:
        ValueError: the model has no parameters, or fused parts do not fit together.
    """

    def __init__(self, model: nn.Module, *, layout: str = "hf", family: str | None = None,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, transfer_dtype: torch.dtype | None = None) -> None:
        sources = named_sources(model)
        names = list(sources)
        index = {n: i for i, n in enumerate(names)}
        self.sources = [sources[n] for n in names]
        if not self.sources:
            raise ValueError(f"{type(model).__name__} has no parameters to send")
        self.source_names = names
        specs = map_names(names, layout, resolve_family(model, family, layout), tied=ties_embeddings(model))
        targets: list[tuple[str, list[int], str]] = []
        sizes: list[tuple[int, list[tuple[int, int]]]] = []
        self.wire: list[torch.dtype] = []
        self.place: dict[int, tuple[int, int]] = {}
        for t_index, spec in enumerate(specs):
            parts = [sources[s] for s in spec.sources]
            shape = fused_shape(spec.name, spec.sources, parts)
            wire = transfer_dtype if transfer_dtype is not None and parts[0].is_floating_point() else parts[0].dtype
            self.wire.append(wire)
            targets.append((spec.name, list(shape), str(wire)))
            offset, members = 0, []
            for s in spec.sources:
                self.place[index[s]] = (t_index, offset)
                members.append((index[s], sources[s].numel()))
                offset += sources[s].numel()
            sizes.append((torch.empty((), dtype=wire).element_size(), members))
        self.layout: BucketLayout = layout_buckets(sizes, bucket_bytes)
        plan = WirePlan(
            targets=targets,
            pieces=[(p.target, p.target_offset, p.numel, p.bucket, p.byte_offset) for p in self.layout.pieces],
            bucket_used=list(self.layout.bucket_used),
            bucket_bytes=bucket_bytes,
        )
        self.blob = msgspec.json.encode(plan)
        self.fingerprint = fingerprint(self.blob)
        self.target_names = [t[0] for t in targets]
        self.buckets = self.layout.by_bucket()
        self.bucket_bytes = bucket_bytes
        self.device = local_device(self.sources[0])

    @property
    def active_buckets(self) -> list[int]:
        """Buckets that carry bytes (an empty model part leaves none empty, but a plan may)."""
        return [b for b, used in enumerate(self.layout.bucket_used) if used > 0]

    def pack(self, buf: torch.Tensor, p: Piece, flat: torch.Tensor) -> None:
        """Copy piece ``p`` of the flattened full source ``flat`` into bucket buffer ``buf`` (cast to the wire)."""
        wire = self.wire[p.target]
        nbytes = p.numel * torch.empty((), dtype=wire).element_size()
        buf[p.byte_offset:p.byte_offset + nbytes].view(wire).copy_(flat[p.source_offset:p.source_offset + p.numel])
