"""Ctrl-C in a recipe: stop at once, keep the checkpoints whole, say how to go on.

A recipe wraps its ``main()``::

    if __name__ == "__main__":
        with cp.checkpoint.exit_on_interrupt():
            main()

and a ``KeyboardInterrupt`` (SIGINT, Ctrl-C) anywhere in the run then:

- lets a background checkpoint save already under way finish (no new save is started: Ctrl-C means
  now; a SIGTERM / SIGUSR1, :class:`~cosmos_primitives.checkpoint.Preemption`, is the signal that
  saves the step in progress), then deletes half-written ``step_N.tmp`` folders of checkpoints and
  exports, so the newest complete checkpoint is what a resume loads;
- closes the progress bar and ``metrics.jsonl``;
- prints ``stopped at step N; resume with: <the same command with train.resume=true>`` (rank 0)
  and exits with status :data:`INTERRUPTED_EXIT_CODE` (130, as a shell reports Ctrl-C), without a
  traceback. A second Ctrl-C while the save finishes stops waiting for it; its ``.tmp`` folder is
  then removed by the next ``train.resume=true``.

A Ctrl-C that Python would drop is delivered again: one landing while a finalizer runs (a ``__del__``,
e.g. a video decoder freeing its handle, or a weakref callback) is only printed as "Exception ignored
in" and the run goes on. Inside the block such an interrupt is raised again in the code that runs
next, without the message.

The step is the last one the run's :class:`~cosmos_primitives.logging.MetricsTracker` logged; the
checkpoints are those of the run's :class:`~cosmos_primitives.checkpoint.CheckpointManager` (each
registers itself when made).
"""

from __future__ import annotations

import _thread
import contextlib
import os
import shlex
import sys
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

from cosmos_primitives.logging.console import get_logger

INTERRUPTED_EXIT_CODE = 130
"""The exit status of a run stopped by Ctrl-C: 128 + SIGINT, what a shell reports for it."""

_MANAGERS: weakref.WeakSet[Any] = weakref.WeakSet()


def register_manager(manager: Any) -> None:
    """Called by each :class:`~cosmos_primitives.checkpoint.CheckpointManager` when made."""
    _MANAGERS.add(manager)


def resume_command(argv: Sequence[str] | None = None) -> str:
    """The command that started this process (default ``sys.orig_argv``; under torchrun, ``torchrun
    --nproc_per_node <local world size> <script> <args>``) with ``train.resume=true`` in place of
    any ``train.resume=...`` override, quoted for a POSIX shell."""
    if argv is None:
        if os.environ.get("TORCHELASTIC_RUN_ID") is not None:
            argv = ["torchrun", f"--nproc_per_node={os.environ.get('LOCAL_WORLD_SIZE', '1')}", *sys.argv]
        else:
            argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    kept = [arg for arg in argv if not arg.startswith(("train.resume=", "--train.resume="))]
    return shlex.join([*kept, "train.resume=true"])


def _stop() -> None:
    from cosmos_primitives.logging.tracker import live_trackers

    steps = []
    for tracker in live_trackers():
        if tracker.last_step is not None:
            steps.append(tracker.last_step)
        tracker.finish()
    checkpoints = [manager.settle_after_interrupt() for manager in list(_MANAGERS)]
    if os.environ.get("RANK", "0") != "0":
        raise SystemExit(INTERRUPTED_EXIT_CODE)
    log = get_logger()
    step = max(steps) if steps else 0
    latest = next((c for c in checkpoints if c), None)
    log.warning("stopped at step %d; resume with: %s", step, resume_command())
    if latest is not None:
        log.warning("the resumed run goes on from the newest complete checkpoint, %s", latest)
    elif _MANAGERS:
        log.warning("no checkpoint was complete yet: the resumed run starts from step 0")
    raise SystemExit(INTERRUPTED_EXIT_CODE)


@contextlib.contextmanager
def exit_on_interrupt() -> Iterator[None]:
    """Turn a ``KeyboardInterrupt`` inside the block into the stop described in the module docstring
    (``SystemExit(130)``); anything else passes through."""
    previous_hook = sys.unraisablehook

    def redeliver_dropped_interrupt(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            # from another thread: called here, the handler would raise inside this hook, dropped again;
            # the main thread meets it in the code it runs next (a finalizer again: delivered again)
            _thread.start_new_thread(_thread.interrupt_main, ())
        else:
            previous_hook(unraisable)

    sys.unraisablehook = redeliver_dropped_interrupt
    try:
        yield
    except BaseException as exc:
        if not _is_interrupt(exc):
            raise
        _stop()
    finally:
        if sys.unraisablehook is redeliver_dropped_interrupt:
            sys.unraisablehook = previous_hook


def _is_interrupt(exc: BaseException) -> bool:
    """A ``KeyboardInterrupt``, or DCP's ``CheckpointException`` wrapping one (Ctrl-C during a save)."""
    if isinstance(exc, KeyboardInterrupt):
        return True
    failures = getattr(exc, "failures", None)
    return isinstance(failures, dict) and any(
        isinstance(failure[0] if isinstance(failure, tuple) else failure, KeyboardInterrupt)
        for failure in failures.values())
