"""What the weight server and its clients say to each other through Redis.

Keys, under the run's prefix (e.g. ``cosmos:myrun``):

- ``<prefix>:weights:server``: the serving trainer's record (msgspec JSON of :class:`ServerRecord`:
  session id, store address, backend ``"gloo"`` / ``"nccl"``, newest version on offer), written at each publish and
  renewed by the server's heartbeat with an expiry, so it vanishes a few heartbeats after the
  trainer dies;
- ``<prefix>:weights:requests:<session>``: a list of :class:`TransferRequest` (member id and the
  nonce of its current pair); one entry per ``fetch()``. Requests name a session, so a restarted
  trainer never serves (or waits for) a request meant for its predecessor.
"""

from __future__ import annotations

import msgspec


class WeightTransferError(RuntimeError):
    """A weight transfer between jobs failed (no trainer serves, the trainer closed or died, the
    pair timed out). The next ``fetch()`` forms a new transfer group."""


class ServerRecord(msgspec.Struct):
    """The serving trainer: where its store listens and what it offers."""

    session: str
    host: str
    port: int
    backend: str
    version: int
    pid: int
    hostname: str


class TransferRequest(msgspec.Struct):
    """One fetch: ``member`` asks for the newest snapshot over the pair formed under ``nonce``."""

    member: str
    nonce: str


def server_key(prefix: str) -> str:
    return f"{prefix}:weights:server"


def requests_key(prefix: str, session: str) -> str:
    return f"{prefix}:weights:requests:{session}"


def decode_record(raw: bytes | str | None) -> ServerRecord | None:
    """The record stored under :func:`server_key`, or ``None`` when there is none."""
    if raw is None:
        return None
    return msgspec.json.decode(raw, type=ServerRecord)
