"""Run ``python script.py args`` in a process forked from a server that has imported torch,
transformers and the library, instead of in a fresh interpreter.

A recipe started as a fresh interpreter spends 4-5 CPU-s importing before its first line of work, most
of what a tiny test run costs on a small CPU. The forked process starts with those modules loaded and
then does what the interpreter would: the script runs as ``__main__`` with ``sys.argv``, the working
directory, the environment (its ``PYTHONPATH`` on ``sys.path``), what an exec'd child keeps of the
caller's signals (SIGINT ignored or not, the signal mask), stdin from ``/dev/null`` and stdout / stderr
appended to a log file; at its end the interpreter's shutdown (non-daemon threads joined, ``atexit``
handlers, streams flushed) and its exit status (``sys.exit`` codes, 1 after an uncaught exception,
death by SIGINT after an uncaught ``KeyboardInterrupt``). What differs: modules the server imported read
their environment when the server started, not when the script did (none of this library's modules
read it at import time).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Sequence
from pathlib import Path

from cosmos_primitives.testing.fork_server import fork_server_context


def become_child(cwd: str | os.PathLike[str], env: dict[str, str], log: str | os.PathLike[str]) -> None:
    """In a forked process: what a child started with ``cwd``, exactly ``env``, stdin from ``/dev/null``
    and stdout / stderr appended to ``log`` would have; ``sys.stdout`` / ``sys.stderr`` write to those
    descriptors line by line (the parent's may not: pytest captures them)."""
    out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    # every line reaches the log as it is written, as with PYTHONUNBUFFERED (tests wait for log lines)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True,
                                                   write_through=True)
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True,
                                                   write_through=True, errors="backslashreplace")
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)


def _script_main(argv: list[str], cwd: str, env: dict[str, str], log: str, new_session: bool,
                 sigint_ignored: bool, sigmask: set[int]) -> None:
    """The forked process: become ``python *argv`` run from ``cwd`` and exit as it would."""
    # started as a daemon so that a test process never waits for a script left running at its exit;
    # the script itself may start processes of its own
    multiprocessing.current_process().daemon = False
    if new_session:
        os.setsid()
    become_child(cwd, env, log)
    threads = env.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))
    # what a child exec'd by the caller would keep: an ignored SIGINT and the signal mask (a handler resets)
    signal.signal(signal.SIGINT, signal.SIG_IGN if sigint_ignored else signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, sigmask)
    script = os.path.abspath(argv[0])
    sys.argv = list(argv)
    sys.orig_argv = [sys.executable, *argv]
    # what `python script.py` puts first: the script's folder, then the caller's PYTHONPATH
    extra = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:0] = [os.path.dirname(script), *(p for p in extra if p not in sys.path)]
    atexit._clear()  # the server's handlers are not the script's
    code = 0
    interrupted = False
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        code = _exit_code(stop.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        interrupted = True
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        _shut_down_as_the_interpreter_does()
    if interrupted:  # Python ends an uncaught KeyboardInterrupt by dying of SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _exit_code(code: object) -> int:
    """``sys.exit(code)``'s exit status: ``None`` 0, an int itself, anything else printed and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _shut_down_as_the_interpreter_does() -> None:
    """Join non-daemon threads, run ``atexit`` handlers, flush the standard streams (Py_FinalizeEx's order)."""
    with contextlib.suppress(Exception):
        threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


class ScriptProcess:
    """A script started by :func:`start_script`: the parts of :class:`subprocess.Popen` that tests use.

    ``returncode`` is ``None`` while it runs, then its exit status (``-N`` when killed by signal ``N``).
    """

    def __init__(self, process, args: list[str]) -> None:
        self._process = process
        self.args = args
        self.pid: int = process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        """Its exit status; :class:`subprocess.TimeoutExpired` if it still runs after ``timeout`` seconds."""
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self._process.exitcode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # it ended in between
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start_script(argv: Sequence[str | Path], log: str | Path, *, cwd: str | Path,
                 env: dict[str, str] | None = None, new_session: bool = False, here: bool = False) -> ScriptProcess:
    """Start ``python *argv`` from ``cwd``, forked from the fork server; stdout and stderr appended to ``log``.

    Args:
        argv: the script's path (relative to ``cwd`` or absolute) and its arguments.
        env: the whole environment of the script (default: this process's); its ``PYTHONPATH`` is put on
            ``sys.path``, as an interpreter would.
        new_session: the script gets a session and process group of its own (``os.killpg(pid, ...)``
            reaches it and whatever it starts), as ``subprocess.Popen(start_new_session=True)``.
        here: fork this process instead of the fork server, for a caller that has already imported
            what the script needs beyond the server's preload (the GPU pack's dry run: diffusers).
            CPU only: a process that has initialised CUDA cannot be forked.
    """
    args = [str(a) for a in argv]
    Path(log).touch()  # there when this returns, as for a Popen writing to it
    ctx = multiprocessing.get_context("fork") if here else fork_server_context()
    process = ctx.Process(target=_script_main, name=f"script {Path(args[0]).name}", daemon=True,
                          args=(args, str(Path(cwd).resolve()), dict(os.environ if env is None else env),
                                str(Path(log).resolve()), new_session,
                                signal.getsignal(signal.SIGINT) is signal.SIG_IGN,
                                signal.pthread_sigmask(signal.SIG_BLOCK, ())))
    process.start()
    return ScriptProcess(process, [sys.executable, *args])


def run_script(argv: Sequence[str | Path], log: str | Path, *, cwd: str | Path, env: dict[str, str] | None = None,
               timeout_s: float = 300.0) -> subprocess.CompletedProcess:
    """:func:`start_script` and wait: a ``CompletedProcess`` whose ``stdout`` is the text the run added to
    ``log`` (stdout and stderr together, ``stderr`` is ``None``). Killed and
    :class:`subprocess.TimeoutExpired` after ``timeout_s`` seconds, as ``subprocess.run`` does."""
    log = Path(log)
    start = log.stat().st_size if log.exists() else 0
    proc = start_script(argv, log, cwd=cwd, env=env)
    try:
        code = proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    with log.open("rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    return subprocess.CompletedProcess(proc.args, code, stdout=text, stderr=None)
