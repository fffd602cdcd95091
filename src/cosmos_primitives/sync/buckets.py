"""Packing tensors into fixed-size flat byte buckets: where each piece of each tensor goes.

The layout is a pure function of the tensors' sizes, so every rank that knows the sizes computes
the same one. A tensor larger than the room left in a bucket is split across buckets, so no
bucket exceeds ``bucket_bytes``. Within a tensor, pieces are contiguous (a tensor that fits in
one bucket occupies one byte range and can be viewed in place); each tensor starts at an
``ALIGN``-byte boundary.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

ALIGN = 64


@attrs.frozen
class Piece:
    """``numel`` elements copied from ``source[source_offset:]`` (flattened) to
    ``target[target_offset:]`` (flattened) through ``bucket`` at ``byte_offset``."""

    target: int
    target_offset: int
    numel: int
    source: int
    source_offset: int
    bucket: int
    byte_offset: int


@attrs.frozen
class BucketLayout:
    """Pieces in transfer order and the bytes used in each bucket."""

    pieces: tuple[Piece, ...]
    bucket_used: tuple[int, ...]

    def by_bucket(self) -> list[list[Piece]]:
        out: list[list[Piece]] = [[] for _ in self.bucket_used]
        for p in self.pieces:
            out[p.bucket].append(p)
        return out


def layout_buckets(targets: Sequence[tuple[int, Sequence[tuple[int, int]]]], bucket_bytes: int) -> BucketLayout:
    """Assign every element of every target to a bucket.

    Args:
        targets: per target, ``(element size in bytes, [(source index, numel), ...])``; the sources
            are concatenated in order (a fused tensor has several).
        bucket_bytes: capacity of one bucket; at least ``ALIGN`` and the largest element size.

    Returns:
        The layout; ``sum(bucket_used) <= len(bucket_used) * bucket_bytes``.
    """
    if bucket_bytes < ALIGN:
        raise ValueError(f"bucket_bytes={bucket_bytes} is too small; use at least {ALIGN} bytes")
    pieces: list[Piece] = []
    used: list[int] = []
    bucket, offset, filled = 0, 0, 0  # filled: end of the last piece in the current bucket
    for t_index, (esize, sources) in enumerate(targets):
        if esize > bucket_bytes:
            raise ValueError(f"bucket_bytes={bucket_bytes} is smaller than one element ({esize} bytes)")
        offset = -(-offset // ALIGN) * ALIGN
        t_offset = 0
        for s_index, numel in sources:
            s_offset = 0
            while s_offset < numel:
                room = max(0, bucket_bytes - offset) // esize
                if room == 0:
                    used.append(filled)
                    bucket, offset, filled = bucket + 1, 0, 0
                    continue
                n = min(room, numel - s_offset)
                pieces.append(Piece(t_index, t_offset, n, s_index, s_offset, bucket, offset))
                offset += n * esize
                filled = offset
                s_offset += n
                t_offset += n
    used.append(filled)
    return BucketLayout(tuple(pieces), tuple(used))


def arena_starts(layout: BucketLayout, bucket_bytes: int, num_targets: int) -> list[int]:
    """Byte offset of each target in an arena where bucket ``b`` occupies
    ``[b * bucket_bytes, b * bucket_bytes + bucket_used[b])``: the buckets laid end to end.

    Every target is then one contiguous byte range of the arena (a target split across buckets
    continues at the next bucket's start, since it filled the previous bucket to its end), so a
    model whose tensors are views of the arena sends and receives bucket slices without copies.
    Targets without elements get -1.

    Raises:
        ValueError: ``bucket_bytes`` is not a multiple of ``ALIGN``.
    """
    if bucket_bytes % ALIGN:
        raise ValueError(f"an arena layout needs bucket_bytes divisible by {ALIGN}, got {bucket_bytes}")
    starts = [-1] * num_targets
    for p in layout.pieces:
        if starts[p.target] < 0:
            starts[p.target] = p.bucket * bucket_bytes + p.byte_offset
    return starts


def arena_size(layout: BucketLayout, bucket_bytes: int) -> int:
    """Bytes of the arena of :func:`arena_starts`."""
    return (len(layout.bucket_used) - 1) * bucket_bytes + layout.bucket_used[-1]
