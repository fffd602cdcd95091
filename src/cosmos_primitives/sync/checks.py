"""Bitwise comparison and position-aware checksums for the first-sync check."""

from __future__ import annotations

import torch

CHUNK_WORDS = 1 << 22  # words per reduction: bounds temporary memory to ~64 MB of int64
_PRIME = (1 << 61) - 1
_WEIGHT_PERIOD = 65521


class WeightMismatchError(RuntimeError):
    """The engine's weights after a sync differ from the trainer's."""


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bit pattern of ``t`` as a flat integer tensor of the same element size (so that
    NaN == NaN and -0.0 != 0.0, unlike ``torch.equal``)."""
    flat = t.detach().contiguous().view(-1)
    size = flat.element_size()
    return flat.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size])


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, same dtype, same bits."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b.to(a.device)))


def describe_difference(expected: torch.Tensor, got: torch.Tensor) -> str:
    """A one-line account of how ``got`` differs from ``expected`` (shapes, dtypes or values)."""
    if expected.shape != got.shape or expected.dtype != got.dtype:
        return (f"expected shape {tuple(expected.shape)} {expected.dtype}, "
                f"got shape {tuple(got.shape)} {got.dtype}")
    differ = bits(expected) != bits(got.to(expected.device))
    count = int(differ.sum())
    first = int(differ.nonzero()[0, 0]) if count else -1
    if first < 0:
        return "no difference"
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(first), expected.shape))
    e, g = expected.reshape(-1)[first].item(), got.reshape(-1)[first].item()
    return f"{count} of {expected.numel()} elements differ; first at index {index}: expected {e!r}, got {g!r}"


def checksum(t: torch.Tensor, element_offset: int = 0) -> tuple[int, int]:
    """Two sums over the bits of ``t`` (flattened), exact integers modulo 2**61 - 1.

    The second sum weights each 16-bit word by its position, so that swapped or shifted values
    are caught. Checksums of consecutive pieces of one tensor add up to the whole tensor's:
    ``checksum(x[:k]) + checksum(x[k:], element_offset=k) == checksum(x)`` (element-wise, mod p).

    Args:
        t: any dtype, any device; only its bits matter.
        element_offset: index of ``t``'s first element inside the tensor it is a piece of.
    """
    flat = t.detach().contiguous().view(-1)
    size = flat.element_size()
    words = flat.view(torch.uint8) if size == 1 else flat.view(torch.int16)
    start = element_offset * max(1, size // 2)
    plain = weighted = 0
    for i in range(0, words.numel(), CHUNK_WORDS):
        w = words[i:i + CHUNK_WORDS].to(torch.int64)
        if size > 1:
            w &= 0xFFFF
        pos = torch.arange(start + i, start + i + w.numel(), device=w.device, dtype=torch.int64)
        pos = pos.remainder_(_WEIGHT_PERIOD).add_(1)
        # each term < 2**32 and a chunk has 2**22 of them: the int64 sums below cannot overflow
        plain += int(w.sum())
        weighted += int((w * pos).sum())
    return plain % _PRIME, weighted % _PRIME


def add_checksums(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    """Checksum of the concatenation of two pieces (see :func:`checksum`)."""
    return (a[0] + b[0]) % _PRIME, (a[1] + b[1]) % _PRIME
