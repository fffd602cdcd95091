"""``python -m cosmos_primitives.queue.status``: what a disaggregated run looks like in Redis right now.

    python -m cosmos_primitives.queue.status --redis redis://host:6379/0 --run NAME [--json]

Prints the live jobs (id, role, host, pid, weight version and its lag behind the published one,
records put, seconds since the last heartbeat), the queue depth (records waiting, of them delivered
to a trainer and not acknowledged), the trained count (records dropped as stale, returned untrained
or rolled back by a resume counted apart), the published weight version, the prompt
claims position and the dead letters (count and the last few reasons). Exit status: 0 shown, 1
nothing is stored under the run, 2 Redis unreachable or a bad URL (the message names the URL,
password redacted).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import redis

from cosmos_primitives.config.redis import RUN_STREAM_PREFIX, run_stream
from cosmos_primitives.config.secrets import redact_url
from cosmos_primitives.queue.job_registry import jobs_key, read_live_jobs
from cosmos_primitives.queue.prompt_claims import claim_keys, read_position, stored_int
from cosmos_primitives.queue.redis_queue import REDIS_URL_ENV, resolve_redis_url


def _signed_body(raw: Any) -> str:
    """The body of a value the trainer signed with the run secret (the stop flag, the weight version),
    or the value itself when it is not signed. This command holds no secret: it does not verify."""
    text = _text(raw)
    try:
        message = json.loads(text)
    except ValueError:
        return text
    if isinstance(message, dict) and {"body", "mac"} <= message.keys():
        return str(message["body"])
    return text


def _stop_reason(raw: Any) -> str:
    """The stop flag's reason, marked "(signed)" when the trainer signed it (not verified here)."""
    body = _signed_body(raw)
    return f"{body} (signed)" if body != _text(raw) else body


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _groups(client: redis.Redis, stream: str) -> list[dict[str, Any]]:
    try:
        groups = client.xinfo_groups(stream)
    except redis.exceptions.ResponseError:  # no stream yet
        return []
    out = []
    for group in groups:
        info = {_text(k): v for k, v in group.items()}
        out.append({"name": _text(info.get("name", "")), "consumers": int(info.get("consumers") or 0),
                    "pending": int(info.get("pending") or 0),
                    "undelivered": None if info.get("lag") is None else int(info["lag"])})
    return out


def other_runs(client: redis.Redis, limit: int = 20) -> list[str]:
    """Up to ``limit`` run names whose stream (``cosmos:<name>``) exists on the server."""
    names = []
    for key in client.scan_iter(match=f"{RUN_STREAM_PREFIX}*", _type="STREAM", count=1000):
        name = _text(key)[len(RUN_STREAM_PREFIX):]
        if not name.endswith(":dead"):  # a run's dead letters, also a stream
            names.append(name)
        if len(names) >= limit:
            break
    return sorted(names)


def collect_status(client: redis.Redis, stream: str, dead: int = 5) -> dict[str, Any]:
    """Everything ``status`` shows about the run whose stream is ``stream``, as a JSON-ready dict.

    ``exists`` is False when none of the run's keys is there.
    """
    claims = read_position(client, stream)
    _, jobs = read_live_jobs(client, stream)
    version = client.get(f"{stream}:weight_version")
    stop = client.get(f"{stream}:stop")
    stats = {_text(k): stored_int(v, f"{stream}:stats", _text(k)) for k, v in client.hgetall(f"{stream}:stats").items()}
    dead_key = f"{stream}:dead"
    last_dead = []
    for entry_id, fields in client.xrevrange(dead_key, count=dead) if dead > 0 else []:
        row = {_text(k): _text(v) for k, v in fields.items() if k in (b"entry_id", b"reason", b"consumer")}
        last_dead.append({"id": _text(entry_id), **row})
    keys = (stream, f"{stream}:done", dead_key, f"{stream}:weight_version", f"{stream}:stop",
            f"{stream}:producers", jobs_key(stream), claim_keys(stream)["meta"])
    return {
        "stream": stream,
        "exists": bool(client.exists(*keys)),
        "jobs": jobs,
        "queue": {
            "depth": int(client.xlen(stream)) if client.exists(stream) else 0,
            "groups": _groups(client, stream),
            # S:done holds every consumed id: those dropped as stale were acknowledged untrained
            "trained": max(0, int(client.zcard(f"{stream}:done")) - stats.get("dropped_stale", 0)),
            "dropped_stale": stats.get("dropped_stale", 0),
            "returned": stats.get("returned", 0),
            "rolled_back": stats.get("rolled_back", 0),
            "double_acked": stats.get("double_acked", 0),
        },
        "weight_version": None if version is None else stored_int(_signed_body(version), f"{stream}:weight_version"),
        "stop_requested": None if stop is None else _stop_reason(stop),
        "claims": claims,
        "dead_letters": {"count": int(client.xlen(dead_key)) if client.exists(dead_key) else 0, "last": last_dead},
    }


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def _lag(published: Any, held: Any) -> int | None:
    """Versions a job is behind the published one, when both are known."""
    if isinstance(published, int) and isinstance(held, int) and not isinstance(held, bool):
        return published - held
    return None


def format_status(status: dict[str, Any], safe_url: str) -> str:
    """The human-readable report of :func:`collect_status`'s dict."""
    lines = [f"run stream {status['stream']} at {safe_url}"]
    jobs = status["jobs"]
    lines.append(f"live jobs: {len(jobs)}")
    if jobs:
        header = ("id", "role", "host", "pid", "weights", "lag", "records put", "last beat")
        rows = [header] + [
            (job_id, _cell(f.get("role")), _cell(f.get("host")), _cell(f.get("pid")), _cell(f.get("weight_version")),
             _cell(_lag(status["weight_version"], f.get("weight_version"))), _cell(f.get("records_put")),
             f"{f['age_s']:.1f}s ago")
            for job_id, f in sorted(jobs.items(), key=lambda item: (str(item[1].get("role")), item[0]))]
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    queue = status["queue"]
    groups = ", ".join(f"group {g['name']}: {g['pending']} delivered and not acknowledged"
                       + (f", {g['undelivered']} not delivered yet" if g["undelivered"] is not None else "")
                       + f", {g['consumers']} consumers" for g in queue["groups"]) or "no consumer group yet"
    lines.append(f"queue: {queue['depth']} records waiting ({groups})")
    lines.append(f"trained: {queue['trained']} records (trained twice: {queue['double_acked']}); dropped as stale, "
                 f"not trained: {queue['dropped_stale']}; returned untrained for generation again: "
                 f"{queue['returned']}; rolled back by a resume: {queue['rolled_back']}")
    lines.append(f"weight version: {_cell(status['weight_version'])}")
    if status["stop_requested"] is not None:
        lines.append(f"stop requested: {status['stop_requested']}")
    claims = status["claims"]
    if claims is None:
        lines.append("claims: none (no rollout job claimed prompts)")
    else:
        lines.append(
            f"claims: epoch {claims['epoch']}: {claims['range_in_epoch']} of {claims['ranges_per_epoch']} ranges "
            f"handed out (next range id {claims['next_range']}; {claims['range_size']} prompts each, dataset of "
            f"{claims['dataset_size']}); {claims['in_flight']} in flight ({claims['expired']} expired or released); "
            f"{claims['completed']} completed, {claims['late_completes']} completed late, "
            f"{claims['reissued']} re-issued, {claims['released']} released, {claims.get('requeued', 0)} handed "
            "out again for lost records")
    dead = status["dead_letters"]
    lines.append(f"dead letters: {dead['count']}")
    lines += [f"  {d['id']} ({d.get('consumer', '?')}): {d.get('reason', '?')}" for d in dead["last"]]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m cosmos_primitives.queue.status",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--redis", default=None, help=f"Redis URL (default ${REDIS_URL_ENV})")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--run", help=f"run name (its stream is {RUN_STREAM_PREFIX}NAME)")
    which.add_argument("--stream", help="the run's stream name ([redis] stream), instead of --run")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--dead", type=int, default=5, help="how many of the newest dead letters to show (default 5)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        url = resolve_redis_url(args.redis)
        stream = args.stream or run_stream(args.run)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    safe_url = redact_url(url)
    client = redis.Redis.from_url(url, protocol=2, socket_connect_timeout=3, socket_timeout=10)
    try:
        status = collect_status(client, stream, dead=args.dead)
        runs = [] if status["exists"] else other_runs(client)
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        print(f"error: cannot read Redis at {safe_url} ({type(exc).__name__}: {str(exc).rstrip('.')}); check that "
              f"redis-server runs there and the URL is right (--redis URL or ${REDIS_URL_ENV})", file=sys.stderr)
        return 2
    except redis.exceptions.RedisError as exc:  # reachable, but it refused a command (auth, ACL, a key of another type)
        print(f"error: Redis at {safe_url} refused to show run stream {stream} ({type(exc).__name__}: "
              f"{str(exc).rstrip('.')}); check the URL's password / user, or whether {stream} belongs to another "
              "program", file=sys.stderr)
        return 2
    except ValueError as exc:  # a value under the run's keys that no part of this library writes
        print(f"error: run stream {stream} at {safe_url}: {exc}", file=sys.stderr)
        return 2
    finally:
        client.close()
    status["url"] = safe_url
    if args.json:
        print(json.dumps(status if status["exists"] else {**status, "other_runs": runs}, indent=1, sort_keys=True))
    elif status["exists"]:
        print(format_status(status, safe_url))
    else:
        known = f"; runs there: {', '.join(runs)}" if runs else "; no run streams there"
        print(f"nothing is there for stream {stream} at {safe_url}{known}")
    return 0 if status["exists"] else 1


if __name__ == "__main__":
    sys.exit(main())
