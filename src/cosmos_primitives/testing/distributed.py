"""Run a function in N gloo processes, the way ``torchrun`` would, and collect the results.

The processes come from a fork server (:mod:`~cosmos_primitives.testing.fork_server`) that imported
torch, transformers and the library once: a spawned process imports them afresh (3-5 CPU-s each on a
small CPU, most of what a short distributed test costs), a forked one starts with them loaded.
"""

from __future__ import annotations

import os
import pickle
import queue as queue_mod
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch.multiprocessing as mp

from cosmos_primitives.parallel.distributed import free_port
from cosmos_primitives.testing.fork_server import fork_server_context

START_METHODS = ("forkserver", "spawn")


def _worker(fn: Callable[..., Any], rank: int, world_size: int, port: int, args: Sequence[Any],
            env: dict[str, str], results: Any) -> None:
    # a forked process holds the fork server's environment: take the caller's, as spawn would
    os.environ.clear()
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
                    timeout_s: float = 300.0, env: dict[str, str] | None = None,
                    start_method: str = "forkserver") -> list[Any]:
    """Start ``world_size`` processes with a gloo group each and call ``fn(*args)`` in every one.

    ``fn`` must be importable (defined at module level) and its return value picklable. The
    default process group is initialised before ``fn`` runs (use ``torch.distributed`` freely).
    Each process gets the caller's environment plus ``env``.

    Args:
        start_method: ``"forkserver"`` (default: forked from a server that imported
            :data:`~cosmos_primitives.testing.fork_server.FORKSERVER_PRELOAD` once per calling
            process) or ``"spawn"`` (a fresh interpreter per rank).

    Returns:
        The return values, ordered by rank.

    Raises:
        RuntimeError: a rank raised (its traceback is in the message) or the run exceeded
            ``timeout_s``; every child is terminated either way.
    """
    if start_method not in START_METHODS:
        raise ValueError(f"start_method must be one of {START_METHODS}, got {start_method!r}")
    ctx = fork_server_context() if start_method == "forkserver" else mp.get_context(start_method)
    results = ctx.Queue()
    port = free_port()
    child_env = {**os.environ, **(env or {})}
    procs = [
        ctx.Process(target=_worker, args=(fn, rank, world_size, port, tuple(args), child_env, results))
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
