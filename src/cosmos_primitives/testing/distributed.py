"""Run a function in N gloo processes, the way ``torchrun`` would, and collect the results."""

from __future__ import annotations

import os
import pickle
import queue as queue_mod
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch.multiprocessing as mp

from cosmos_primitives.parallel.distributed import free_port


def _worker(fn: Callable[..., Any], rank: int, world_size: int, port: int, args: Sequence[Any],
            env: dict[str, str], results: Any) -> None:
    os.environ.update(env)
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), COSMOS_DEVICE="cpu",
    )
    from cosmos_primitives.parallel.distributed import destroy_distributed, init_distributed

    try:
        init_distributed(backend="gloo", timeout_s=300.0)
        # pickled here: tensors sent through a torch queue would share memory that vanishes when this
        # process exits before the parent reads them
        value = pickle.dumps(fn(*args))
        results.put((rank, True, value))
    except BaseException:  # report everything, including SystemExit from the function
        results.put((rank, False, traceback.format_exc()))
    finally:
        destroy_distributed()


def run_distributed(fn: Callable[..., Any], world_size: int, args: Sequence[Any] = (), *,
                    timeout_s: float = 300.0, env: dict[str, str] | None = None) -> list[Any]:
    """Start ``world_size`` processes with a gloo group each and call ``fn(*args)`` in every one.

    ``fn`` must be importable (defined at module level) and its return value picklable. The
    default process group is initialised before ``fn`` runs (use ``torch.distributed`` freely).

    Returns:
        The return values, ordered by rank.

    Raises:
        RuntimeError: a rank raised (its traceback is in the message) or the run exceeded
            ``timeout_s``; every child is terminated either way.
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_worker, args=(fn, rank, world_size, port, tuple(args), dict(env or {}), results))
        for rank in range(world_size)
    ]
    for p in procs:
        p.start()
    collected: dict[int, Any] = {}
    failures: list[str] = []
    finished = False
    try:
        while len(collected) + len(failures) < world_size:
            try:
                rank, ok, value = results.get(timeout=timeout_s)
            except queue_mod.Empty:
                raise RuntimeError(
                    f"run_distributed({getattr(fn, '__name__', fn)}, world_size={world_size}) timed out "
                    f"after {timeout_s:.0f}s; ranks that reported: {sorted(collected)}"
                ) from None
            if ok:
                collected[rank] = pickle.loads(value)
            else:
                failures.append(f"--- rank {rank} ---\n{value}")
                break
        finished = not failures
    finally:
        for p in procs:
            # after a failure or timeout the other ranks may be blocked in a collective: do not wait
            p.join(timeout=30 if finished else 1)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
            if p.is_alive():
                p.kill()
    if failures:
        raise RuntimeError(f"{getattr(fn, '__name__', fn)} failed:\n" + "\n".join(failures))
    return [collected[r] for r in range(world_size)]
