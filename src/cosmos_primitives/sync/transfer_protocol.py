"""What the weight server and its clients say to each other through Redis.

Keys, under the run's prefix (e.g. ``cosmos:myrun``):

- ``<prefix>:weights:server``: the serving trainer's record (msgspec JSON of :class:`ServerRecord`:
  session id, store address, backend ``"gloo"`` / ``"nccl"``, newest version on offer), written at each publish and
  renewed by the server's heartbeat with an expiry, so it vanishes a few heartbeats after the
  trainer dies;
- ``<prefix>:weights:requests:<session>``: a list of :class:`TransferRequest` (member id and the
  nonce of its current pair); one entry per ``fetch()``. Requests name a session, so a restarted
  trainer never serves (or waits for) a request meant for its predecessor;
- ``<prefix>:weights:digests:<session>:<version>``: the SHA-256 of each bucket of that snapshot
  (:class:`SnapshotDigests`); a member checks every bucket against it before loading the bucket.

Every value is a :class:`~cosmos_primitives.sync.run_auth.SignedMessage` (HMAC-SHA256 with the run
secret, bound to its key by the purpose, with a timestamp; requests also by nonce, each served at
most once). Anything else under those keys is ignored.
"""

from __future__ import annotations

import msgspec

from cosmos_primitives.sync.run_auth import DEFAULT_MAX_AGE_S, RunSecret


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
    """One fetch: ``member`` asks for the newest snapshot; ``nonce`` names this fetch (its presence
    and assignment keys in the trainer's store). ``fresh``: the member lacks the plan (its first
    fetch, or its last one broke off), so its round carries the plan and the checked transfer."""

    member: str
    nonce: str
    fresh: bool = False


class SnapshotDigests(msgspec.Struct):
    """SHA-256 (hex) of each bucket of the snapshot at ``version``: ``buckets[b]`` for bucket ``b``
    (empty for an unused bucket)."""

    version: int
    buckets: list[str]


def digests_key(prefix: str, session: str, version: int) -> str:
    return f"{prefix}:weights:digests:{session}:{version}"


def server_key(prefix: str) -> str:
    return f"{prefix}:weights:server"


def requests_key(prefix: str, session: str) -> str:
    return f"{prefix}:weights:requests:{session}"


def decode_record(raw: bytes | str | None, secret: RunSecret, prefix: str,
                  max_age_s: float = DEFAULT_MAX_AGE_S) -> ServerRecord | None:
    """The record stored under :func:`server_key`, or ``None`` when there is none.

    Raises:
        AuthError: it was not signed with the run secret for this prefix, or too long ago.
        msgspec.DecodeError: signed, but not a record (a bug, not an attack).
    """
    if raw is None:
        return None
    body = secret.open(server_key(prefix), raw, max_age_s=max_age_s)
    return msgspec.json.decode(body, type=ServerRecord)
