"""Run an example recipe as users do (``python`` / ``torchrun``), wait for it, or SIGKILL it at a chosen
moment: the pieces of end-to-end kill-and-resume tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from cosmos_primitives.checkpoint.manager import PAUSE_ENV
from cosmos_primitives.testing.forked_script import ScriptProcess, start_script

RUN_TIMEOUT_S = 300.0


def launch_recipe(script: str | Path, config: str | Path, overrides: Sequence[str], log: Path, *, cwd: str | Path,
                  nproc: int = 1, env: dict[str, str] | None = None, torchrun: bool | None = None,
                  new_session: bool = False, fork: bool = True) -> subprocess.Popen | ScriptProcess:
    """Start ``script --config config *overrides`` from ``cwd``, stdout and stderr appended to ``log``.

    ``nproc > 1`` (or ``torchrun=True``) runs it under ``torch.distributed.run --standalone`` (a free
    rendezvous port, so parallel test sessions do not collide). One process without torchrun is
    ``python script ...``: forked from the fork server, which has imported torch, transformers and the
    library (:func:`~cosmos_primitives.testing.forked_script.start_script`), unless ``fork=False`` (a
    fresh interpreter). The checkpoint pause hook (``PAUSE_ENV``) is only set when ``env`` sets it.
    ``new_session``: the run gets a process group of its own, which :func:`kill_tree` kills whole (a
    job started on its own, as on another node).
    """
    full_env = {k: v for k, v in os.environ.items() if k != PAUSE_ENV}
    full_env.update(env or {})
    if not (nproc > 1 if torchrun is None else torchrun):
        if fork:
            return start_script([script, "--config", config, *overrides], log, cwd=cwd, env=full_env,
                                new_session=new_session)
        cmd = [sys.executable, str(script)]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", str(script)]
    with open(log, "ab") as out:
        return subprocess.Popen([*cmd, "--config", str(config), *overrides], cwd=cwd, env=full_env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=new_session)


def descendants(pid: int) -> list[int]:
    """``pid``'s child processes, their children and so on (from ``/proc``; a child is listed under
    the thread that started it); parents before their children."""
    found = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):  # the thread or process ended meanwhile
            for child in map(int, children.read_text().split()):
                found += [child, *descendants(child)]
    return found


def kill_tree(proc: subprocess.Popen | ScriptProcess) -> None:
    """SIGKILL every process of a run launched with ``new_session=True`` and reap it: its process group
    and every descendant, found before the kill (``torchrun``'s launcher starts each worker in a
    session of its own, which a signal to the launcher's group does not reach)."""
    tree = descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def finish(proc: subprocess.Popen | ScriptProcess, log: Path, timeout_s: float = RUN_TIMEOUT_S) -> str:
    """Wait for a launched run and return its log; AssertionError (with the log's end) unless it exited with 0."""
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    text = log.read_text(errors="replace")
    if proc.returncode != 0:
        raise AssertionError(f"the run exited with {proc.returncode}; end of {log}:\n{text[-4000:]}")
    return text


def kill_when(proc: subprocess.Popen | ScriptProcess, ready: Callable[[], bool], log: Path, what: str,
              timeout_s: float = RUN_TIMEOUT_S, sig: int = signal.SIGKILL, tree: bool = False) -> None:
    """Send ``sig`` to ``proc`` as soon as ``ready()`` is true; AssertionError if the run ends or stalls first.

    SIGKILL (the default) is a crash; SIGTERM lets a ``torchrun`` launcher stop its workers (a
    SIGKILLed launcher would leave them running), waiting up to 60 s before SIGKILL. ``tree``: SIGKILL
    the whole run at once instead (:func:`kill_tree`; launched with ``new_session=True``), the
    ``torchrun`` launcher and its workers alike, for a test that needs nothing after ``ready``: it does
    not wait for the step in progress and a checkpoint, as after a SIGTERM.
    """
    deadline = time.monotonic() + timeout_s
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            kill_tree(proc) if tree else proc.kill()
            proc.wait()
            raise AssertionError(f"the run ended (rc {proc.returncode}) or stalled before {what}; end of {log}:\n"
                                 f"{log.read_text(errors='replace')[-4000:]}")
        time.sleep(0.02)
    if tree:
        kill_tree(proc)
        return
    os.kill(proc.pid, sig)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if sig == signal.SIGKILL and proc.returncode != -signal.SIGKILL:
        raise AssertionError(f"the run had already exited with {proc.returncode} when killed")


def only_run_dir(output_dir: Path) -> Path:
    """The single run directory ``<output_dir>/<timestamp>`` (AssertionError when there are several or none)."""
    runs = [p for p in output_dir.iterdir() if p.is_dir()]
    if len(runs) != 1:
        raise AssertionError(f"expected one run directory under {output_dir}, found {runs}")
    return runs[0]
