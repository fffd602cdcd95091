"""The live jobs of a disaggregated run, by heartbeat: a job is alive while its Redis key has not expired.

Keys (``P`` = the run's prefix, its stream name): ``P:jobs:<job id>`` a hash of the job's fields
(JSON values), expiring ``ttl_s`` after the last heartbeat; ``P:jobs`` the set of job ids, pruned
of expired ones when read. Times (``started``, ``last_seen``) come from the Redis server's clock.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

from cosmos_primitives.config.redis import RedisConfig
from cosmos_primitives.queue.periodic import Periodic
from cosmos_primitives.queue.redis_link import RedisLink
from cosmos_primitives.sync.run_auth import RateLimitedLog, RunSecret

log = logging.getLogger("cosmos.queue")

# KEYS[1] the job's hash, KEYS[2] the set of job ids. ARGV[1] ttl (ms), ARGV[2] 'join' or 'beat',
# ARGV[3] job id, ARGV[4..] field / JSON value pairs. A beat for a job whose key expired does
# nothing and returns 0 (the caller joins again); otherwise sets the fields and last_seen
# (started too on join), restarts the TTL and returns 1.
_BEAT = """
if ARGV[2] == 'beat' and redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local t = redis.call('TIME')
local now = string.format('%d.%06d', tonumber(t[1]), tonumber(t[2]))
if ARGV[2] == 'join' then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'started', now)
end
redis.call('HSET', KEYS[1], 'last_seen', now)
for i = 4, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('SADD', KEYS[2], ARGV[3])
return 1
"""

# the fields the Lua script sets itself, and the MAC over the others (not part of what it signs)
_SERVER_FIELDS = ("started", "last_seen")
MAC_FIELD = "mac"


def _fields_mac(secret: RunSecret, key: str, fields: dict[str, Any]) -> str:
    """``HMAC(secret, "job" | key | canonical JSON of fields)``, hex: binds a job's fields to its key."""
    body = json.dumps({k: v for k, v in fields.items() if k not in (*_SERVER_FIELDS, MAC_FIELD)},
                      sort_keys=True, separators=(",", ":")).encode()
    return secret.mac(b"job", key.encode(), body).hex()


# KEYS[1] the set of job ids. ARGV[1] the prefix of the jobs' hashes.
# Drops ids whose hash expired; returns {server time (s), {id, flat hash}...}.
_LIVE = """
local t = redis.call('TIME')
local out = {string.format('%d.%06d', tonumber(t[1]), tonumber(t[2]))}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local fields = redis.call('HGETALL', ARGV[1] .. id)
  if #fields == 0 then
    redis.call('SREM', KEYS[1], id)
  else
    out[#out + 1] = {id, fields}
  end
end
return out
"""


def jobs_key(prefix: str) -> str:
    """The set of job ids of the run whose stream is ``prefix``."""
    return f"{prefix}:jobs"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_live_jobs(client: Any, prefix: str, role: str | None = None, secret: RunSecret | None = None,
                   forged: list[str] | None = None) -> tuple[float, dict[str, dict[str, Any]]]:
    """``(server time, {job id: fields})`` of the live jobs under ``prefix`` read with a redis-py client.

    Fields are JSON-decoded and include ``role``, ``host``, ``pid``, ``started``, ``last_seen``
    (Unix seconds, server clock) and ``age_s`` (seconds since the last heartbeat). With ``secret``,
    an entry whose fields are not signed with it (written by someone holding only the Redis URL, or
    altered) is left out, and its id appended to ``forged``.
    """
    reply = client.register_script(_LIVE)(keys=[jobs_key(prefix)], args=[f"{jobs_key(prefix)}:"])
    now = float(_text(reply[0]))
    out: dict[str, dict[str, Any]] = {}
    for raw_id, flat in reply[1:]:
        fields: dict[str, Any] = {}
        for i in range(0, len(flat), 2):
            text = _text(flat[i + 1])
            try:
                fields[_text(flat[i])] = json.loads(text)
            except ValueError:  # written by something other than JobRegistry: show it as it is
                fields[_text(flat[i])] = text
        job_key = f"{jobs_key(prefix)}:{_text(raw_id)}"
        if secret is not None and not hmac.compare_digest(str(fields.get(MAC_FIELD, "")),
                                                          _fields_mac(secret, job_key, fields)):
            if forged is not None:
                forged.append(_text(raw_id))
            continue
        fields.pop(MAC_FIELD, None)
        if role is not None and fields.get("role") != role:
            continue
        fields["age_s"] = max(0.0, now - float(fields.get("last_seen", now)))
        out[_text(raw_id)] = fields
    return now, out


def clear_jobs(client: Any, prefix: str) -> int:
    """Delete every job key of the run under ``prefix`` and its set of ids; returns how many keys existed."""
    index = jobs_key(prefix)
    ids = [_text(i) for i in client.smembers(index)]
    return int(client.delete(index, *(f"{index}:{i}" for i in ids)))


def _check_job_id(job_id: str) -> None:
    if not job_id or any(ch.isspace() for ch in job_id):
        raise ValueError(f"job id {job_id!r} must be non-empty and without whitespace")


class JobRegistry:
    """Live jobs of a run, by heartbeat: a job is alive while its key has not expired.

    A trainer or rollout job joins once, then heartbeats (by hand or from :meth:`start_heartbeat`'s
    daemon thread) with whatever it wants others to see (``weight_version``, ``records_put``, ...);
    a job that stops heartbeating (SIGKILL, lost node) drops out of :meth:`live` ``ttl_s`` later.
    A heartbeat that finds its key expired (the job stalled past ``ttl_s``, or the run was cleared)
    joins again with the fields of the first join and logs a warning.

    Args:
        redis_url: the run's Redis (empty: ``$COSMOS_REDIS_URL``).
        prefix: the run's stream name (:func:`~cosmos_primitives.config.run_stream`).
        ttl_s: seconds a job stays alive after its last heartbeat.
        config: ``[redis]`` for the reconnect and socket settings.
        secret: the run secret (default: from ``$COSMOS_RUN_SECRET`` / ``$COSMOS_RUN_SECRET_FILE``
            when set). With it each job's fields carry an HMAC bound to the job's key, and
            :meth:`live` leaves out entries not signed with it (a forged live trainer, altered fields),
            with a rate-limited warning. Deleting entries remains possible to a Redis-URL holder.
    """

    def __init__(self, redis_url: str, prefix: str, *, ttl_s: float = 15.0, config: RedisConfig | None = None,
                 secret: RunSecret | str | None = None) -> None:
        if not ttl_s > 0:
            raise ValueError(f"JobRegistry ttl_s = {ttl_s} must be > 0 (seconds)")
        if not prefix:
            raise ValueError("JobRegistry prefix is empty (use the run's stream name, cp.config.run_stream(run))")
        self.prefix = prefix
        self.ttl_s = float(ttl_s)
        self.index_key = jobs_key(prefix)
        self._link = RedisLink(redis_url, config)
        self.safe_url = self._link.safe_url
        self._beat = self._link.client.register_script(_BEAT)
        self._joined: dict[str, dict[str, Any]] = {}  # job id -> the fields it joined with
        self._beaters: dict[str, Periodic] = {}
        self._secret = RunSecret.resolve(secret) if secret is not None else RunSecret.from_env(required=False)
        self._forged_log = RateLimitedLog(log)
        self.rejoins = 0

    def job_key(self, job_id: str) -> str:
        return f"{self.index_key}:{job_id}"

    def _write(self, mode: str, job_id: str, fields: dict[str, Any]) -> bool:
        args: list[Any] = [max(1, round(1000 * self.ttl_s)), mode, job_id]
        if self._secret is not None:  # a beat then carries every field, so the MAC covers what is stored
            fields = {**self._joined.get(job_id, {}), **fields} if mode == "beat" else fields
            fields = {**fields, MAC_FIELD: _fields_mac(self._secret, self.job_key(job_id), fields)}
        for name, value in fields.items():
            args += [name, json.dumps(value)]
        return bool(self._link.call(f"{mode} job {job_id}", lambda: self._beat(
            keys=[self.job_key(job_id), self.index_key], args=args)))

    def join(self, role: str, *, job_id: str | None = None, **fields: Any) -> str:
        """Register a job of ``role`` (``"trainer"``, ``"rollout"``, ...) with ``fields``; returns its id,
        by default ``<role>-<host>-<pid>-<4 hex>``. Joining an id again starts it afresh."""
        if not role or any(ch.isspace() for ch in role):
            raise ValueError(f"job role {role!r} must be non-empty and without whitespace")
        host = socket.gethostname()
        job_id = job_id or f"{role}-{host}-{os.getpid()}-{uuid.uuid4().hex[:4]}"
        _check_job_id(job_id)
        base = {**fields, "role": role, "host": host, "pid": os.getpid()}
        self._write("join", job_id, base)
        self._joined[job_id] = base
        return job_id

    def heartbeat(self, job_id: str, **fields: Any) -> None:
        """Restart the job's TTL and update ``fields``.

        Raises:
            ValueError: the job's key expired and this object did not join it (nothing to join again with).
        """
        if self._write("beat", job_id, fields):
            if job_id in self._joined:
                self._joined[job_id] = {**self._joined[job_id], **fields}
            return
        base = self._joined.get(job_id)
        if base is None:
            raise ValueError(f"job {job_id!r} is not registered under {self.index_key!r} at {self.safe_url} (it "
                             f"left, or missed heartbeats for ttl_s = {self.ttl_s}s): join it again")
        self._joined[job_id] = base = {**base, **fields}
        self.rejoins += 1
        log.warning("job %s had dropped out of the live jobs of %s (no heartbeat for %ss, or the run was "
                    "cleared); joined again", job_id, self.prefix, self.ttl_s)
        self._write("join", job_id, base)

    def start_heartbeat(self, job_id: str, fields: Callable[[], dict] | None = None,
                        interval_s: float | None = None) -> None:
        """Heartbeat ``job_id`` from a daemon thread every ``interval_s`` (default ``ttl_s / 3``), with the
        fields ``fields()`` returns then. A failure there (Redis away, ``fields`` raising) is logged and
        tried again next round; it never stops the job. Until :meth:`leave` or :meth:`close`."""
        if job_id in self._beaters:
            raise ValueError(f"job {job_id!r} already heartbeats from this JobRegistry")
        self._beaters[job_id] = Periodic(
            f"heartbeat of job {job_id}", self.ttl_s / 3 if interval_s is None else interval_s,
            lambda: self.heartbeat(job_id, **(fields() if fields is not None else {})))

    def _stop_heartbeat(self, job_id: str) -> None:
        beater = self._beaters.pop(job_id, None)
        if beater is not None:
            beater.stop()

    def leave(self, job_id: str) -> None:
        """Stop heartbeating ``job_id`` and remove it from the live jobs at once."""
        self._stop_heartbeat(job_id)
        self._joined.pop(job_id, None)
        key = self.job_key(job_id)
        self._link.call(f"leave job {job_id}", lambda: self._link.client.pipeline()
                        .delete(key).srem(self.index_key, job_id).execute())

    def live(self, role: str | None = None) -> dict[str, dict[str, Any]]:
        """Job id -> fields of every live job (of ``role`` if given): the heartbeat fields plus ``role``,
        ``host``, ``pid``, ``started`` and ``last_seen`` (Unix seconds, Redis server clock) and
        ``age_s`` (seconds since the last heartbeat)."""
        forged: list[str] = []
        live = self._link.call("list live jobs", lambda: read_live_jobs(self._link.client, self.prefix, role,
                                                                        self._secret, forged))[1]
        if forged:
            self._forged_log.warning("jobs", "ignoring job entries %s under %r: not signed with this run's secret",
                                     sorted(forged), self.index_key)
        return live

    def close(self) -> None:
        """Stop every heartbeat thread and close the connection; joined jobs expire ``ttl_s`` later."""
        for job_id in list(self._beaters):
            self._stop_heartbeat(job_id)
        self._link.close()

    def __enter__(self) -> JobRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RunInUseError(RuntimeError):
    """A fresh start would clear a run that a live trainer job still holds."""


def refuse_live_trainer(registry: JobRegistry, *, action: str = "start a fresh run", wait_s: float = 0.0,
                        poll_s: float = 0.5) -> None:
    """Raise :class:`RunInUseError` when a trainer job of ``registry``'s run is live (its heartbeat key has
    not expired), naming the run, each live trainer (id, host, pid, seconds since its last beat) and the
    ways out. With ``wait_s`` it first waits up to that long (seconds) for the live trainers to drop
    out: a SIGKILLed trainer's key expires ``heartbeat_ttl_s`` after its last beat, so a resume
    started right after the kill waits for it instead of failing.

    A second trainer that cleared the keys of a live run would wipe its queue, claims and trained ids,
    and both would then share one consumer group and overwrite each other's weight versions.
    """
    deadline = time.monotonic() + wait_s
    live, prefix = registry.live("trainer"), registry.prefix
    if live and wait_s > 0:
        log.warning("run %s is held by the live trainer job(s) %s; waiting up to %.0fs for them to drop out "
                    "(a killed trainer's heartbeat key expires)", prefix, sorted(live), wait_s)
    while live and time.monotonic() < deadline:
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
        live = registry.live("trainer")
    if not live:
        return
    who = "; ".join(f"{job_id} (host {f.get('host', '?')}, pid {f.get('pid', '?')}, last heartbeat "
                    f"{f['age_s']:.1f}s ago)" for job_id, f in sorted(live.items()))
    raise RunInUseError(
        f"cannot {action}: run {prefix!r} is held by the live trainer job {who}. Give this run another --run "
        "name, stop that trainer first (its key expires [disaggregated] heartbeat_ttl_s after its last "
        "heartbeat), resume it with train.resume=true, or pass --force to clear it anyway")
