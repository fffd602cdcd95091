"""The run secret: what proves that a message on the run's Redis or a weight-store connection comes
from a job of this run.

Every job of a run (trainer and rollout jobs) reads the same secret, from ``$COSMOS_RUN_SECRET`` or
from the file named by ``$COSMOS_RUN_SECRET_FILE`` (never from the command line, where ``ps`` and
job logs show it). Messages that jobs act on (the weight server's record, transfer requests, bucket
digests, the stop flag) travel as :class:`SignedMessage`: the body, a timestamp, a random nonce
and ``HMAC-SHA256(secret, purpose | timestamp | nonce | body)``. ``purpose`` names the message
kind and the key it lives under, so a valid message cannot be moved to another key or run; the
timestamp bounds how long a captured message stays valid; one-shot messages (transfer requests)
are also remembered by nonce for that long (:class:`ReplayGuard`), so each is acted on at most once.

A message that fails these checks is dropped, with a log line at most every few seconds
(:class:`RateLimitedLog`), so a flood of forged messages neither acts nor fills the logs.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import threading
import time
from collections import OrderedDict

import msgspec
import numpy as np

SECRET_ENV = "COSMOS_RUN_SECRET"
SECRET_FILE_ENV = "COSMOS_RUN_SECRET_FILE"
MIN_SECRET_BYTES = 16
DEFAULT_MAX_AGE_S = 300.0  # clock skew between hosts plus a message's time in Redis


class RunSecretError(ValueError):
    """No usable run secret (unset, empty, too short, or its file unreadable)."""


class AuthError(ValueError):
    """A message or connection failed authentication (bad MAC, wrong purpose, too old, replayed)."""


def _xor(a: bytes, b: bytes) -> bytes:
    """Byte-wise XOR of two byte strings of one length."""
    return (np.frombuffer(a, dtype=np.uint8) ^ np.frombuffer(b, dtype=np.uint8)).tobytes()


class RunSecret:
    """The run's shared key. ``repr`` and ``str`` never show it.

    Args:
        key: at least 16 bytes (e.g. ``secrets.token_hex(32)``).
    """

    __slots__ = ("_key",)

    def __init__(self, key: bytes | str) -> None:
        raw = key.encode() if isinstance(key, str) else bytes(key)
        raw = raw.strip()
        if len(raw) < MIN_SECRET_BYTES:
            raise RunSecretError(f"the run secret must be at least {MIN_SECRET_BYTES} bytes, got {len(raw)}; "
                                 f"make one with: python -c 'import secrets; print(secrets.token_hex(32))'")
        self._key = raw

    @classmethod
    def generate(cls) -> RunSecret:
        """A fresh random secret (tests, or a launcher that hands it to every job through the environment)."""
        return cls(secrets.token_hex(32))

    @classmethod
    def from_env(cls, *, required: bool = True) -> RunSecret | None:
        """The secret from ``$COSMOS_RUN_SECRET``, else from the file ``$COSMOS_RUN_SECRET_FILE`` names.

        Raises:
            RunSecretError: neither is set (when ``required``), the file cannot be read, or the
                secret is too short; the message names the variable and the file.
        """
        value = os.environ.get(SECRET_ENV, "")
        if value:
            return cls._checked(value, f"${SECRET_ENV}")
        path = os.environ.get(SECRET_FILE_ENV, "")
        if path:
            try:
                with open(path, "rb") as f:
                    data = f.read(4096)
            except OSError as exc:
                raise RunSecretError(f"cannot read the run secret file {path!r} (${SECRET_FILE_ENV}): {exc}") from exc
            return cls._checked(data, f"file {path!r} (${SECRET_FILE_ENV})")
        if not required:
            return None
        raise RunSecretError(
            f"no run secret: set ${SECRET_ENV} or put it in a file readable only by you and set ${SECRET_FILE_ENV} to "
            "its path, the same for every job of the run (e.g. python -c 'import secrets; "
            "print(secrets.token_hex(32))' > ~/.cosmos_run_secret; chmod 600 ~/.cosmos_run_secret)")

    @classmethod
    def _checked(cls, value: bytes | str, where: str) -> RunSecret:
        try:
            return cls(value)
        except RunSecretError as exc:
            raise RunSecretError(f"{where}: {exc}") from None

    @classmethod
    def resolve(cls, secret: RunSecret | bytes | str | None) -> RunSecret:
        """``secret`` as a :class:`RunSecret`; ``None``: :meth:`from_env` (required)."""
        if isinstance(secret, RunSecret):
            return secret
        if secret is None:
            found = cls.from_env(required=True)
            assert found is not None
            return found
        return cls(secret)

    def mac(self, *parts: bytes) -> bytes:
        """HMAC-SHA256 over ``parts``, each length-prefixed (so that no two part lists collide)."""
        h = hmac.new(self._key, digestmod=hashlib.sha256)
        for part in parts:
            h.update(len(part).to_bytes(8, "big"))
            h.update(part)
        return h.digest()

    def keystream(self, purpose: bytes, nonce: bytes, length: int) -> bytes:
        """``length`` pseudo-random bytes from the key, ``purpose`` and ``nonce``: SHAKE-256 of the three,
        each length-prefixed, used as an extendable-output PRF (a stream cipher's keystream). Never
        reuse a nonce for one purpose: :meth:`seal` draws 16 random bytes each time."""
        xof = hashlib.shake_256()
        for part in (self._key, purpose, nonce):
            xof.update(len(part).to_bytes(8, "big"))
            xof.update(part)
        return xof.digest(length)

    def seal(self, purpose: bytes, context: bytes, body: bytes) -> bytes:
        """``body`` encrypted then MACed: ``nonce (16) | HMAC-SHA256(purpose, context, nonce, ciphertext)
        (32) | ciphertext``, the ciphertext ``body`` XOR :meth:`keystream`. Only a holder of the key
        reads it (:meth:`unseal`); ``context`` (e.g. the stream's name) binds it to one place."""
        nonce = secrets.token_bytes(16)
        cipher = _xor(body, self.keystream(purpose, nonce, len(body)))
        return nonce + self.mac(purpose, context, nonce, cipher) + cipher

    def unseal(self, purpose: bytes, context: bytes, sealed: bytes) -> bytes | None:
        """The body :meth:`seal` sealed for ``purpose`` and ``context``; None when the MAC does not match
        (another key, another context, altered or truncated bytes)."""
        if len(sealed) < 48:
            return None
        nonce, mac, cipher = sealed[:16], sealed[16:48], sealed[48:]
        if not hmac.compare_digest(mac, self.mac(purpose, context, nonce, cipher)):
            return None
        return _xor(cipher, self.keystream(purpose, nonce, len(cipher)))

    def sign(self, purpose: str, body: bytes, *, now: float | None = None) -> bytes:
        """``body`` wrapped as an encoded :class:`SignedMessage` for ``purpose``."""
        ts = time.time() if now is None else now
        nonce = secrets.token_hex(16)
        mac = self.mac(purpose.encode(), repr(ts).encode(), nonce.encode(), body)
        return msgspec.json.encode(SignedMessage(body=body.decode(), ts=ts, nonce=nonce, mac=mac.hex()))

    def open(self, purpose: str, raw: bytes | str, *, max_age_s: float | None = DEFAULT_MAX_AGE_S,
             guard: ReplayGuard | None = None) -> bytes:
        """The body of a message :meth:`sign` made for ``purpose``.

        Args:
            max_age_s: reject messages signed longer ago than this, or this far in the future
                (``None``: no bound, for state that lives as long as the run, e.g. the stop flag).
            guard: reject a nonce seen before (one-shot messages).

        Raises:
            AuthError: not a signed message, a MAC that does not match (another secret, another
                purpose, an altered body), too old, or replayed.
        """
        try:
            msg = msgspec.json.decode(raw, type=SignedMessage)
            body = msg.body.encode()
            expected = self.mac(purpose.encode(), repr(msg.ts).encode(), msg.nonce.encode(), body)
            given = bytes.fromhex(msg.mac)
        except (msgspec.DecodeError, ValueError, UnicodeError) as exc:
            raise AuthError(f"not a signed message ({exc})") from None
        if not hmac.compare_digest(expected, given):
            raise AuthError("bad MAC (another run secret, or an altered or moved message)")
        if max_age_s is not None and abs(time.time() - msg.ts) > max_age_s:
            raise AuthError(f"signed {time.time() - msg.ts:.0f}s ago, outside the {max_age_s:.0f}s window")
        if guard is not None and not guard.first_time(msg.nonce, msg.ts):
            raise AuthError("replayed (nonce seen before)")
        return body

    def __repr__(self) -> str:
        return "RunSecret(***)"

    __str__ = __repr__

    def __reduce__(self) -> tuple:
        raise TypeError("a RunSecret is not pickled (it would land in checkpoints or logs); pass it through "
                        f"${SECRET_ENV} / ${SECRET_FILE_ENV}")


class SignedMessage(msgspec.Struct):
    """What a signed message looks like on Redis (JSON): ``body`` (UTF-8 text, often JSON itself),
    ``ts`` (Unix seconds), ``nonce`` (32 hex digits), ``mac`` (64 hex digits)."""

    body: str
    ts: float
    nonce: str
    mac: str


class ReplayGuard:
    """Nonces seen within ``window_s`` (with a bound on how many are kept; the oldest go first)."""

    def __init__(self, window_s: float = DEFAULT_MAX_AGE_S, max_entries: int = 100_000) -> None:
        self.window_s, self.max_entries = window_s, max_entries
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def first_time(self, nonce: str, ts: float) -> bool:
        now = time.time()
        with self._lock:
            while self._seen and (len(self._seen) >= self.max_entries
                                  or next(iter(self._seen.values())) < now - 2 * self.window_s):
                self._seen.popitem(last=False)
            if nonce in self._seen:
                return False
            self._seen[nonce] = now
            return True


class RateLimitedLog:
    """At most one log line per ``interval_s`` per kind; the next line says how many were held back."""

    def __init__(self, logger: logging.Logger, interval_s: float = 10.0) -> None:
        self._log, self.interval_s = logger, interval_s
        self._next: dict[str, float] = {}
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()
        self.lines = 0

    def warning(self, kind: str, msg: str, *args: object) -> None:
        now = time.monotonic()
        with self._lock:
            if now < self._next.get(kind, 0.0):
                self._held[kind] = self._held.get(kind, 0) + 1
                return
            held = self._held.pop(kind, 0)
            self._next[kind] = now + self.interval_s
            self.lines += 1
        suffix = f" ({held} more like this in the last {self.interval_s:.0f}s not logged)" if held else ""
        self._log.warning(msg + suffix, *args)
