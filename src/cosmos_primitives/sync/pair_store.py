"""The weight server's rendezvous store: a key-value store bound to one address, open only to jobs
that hold the run secret, with a bounded number of connections.

Transfer pairs form a gloo / NCCL process group over a ``torch.distributed.Store``. torch's
``TCPStore`` server listens on every interface whatever host it is given, lets anyone connect, and
slows down for every idle connection held open (1,000 of them made a fetch take 100 s). This store
replaces it:

- :class:`PairStoreServer` listens on exactly ``(host, port)`` (``socket.create_server``);
- each connection must answer a challenge with ``HMAC(run secret, ...)`` within
  ``auth_timeout_s``, and the server answers the client's challenge in turn (so a member does not
  form a pair through an impostor's store); connections that fail are closed at once;
- at most ``max_pending`` connections may be in the handshake (a new one evicts the oldest: a
  flood of idle connections cannot keep a real member out for more than one handshake) and at
  most ``max_connections`` may be authenticated;
- requests are length-prefixed msgpack frames of at most ``MAX_FRAME`` bytes.

The trainer's own pair threads use :class:`LocalPairStore`, a view of the server's table in the
same process (no socket, no file descriptor per pair); members use :class:`PairStoreClient`.
Both are ``torch.distributed.Store`` subclasses, so ``PrefixStore`` and the process-group
constructors take them.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import secrets
import socket
import struct
import threading
import time
from collections import OrderedDict
from datetime import timedelta
from typing import Any

import msgspec
import torch.distributed as dist

from cosmos_primitives.sync.run_auth import AuthError, RateLimitedLog, RunSecret

log = logging.getLogger(__name__)

MAGIC = b"CPS1"
CHALLENGE_BYTES = 32
MAC_BYTES = 32
MAX_FRAME = 1 << 20  # store values are process-group addresses and ids: bytes to kilobytes
_LEN = struct.Struct(">I")


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(n - got)
        if not chunk:
            raise ConnectionError("connection closed")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _send_frame(sock: socket.socket, obj: Any) -> None:
    data = msgspec.msgpack.encode(obj)
    sock.sendall(_LEN.pack(len(data)) + data)


def _recv_frame(sock: socket.socket) -> Any:
    (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if n > MAX_FRAME:
        raise ConnectionError(f"frame of {n} bytes exceeds {MAX_FRAME}")
    return msgspec.msgpack.decode(_recv_exact(sock, n))


class _Table:
    """The key-value table with blocking reads (shared by the server's connections and local views)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.cond = threading.Condition()

    def set(self, key: str, value: bytes) -> None:
        with self.cond:
            self.data[key] = value
            self.cond.notify_all()

    def get(self, key: str, timeout_s: float) -> bytes:
        with self.cond:
            if not self.cond.wait_for(lambda: key in self.data, timeout=timeout_s):
                raise TimeoutError(f"pair store: key {key!r} not set within {timeout_s:.0f}s")
            return self.data[key]

    def wait(self, keys: list[str], timeout_s: float) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: all(k in self.data for k in keys), timeout=timeout_s):
                raise TimeoutError(f"pair store: keys {keys} not all set within {timeout_s:.0f}s")

    def add(self, key: str, amount: int) -> int:
        with self.cond:
            value = int(self.data.get(key, b"0")) + amount
            self.data[key] = str(value).encode()
            self.cond.notify_all()
            return value

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        with self.cond:
            current = self.data.get(key)
            if (current is None and not expected) or current == expected:
                self.data[key] = desired
                self.cond.notify_all()
                return desired
            return current if current is not None else expected

    def check(self, keys: list[str]) -> bool:
        with self.cond:
            return all(k in self.data for k in keys)

    def delete(self, key: str) -> bool:
        with self.cond:
            return self.data.pop(key, None) is not None

    def delete_prefix(self, prefix: str) -> int:
        with self.cond:
            gone = [k for k in self.data if k.startswith(prefix)]
            for k in gone:
                del self.data[k]
            return len(gone)

    def num_keys(self) -> int:
        with self.cond:
            return len(self.data)


def _as_bytes(value: Any) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


class _TableStore(dist.Store):
    """A ``torch.distributed.Store`` whose operations go to ``_call(op, *args)``."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__()
        self._timeout_s = float(timeout_s)

    def _call(self, op: str, *args: Any) -> Any:
        raise NotImplementedError

    def set(self, key: str, value: Any) -> None:
        self._call("set", key, _as_bytes(value))

    def get(self, key: str) -> bytes:
        return self._call("get", key, self._timeout_s)

    def add(self, key: str, amount: int) -> int:
        return int(self._call("add", key, int(amount)))

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        return self._call("compare_set", key, _as_bytes(expected), _as_bytes(desired))

    def check(self, keys: list[str]) -> bool:
        return bool(self._call("check", list(keys)))

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        seconds = self._timeout_s if timeout is None else timeout.total_seconds()
        self._call("wait", list(keys), seconds)

    def delete_key(self, key: str) -> bool:
        return bool(self._call("delete", key))

    def num_keys(self) -> int:
        return int(self._call("num_keys"))

    def set_timeout(self, timeout: timedelta) -> None:
        self._timeout_s = timeout.total_seconds()


def _apply(table: _Table, op: str, args: list[Any]) -> Any:
    if op == "set":
        return table.set(str(args[0]), bytes(args[1]))
    if op == "get":
        return table.get(str(args[0]), float(args[1]))
    if op == "wait":
        return table.wait([str(k) for k in args[0]], float(args[1]))
    if op == "add":
        return table.add(str(args[0]), int(args[1]))
    if op == "compare_set":
        return table.compare_set(str(args[0]), bytes(args[1]), bytes(args[2]))
    if op == "check":
        return table.check([str(k) for k in args[0]])
    if op == "delete":
        return table.delete(str(args[0]))
    if op == "num_keys":
        return table.num_keys()
    raise ValueError(f"unknown pair store operation {op!r}")


class LocalPairStore(_TableStore):
    """The server's table, seen from the server's own process (the trainer's pair threads)."""

    def __init__(self, server: PairStoreServer, timeout_s: float) -> None:
        super().__init__(timeout_s)
        self._table = server.table

    def _call(self, op: str, *args: Any) -> Any:
        return _apply(self._table, op, list(args))


class PairStoreServer:
    """The authenticated store (see the module docstring).

    Args:
        host: the address to listen on (only this one; ``"0.0.0.0"`` for every interface, if you mean it).
        port: 0: a free one (read back from ``.port``).
        secret: the run secret.
        max_connections: authenticated connections at once (one per member forming a pair).
        max_pending: connections in the handshake at once (a new one evicts the oldest).
        auth_timeout_s: a connection that has not authenticated by then is closed.
    """

    def __init__(self, host: str, port: int, secret: RunSecret, *, max_connections: int = 256,
                 max_pending: int = 16, auth_timeout_s: float = 2.0) -> None:
        if min(max_connections, max_pending) < 1 or auth_timeout_s <= 0:
            raise ValueError(f"max_connections and max_pending must be >= 1 and auth_timeout_s > 0, got "
                             f"{max_connections}, {max_pending}, {auth_timeout_s}")
        self.host, self._secret = host, secret
        self.max_connections, self.max_pending, self.auth_timeout_s = max_connections, max_pending, auth_timeout_s
        self.table = _Table()
        self._lock = threading.Lock()
        self._pending: OrderedDict[int, socket.socket] = OrderedDict()
        self._authed: dict[int, socket.socket] = {}
        self._closed = False
        self.stats = {"auth_failures": 0, "evicted": 0, "refused": 0}
        self._warn = RateLimitedLog(log)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.create_server((host, port), family=family, backlog=128)
        self.port = int(self._sock.getsockname()[1])
        self._accepter = threading.Thread(target=self._accept_loop, name="pair-store-accept", daemon=True)
        self._accepter.start()

    @property
    def connections(self) -> tuple[int, int]:
        """(connections in the handshake, authenticated connections)."""
        with self._lock:
            return len(self._pending), len(self._authed)

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                if self._closed:
                    return
                time.sleep(0.05)  # e.g. EMFILE: let connections drain rather than spin
                continue
            with self._lock:
                while len(self._pending) >= self.max_pending:
                    _, oldest = self._pending.popitem(last=False)
                    self.stats["evicted"] += 1
                    with contextlib.suppress(OSError):
                        oldest.shutdown(socket.SHUT_RDWR)
                self._pending[id(conn)] = conn
            threading.Thread(target=self._serve, args=(conn,), name="pair-store-conn", daemon=True).start()

    def _handshake(self, conn: socket.socket) -> bool:
        """Whether the peer proved it holds the secret; False for a connection closed before a byte
        (a member's reachability probe: nothing to log)."""
        conn.settimeout(self.auth_timeout_s)
        challenge = secrets.token_bytes(CHALLENGE_BYTES)
        conn.sendall(MAGIC + challenge)
        first = conn.recv(1)
        if not first:
            return False
        reply = first + _recv_exact(conn, CHALLENGE_BYTES + MAC_BYTES - 1)
        theirs, mac = reply[:CHALLENGE_BYTES], reply[CHALLENGE_BYTES:]
        if not hmac.compare_digest(mac, self._secret.mac(b"pair-store-client", challenge, theirs)):
            raise AuthError("bad handshake MAC (no run secret, or another run's)")
        conn.sendall(self._secret.mac(b"pair-store-server", challenge, theirs))
        return True

    def _serve(self, conn: socket.socket) -> None:
        key = id(conn)
        try:
            try:
                if not self._handshake(conn):
                    return
            except (OSError, ConnectionError, AuthError) as exc:
                with self._lock:
                    self.stats["auth_failures"] += 1
                self._warn.warning("auth", "weight pair store on %s:%d: dropped a connection that did not "
                                   "authenticate (%s)", self.host, self.port, exc)
                return
            with self._lock:
                if self._pending.pop(key, None) is None:  # evicted while it answered
                    return
                if len(self._authed) >= self.max_connections:
                    self.stats["refused"] += 1
                    self._warn.warning("full", "weight pair store on %s:%d: refused an authenticated connection "
                                       "(%d open, the cap)", self.host, self.port, self.max_connections)
                    return
                self._authed[key] = conn
            conn.settimeout(None)
            while not self._closed:
                try:
                    op, args = _recv_frame(conn)
                except (OSError, ConnectionError, ValueError, msgspec.DecodeError):
                    return
                try:
                    reply = [True, _apply(self.table, str(op), list(args))]
                except Exception as exc:  # a timeout or a malformed request: the caller gets it
                    reply = [False, f"{type(exc).__name__}: {exc}"]
                _send_frame(conn, reply)
        except OSError:
            return
        finally:
            with self._lock:
                self._pending.pop(key, None)
                self._authed.pop(key, None)
            with contextlib.suppress(OSError):
                conn.close()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.close()
        with self._lock:
            conns = [*self._pending.values(), *self._authed.values()]
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class PairStoreClient(_TableStore):
    """A member's authenticated connection to the weight server's store.

    Raises (from the constructor):
        ConnectionError: nothing listens at ``host:port`` (refused at once), or the connection
            kept being closed before it authenticated until ``timeout_s`` ran out.
        AuthError: the server did not prove it holds the run secret.
    """

    def __init__(self, host: str, port: int, secret: RunSecret, timeout_s: float) -> None:
        super().__init__(timeout_s)
        self._secret = secret
        self._lock = threading.Lock()
        deadline = time.monotonic() + timeout_s
        attempt = 0
        while True:
            try:
                self._sock = self._connect(host, port, max(0.1, min(10.0, deadline - time.monotonic())))
                break
            except ConnectionRefusedError:
                raise
            except (OSError, ConnectionError) as exc:  # evicted or dropped by a store under a flood: try again
                attempt += 1
                if time.monotonic() >= deadline:
                    raise ConnectionError(f"could not authenticate to the weight pair store at {host}:{port} within "
                                          f"{timeout_s:.0f}s ({attempt} tries; last: {exc})") from exc
                time.sleep(min(0.05 * attempt, 0.5))

    def _connect(self, host: str, port: int, timeout_s: float) -> socket.socket:
        sock = socket.create_connection((host, port), timeout=timeout_s)
        try:
            head = _recv_exact(sock, len(MAGIC) + CHALLENGE_BYTES)
            if head[:len(MAGIC)] != MAGIC:
                raise AuthError(f"{host}:{port} is not a weight pair store")
            challenge, mine = head[len(MAGIC):], secrets.token_bytes(CHALLENGE_BYTES)
            sock.sendall(mine + self._secret.mac(b"pair-store-client", challenge, mine))
            proof = _recv_exact(sock, MAC_BYTES)
            if not hmac.compare_digest(proof, self._secret.mac(b"pair-store-server", challenge, mine)):
                raise AuthError(f"the store at {host}:{port} does not hold this run's secret")
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        return sock

    def _call(self, op: str, *args: Any) -> Any:
        with self._lock:
            # bound every reply: a blocking get / wait answers within its own timeout
            self._sock.settimeout(self._timeout_s + 10.0)
            _send_frame(self._sock, [op, list(args)])
            ok, value = _recv_frame(self._sock)
        if not ok:
            raise RuntimeError(f"weight pair store: {op} failed: {value}")
        return value

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()
