"""Start ``python -m cosmos_primitives.rewards.server`` as a child process (examples, tests, demos).

The token travels in the child's environment (not on its command line). The child binds a free
port unless one is given and reports it on its first stdout line, which :meth:`start` waits for.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from cosmos_primitives.rewards.remote_protocol import ENQUEUE_PATH, ENV_TOKEN, FETCH_PATH
from cosmos_primitives.rewards.server import READY_LINE

_LIVE: set[RewardServerProcess] = set()


@atexit.register
def _stop_all() -> None:
    for proc in list(_LIVE):
        proc.stop()


class RewardServerProcess:
    """The reference reward server in a child process; a context manager.

    Args:
        token: the bearer token (passed as ``REMOTE_REWARD_TOKEN``); None with ``insecure_no_token``.
        host, port: where the child listens (``port=0``: a free port, read back from ``url``).
        rewards: ``"[name=]module:function"`` specs hosted beside the built-ins (the module must be
            importable in the child: see ``env`` / ``PYTHONPATH``).
        args: more command-line arguments (``["--max-pending", "4"]``).
        env: extra environment variables for the child.
        start_timeout_s: how long to wait for the ready line.

    Attributes:
        url / enqueue_url / fetch_url: where to send requests once started.
        log_path: the child's stdout + stderr (in a temporary folder removed when the ``with`` block ends).
    """

    def __init__(
        self,
        token: str | None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        rewards: Sequence[str] = (),
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        insecure_no_token: bool = False,
        start_timeout_s: float = 30.0,
    ) -> None:
        self.token = token
        self.host = host
        self.port = port
        self.start_timeout_s = start_timeout_s
        self._cmd = [sys.executable, "-m", "cosmos_primitives.rewards.server", "--host", host, "--port", str(port)]
        for spec in rewards:
            self._cmd += ["--reward", spec]
        if insecure_no_token:
            self._cmd.append("--insecure-no-token")
        self._cmd += list(args)
        self._env = {**os.environ, **(env or {})}
        self._env.pop(ENV_TOKEN, None)
        if token:
            self._env[ENV_TOKEN] = token
        self._env.setdefault("PYTHONUNBUFFERED", "1")
        self._dir = Path(tempfile.mkdtemp(prefix="cp-reward-server-"))
        self.log_path = self._dir / "server.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    @property
    def enqueue_url(self) -> str:
        return self.url + ENQUEUE_PATH

    @property
    def fetch_url(self) -> str:
        return self.url + FETCH_PATH

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def start(self) -> RewardServerProcess:
        """Start the child and wait until it listens. Raises ``RuntimeError`` with its log otherwise."""
        if self.running:
            return self
        with open(self.log_path, "wb") as log_file:
            self._proc = subprocess.Popen(self._cmd, stdout=log_file, stderr=subprocess.STDOUT, env=self._env)
        _LIVE.add(self)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            for line in self.log_text().splitlines():
                if line.startswith(READY_LINE):
                    self.url = line[len(READY_LINE):].split()[0]
                    self.port = int(self.url.rsplit(":", 1)[1])
                    return self
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self.stop()
                raise RuntimeError(f"reward server exited at start with code {code}:\n{self.log_text()}")
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"reward server did not report listening within {self.start_timeout_s}s:\n{self.log_text()}")

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout_s``. Returns the exit code (None if never started)."""
        if self._proc is None:
            return None
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=timeout_s)
        _LIVE.discard(self)
        return self._proc.returncode

    def kill(self) -> None:
        """SIGKILL at once (a crashed server, for tests)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=10)
        _LIVE.discard(self)

    def __enter__(self) -> RewardServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)
