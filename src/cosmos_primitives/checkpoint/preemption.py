"""Preemption: a signal that the nodes are being taken back (Slurm's ``--signal=USR1@T`` before the
time limit, SIGTERM on preemption or ``scancel``, a Kubernetes eviction) saves a checkpoint at the
next step boundary and stops the run with :data:`PREEMPTED_EXIT_CODE`, so that ``train.resume=true``
goes on from there exactly as if never stopped (cosmos-rl's ``[train] save_ckpt_at_exit`` /
``signal_to_handle``).

A loop makes these calls on every rank::

    preemption = Preemption.from_config(cfg.train, device=info.device)   # catches the signals from now on
    while step < total_steps:
        ...one optimizer step...
        ckpt.maybe_save(step, epoch=epoch, force=step == total_steps)
        if preemption.stop_here(ckpt, step, epoch=epoch):   # collective: every rank agrees
            break                                            # saved at this step
    preemption.restore()          # training is over: a signal from now on ends the process at once
    if not preemption.stopped:
        ...final validation, export...
    ckpt.close()
    ...
    preemption.exit_if_stopped()  # SystemExit(75) naming the signal and the checkpoint

The signal handler only records the signal; the step in progress finishes, so the time from the signal
to the exit is at most one step plus one save. Give the scheduler a grace period at least that long
(Slurm ``--signal=USR1@<seconds>``, ``torchrun --signals-to-handle SIGTERM,SIGUSR1
--shutdown-timeout <seconds>``: torchrun forwards the signals it handles to every worker and kills
them after the timeout, 30 s by default). A signal that reaches only some ranks stops all of them:
the ranks agree at every boundary (one all-reduce of one number).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from cosmos_primitives.checkpoint import layout
from cosmos_primitives.logging.console import get_logger

PREEMPTED_EXIT_CODE = 75
"""The exit status of a preempted run: ``EX_TEMPFAIL`` (sysexits.h), "a temporary failure: try
again", distinct from a crash (1) and from a process killed by a signal (128 + N)."""

CATCHABLE = ("SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
"""The signal names ``[train] signal_to_handle`` accepts."""


class Preemption:
    """Turns the configured signals into a checkpoint at the next step boundary and a stop.

    Args:
        signals: signal names (``"SIGUSR1"``, ``"SIGTERM"``, ...; see :data:`CATCHABLE`).
        enabled: ``False`` installs nothing (``[train] save_ckpt_at_exit = false``): the signals keep
            their default action and :meth:`stop_here` never stops.
        device: where the ranks' agreement is reduced (``"cuda"`` under nccl); default CPU.
        group: the ranks that stop together (default: the whole job).

    Handlers are installed at construction (from the main thread; elsewhere nothing is installed
    and a warning says so) and put back by :meth:`restore`. Repeated signals change nothing.
    """

    def __init__(self, signals: Iterable[str] = ("SIGUSR1", "SIGTERM"), *, enabled: bool = True,
                 device: torch.device | str | None = None, group: dist.ProcessGroup | None = None) -> None:
        names = [str(name).upper() for name in signals]
        unknown = [name for name in names if name not in CATCHABLE]
        if unknown:
            raise ValueError(f"[train] signal_to_handle: {unknown} cannot be handled; use names of {list(CATCHABLE)}")
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.group = group
        self.received: str | None = None  # the first signal's name
        self.received_at: float | None = None  # time.monotonic() when it arrived
        self.stopped_at: int | None = None  # the step the run stopped after
        self.checkpoint: str | None = None  # what was saved for the stop (None: checkpointing is off)
        self._log = get_logger("cosmos.preemption")
        self._previous: dict[signal.Signals, Any] = {}
        if not enabled or not names:
            return
        if threading.current_thread() is not threading.main_thread():
            self._log.warning("preemption signals %s are not handled: only the main thread can install handlers",
                              names)
            return
        for name in dict.fromkeys(names):
            number = signal.Signals[name]
            self._previous[number] = signal.signal(number, self._record)

    @classmethod
    def from_config(cls, train: Any, *, device: torch.device | str | None = None,
                    group: dist.ProcessGroup | None = None) -> Preemption:
        """From ``[train]``: ``save_ckpt_at_exit`` and ``signal_to_handle``."""
        return cls(train.signal_to_handle, enabled=train.save_ckpt_at_exit, device=device, group=group)

    def _record(self, number: int, frame: FrameType | None) -> None:
        if self.received is None:  # only a flag: the step in progress runs to its end
            self.received, self.received_at = signal.Signals(number).name, time.monotonic()

    @property
    def installed(self) -> bool:
        """Whether the handlers are in place."""
        return bool(self._previous)

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop_here` stopped the run."""
        return self.stopped_at is not None

    def agreed(self) -> bool:
        """Whether any rank of the group has received a signal (collective: every rank calls it at
        the same point; without a process group, this process's flag)."""
        flag = self.received is not None
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(self.group) == 1:
            return flag
        value = torch.tensor([1 if flag else 0], device=self.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self.group)
        return bool(value.item())

    def stop_here(self, ckpt: Any, step: int, *, epoch: int = 0, weight_version: int | None = None,
                  extra: dict[str, Any] | Callable[[], dict[str, Any]] | None = None) -> bool:
        """At a step boundary (collective): when a signal arrived on any rank, save ``step`` with
        ``ckpt`` (a :class:`~cosmos_primitives.checkpoint.CheckpointManager`; unless its last save
        already was this step, or checkpointing is off) and return True: the loop stops. ``extra``
        (or the callable making it, called on every rank only when a save follows) goes into the
        checkpoint as with ``ckpt.save``."""
        if not self.installed or not self.agreed():
            return False
        waited = time.monotonic() - self.received_at if self.received_at is not None else 0.0
        why = f"{self.received or 'a signal on another rank'}" + (f" ({waited:.1f} s ago)" if self.received else "")
        if not ckpt.config.enable_checkpoint:
            self.checkpoint = None
            self._log.warning("%s: stopping after step %d without a checkpoint ([train.ckpt] enable_checkpoint is "
                              "false): a rerun starts from the beginning", why, step)
        elif getattr(ckpt, "last_saved_step", None) == step:
            self.checkpoint = str(ckpt.checkpoints_dir / layout.step_dir_name(step))
            self._log.warning("%s: step %d was just saved; stopping", why, step)
        else:
            self._log.warning("%s: saving a checkpoint of step %d, then stopping", why, step)
            made = extra() if callable(extra) else extra
            self.checkpoint = str(ckpt.save(step, epoch=epoch, weight_version=weight_version, extra=made))
        self.stopped_at = step
        return True

    def restore(self) -> None:
        """Put the signals' previous handlers back (later signals act as they did before)."""
        for number, previous in self._previous.items():
            signal.signal(number, previous)
        self._previous = {}

    def exit_if_stopped(self) -> None:
        """Raise ``SystemExit(PREEMPTED_EXIT_CODE)`` when :meth:`stop_here` stopped the run (after
        logging what was saved and how to go on); else nothing."""
        if not self.stopped:
            return
        where = f"checkpoint {self.checkpoint}" if self.checkpoint else "no checkpoint (checkpointing is off)"
        self._log.warning("preempted by %s after step %d: %s; run again with train.resume=true to go on "
                          "(exit status %d)", self.received or "a signal on another rank", self.stopped_at, where,
                          PREEMPTED_EXIT_CODE)
        raise SystemExit(PREEMPTED_EXIT_CODE)
