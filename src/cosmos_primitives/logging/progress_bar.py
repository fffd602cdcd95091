"""Progress bars for long loops, shown on rank 0 only."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")


def progress(iterable: Iterable[T], total: int | None = None, desc: str = "", *,
             disable: bool | None = None) -> Iterator[T]:
    """Wrap ``iterable`` in a tqdm bar on rank 0; other ranks, and ``COSMOS_NO_PROGRESS=1``, get none."""
    if disable is None:
        disable = os.environ.get("RANK", "0") != "0" or os.environ.get("COSMOS_NO_PROGRESS") == "1"
    return iter(tqdm(iterable, total=total, desc=desc, disable=disable, dynamic_ncols=True, leave=False))
