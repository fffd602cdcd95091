"""A real ``redis-server`` on a free loopback port, started and stopped by tests."""

from __future__ import annotations

import atexit
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from cosmos_primitives.parallel.distributed import free_port

_LIVE: set[RedisServer] = set()


def live_servers() -> list[RedisServer]:
    """Servers started in this process and not stopped yet."""
    return [s for s in _LIVE if s.running]


@atexit.register
def _stop_all() -> None:
    for server in list(_LIVE):
        server.close()


class RedisServer:
    """Start ``redis-server`` on 127.0.0.1 (no persistence) and stop it again.

    Usable as a context manager. :meth:`restart` stops and starts it on the same port, for
    reconnect tests. ``url`` is ``redis://127.0.0.1:<port>/0``.

    Raises:
        RuntimeError: ``redis-server`` is not on PATH (with the command to install it) or did not
            answer PING within ``start_timeout_s``.
    """

    def __init__(self, port: int | None = None, start_timeout_s: float = 10.0,
                 extra_args: tuple[str, ...] = ()) -> None:
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            raise RuntimeError(
                "redis-server is not installed: run scripts/setup.sh as root, or "
                "`apt-get install redis-server` (Debian/Ubuntu) / `conda install -c conda-forge redis-server`"
            )
        self.port = port or free_port()
        self.start_timeout_s = start_timeout_s
        self.extra_args = extra_args
        self._dir = Path(tempfile.mkdtemp(prefix="cp-redis-"))
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

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
        cmd = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(self._dir), "--protected-mode", "yes", *self.extra_args,
        ]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _LIVE.add(self)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode(errors="replace") if self._proc.stderr else ""
                raise RuntimeError(f"redis-server exited at start (port {self.port}): {err.strip()}")
            if self._ping():
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not answer PING on port {self.port} within {self.start_timeout_s}s")

    def stop(self) -> None:
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
        if self._proc.stderr:
            self._proc.stderr.close()
        self._proc = None
        _LIVE.discard(self)

    def restart(self, down_s: float = 0.0) -> None:
        """Stop, optionally stay down ``down_s`` seconds, and start again on the same port."""
        self.stop()
        if down_s:
            time.sleep(down_s)
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
