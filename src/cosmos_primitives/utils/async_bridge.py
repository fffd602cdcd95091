"""Run a coroutine to completion from synchronous code, inside a running event loop or not."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coroutine)``; when this thread already runs an event loop (a notebook, an async
    caller of a sync API), the coroutine runs on a fresh loop in a helper thread instead, and this
    call blocks until it is done. Exceptions of the coroutine propagate unchanged."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()
