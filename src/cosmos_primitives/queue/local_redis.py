"""A private ``redis-server`` on a free loopback port, for a test or a benchmark.

It persists by default with what the queue's no-loss promise needs (see
:mod:`cosmos_primitives.queue.redis_queue`): an append-only file fsynced before every reply
(``appendonly yes``, ``appendfsync always``: a put or ack the client saw succeed survives a SIGKILL
of the server and a crash of its machine, so producers need not keep and re-send what they put)
and no eviction (``maxmemory-policy noeviction``: a full server refuses writes instead of dropping
stream keys). The cost is one fsync per write batch, small next to a rollout's generation.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from cosmos_primitives.parallel.distributed import free_port

_LIVE: set[RedisServer] = set()

# Runs the server ("$0" "$@") in the background and prints its pid. A second background job waits
# for end-of-file on the saved stdin (fd 3: background jobs get /dev/null as stdin) and then stops
# the server: the parent's end of that pipe closes when the parent closes it or exits in any way,
# SIGKILL included. sh itself exits with the server.
_SUPERVISOR = ('exec 3<&0; "$0" "$@" >/dev/null 3<&- & pid=$!; echo $pid; '
               '(read _ <&3; kill $pid) >/dev/null 2>&1 & wait $pid')


def live_servers() -> list[RedisServer]:
    """Servers started in this process and not stopped yet."""
    return [s for s in _LIVE if s.running]


@atexit.register
def _stop_all() -> None:
    for server in list(_LIVE):
        server.close()


class RedisServer:
    """Start ``redis-server`` on 127.0.0.1 with an fsynced append-only file, and stop it again.

    The server goes away with the process that started it, however that process ends (also on
    SIGKILL). Usable as a context manager. :meth:`restart` stops and starts it on the same port
    and data folder, so it comes back with everything it had acknowledged (also after the server
    was SIGKILLed). ``url`` is ``redis://127.0.0.1:<port>/0``; ``pid`` the server's own process id.

    Args:
        port: default a free one.
        data_dir: where the append-only file lives; a folder given here is kept by :meth:`close`
            (a run passes ``<run_dir>/redis`` so that a resumed run gets its queued records back);
            default a temporary folder removed by :meth:`close`.
        persistent: False runs without any persistence (a restart forgets everything).
        appendfsync: ``"always"`` (default: nothing acknowledged is lost), ``"everysec"`` (a crash
            of the machine may lose the last ~2 s of acknowledged writes) or ``"no"``.
        extra_args: more ``redis-server`` options, appended (they win over the ones above).

    Raises:
        RuntimeError: ``redis-server`` is not on PATH (with the command to install it) or did not
            answer PING within ``start_timeout_s``.
    """

    def __init__(self, port: int | None = None, start_timeout_s: float = 10.0, extra_args: tuple[str, ...] = (),
                 *, data_dir: str | os.PathLike[str] | None = None, persistent: bool = True,
                 appendfsync: str = "always") -> None:
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            raise RuntimeError(
                "redis-server is not installed: run scripts/setup.sh as root, or "
                "`apt-get install redis-server` (Debian/Ubuntu) / `conda install -c conda-forge redis-server`; "
                "or use a running server ([redis] url or $COSMOS_REDIS_URL)"
            )
        if appendfsync not in ("always", "everysec", "no"):
            raise ValueError(f"appendfsync = {appendfsync!r}; redis-server takes 'always', 'everysec' or 'no'")
        self.port = port or free_port()
        self.start_timeout_s = start_timeout_s
        self.extra_args = extra_args
        self.persistent = persistent
        self.appendfsync = appendfsync
        self._owns_dir = data_dir is None
        self.data_dir = Path(tempfile.mkdtemp(prefix="cp-redis-")) if data_dir is None else Path(data_dir)
        self._proc: subprocess.Popen[bytes] | None = None
        self._pid: int | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._pid if self._proc is not None else None

    def _ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def start(self) -> RedisServer:
        if self.running:
            return self
        self.stop()  # reap a server that died (SIGKILL, crash) before starting its successor
        self.data_dir.mkdir(parents=True, exist_ok=True)
        persistence = (["--appendonly", "yes", "--appendfsync", self.appendfsync] if self.persistent
                       else ["--appendonly", "no"])
        server = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", *persistence,
                  "--maxmemory-policy", "noeviction", "--dir", str(self.data_dir), "--protected-mode", "yes",
                  *self.extra_args]
        self._proc = subprocess.Popen(["sh", "-c", _SUPERVISOR, *server], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._pid = int(self._proc.stdout.readline())
        _LIVE.add(self)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode(errors="replace") if self._proc.stderr else ""
                self.stop()
                raise RuntimeError(f"redis-server exited at start (port {self.port}): {err.strip()}")
            if self._ping():
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not answer PING on port {self.port} within {self.start_timeout_s}s")

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.stdin.close()  # the supervisor stops the server, and sh exits with it
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid, signal.SIGKILL)
            self._proc.kill()
            self._proc.wait(timeout=10)
        for pipe in (self._proc.stdout, self._proc.stderr):
            pipe.close()
        self._proc = None
        _LIVE.discard(self)

    def restart(self, down_s: float = 0.0) -> None:
        """Stop, optionally stay down ``down_s`` seconds, and start again on the same port."""
        self.stop()
        if down_s:
            time.sleep(down_s)
        self.start()

    def close(self) -> None:
        """Stop the server; remove its data folder unless it was given as ``data_dir``."""
        self.stop()
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
