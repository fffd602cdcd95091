"""``python -m cosmos_primitives.queue.status`` as a subprocess against a real redis-server: a populated
run (jobs, queue depth, trained count, weight version, claims, dead letters), an unknown run, and an
unreachable server."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import redis

from cosmos_primitives.config import RedisConfig, run_stream
from cosmos_primitives.queue import JobRegistry, PromptClaims, RedisRolloutQueue
from test_queue_redis import make_record


def status(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cosmos_primitives.queue.status", *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **(env or {})})


def server_time(url: str) -> float:
    seconds, micros = redis.Redis.from_url(url).time()
    return seconds + micros / 1e6


def populate(url: str, stream: str) -> float:
    """4 records put and taken by a trainer, 1 trained; a malformed entry dead-lettered; version 3;
    a trainer and a rollout job, the rollout job's last beat 12.5 s and its join 100 s before the
    server time returned; 3 ranges claimed, 2 completed."""
    with RedisRolloutQueue(RedisConfig(stream=stream), url=url, consumer="trainer-0") as queue:
        redis.Redis.from_url(url).xadd(stream, {"junk": "not a record"})
        queue.put_many([make_record(i) for i in range(4)])
        records = queue.get(4, timeout=5)
        assert len(records) == 4
        queue.ack(records[:1])
        queue.publish_weight_version(3)
    registry = JobRegistry(url, stream, ttl_s=60)
    registry.join("trainer", job_id="trainer-x", weight_version=3)
    registry.join("rollout", job_id="rollout-1", weight_version=2, records_put=4)
    now = server_time(url)
    redis.Redis.from_url(url).hset(registry.job_key("rollout-1"),
                                   mapping={"started": f"{now - 100:.6f}", "last_seen": f"{now - 12.5:.6f}"})
    claims = PromptClaims(url, stream, dataset_size=10, range_size=2, seed=0)
    taken = [claims.claim("rollout-1") for _ in range(3)]
    assert claims.complete(taken[0]) and claims.complete(taken[1])
    return now


def test_status_shows_a_populated_run(redis_url: str) -> None:
    stream = run_stream("status-run")
    beat = populate(redis_url, stream)
    done = status("--redis", redis_url, "--run", "status-run", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["stream"] == stream and report["exists"]
    assert set(report["jobs"]) == {"trainer-x", "rollout-1"}
    rollout = report["jobs"]["rollout-1"]
    assert (rollout["role"], rollout["weight_version"], rollout["records_put"], rollout["pid"]) == (
        "rollout", 2, 4, os.getpid())
    # populate() dated rollout-1's last beat 12.5 s and its join 100 s before `beat` (server clock)
    assert 12.5 <= rollout["age_s"] <= 12.5 + (server_time(redis_url) - beat)
    queue = report["queue"]
    assert (queue["depth"], queue["trained"]) == (3, 1)
    assert [(g["name"], g["pending"], g["undelivered"]) for g in queue["groups"]] == [("trainer", 3, 0)]
    assert report["weight_version"] == 3
    claims = report["claims"]
    assert (claims["epoch"], claims["next_range"], claims["ranges_per_epoch"], claims["in_flight"],
            claims["completed"]) == (0, 3, 5, 1, 2)
    assert report["dead_letters"]["count"] == 1
    assert "no 'record' field" in report["dead_letters"]["last"][0]["reason"]

    text = status("--stream", stream, env={"COSMOS_REDIS_URL": redis_url})  # the URL from the environment
    assert text.returncode == 0, text.stderr
    shown = next(line for line in text.stdout.splitlines() if "rollout-1" in line).split()[-2]  # "<age>s ago"
    assert 12.5 <= float(shown.removesuffix("s")) <= 12.5 + (server_time(redis_url) - beat) + 0.05
    out = text.stdout
    assert f"run stream {stream} at {redis_url}" in out
    assert "live jobs: 2" in out
    row = next(line for line in out.splitlines() if "rollout-1" in line).split()
    assert row[:7] == ["rollout-1", "rollout", socket.gethostname(), str(os.getpid()), "2", "1", "4"]  # lag 3 - 2
    assert "queue: 3 records waiting (group trainer: 3 delivered and not acknowledged" in out
    assert "trained: 1 records" in out and "weight version: 3" in out
    assert "claims: epoch 0: 3 of 5 ranges handed out" in out and "1 in flight" in out and "2 completed" in out
    assert "dead letters: 1" in out and "no 'record' field" in out


def test_status_of_an_unknown_run_says_nothing_is_there(redis_url: str) -> None:
    done = status("--redis", redis_url, "--run", "nobody")
    assert done.returncode == 1
    assert f"nothing is there for stream cosmos:nobody at {redis_url}; no run streams there" in done.stdout
    populate(redis_url, run_stream("present"))
    done = status("--redis", redis_url, "--run", "nobody")
    assert done.returncode == 1 and "runs there: present" in done.stdout
    report = json.loads(status("--redis", redis_url, "--run", "nobody", "--json").stdout)
    assert (report["exists"], report["other_runs"], report["jobs"], report["claims"]) == (False, ["present"], {}, None)


def test_status_names_the_url_when_redis_is_unreachable() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    done = status("--redis", f"redis://:hunter2@127.0.0.1:{port}/0", "--run", "x")
    assert done.returncode == 2
    assert f"cannot read Redis at redis://:***@127.0.0.1:{port}/0" in done.stderr
    assert "hunter2" not in done.stderr + done.stdout
    done = status("--run", "x", env={"COSMOS_REDIS_URL": ""})
    assert done.returncode == 2 and "COSMOS_REDIS_URL" in done.stderr
    done = status("--redis", "http://localhost:6379", "--run", "x")
    assert done.returncode == 2 and "must start with redis://" in done.stderr
    done = status("--redis", "redis://127.0.0.1:6379/0", "--run", "two words")
    assert done.returncode == 2 and "without spaces" in done.stderr


def test_status_of_a_stream_name_used_by_another_program_says_so(redis_url: str) -> None:
    redis.Redis.from_url(redis_url).set("cosmos:clash", "not a stream")
    done = status("--redis", redis_url, "--run", "clash")
    assert done.returncode == 2
    assert f"Redis at {redis_url} refused to show run stream cosmos:clash (ResponseError: WRONGTYPE" in done.stderr


def test_status_counts_stale_drops_apart_from_trained_records(redis_url: str) -> None:
    """Issue 30 item 13: the trained count included the records dropped as stale (68 shown, 52 trained)."""
    stream = run_stream("status-stale")
    with RedisRolloutQueue(RedisConfig(stream=stream), url=redis_url, consumer="trainer-0") as queue:
        queue.put_many([make_record(i) for i in range(6)])
        records = queue.get(6, timeout=5)
        queue.ack(records[:3], step=1)
        queue.ack(records[3:5], dropped=True)  # over the staleness bound: consumed, not trained
        queue.return_records(records[5:])  # returned untrained, its prompt to be generated again
        assert queue.group_counters()["dropped_stale"] == 2
    done = status("--redis", redis_url, "--run", "status-stale", "--json")
    assert done.returncode == 0, done.stderr
    queue_report = json.loads(done.stdout)["queue"]
    assert (queue_report["trained"], queue_report["dropped_stale"], queue_report["returned"]) == (3, 2, 1)
    text = status("--redis", redis_url, "--run", "status-stale").stdout
    assert "trained: 3 records (trained twice: 0); dropped as stale, not trained: 2" in text, text


def test_garbage_under_a_runs_keys_is_a_clear_error_naming_the_key(redis_url: str, capsys) -> None:
    from cosmos_primitives.queue.status import main as status_main

    stream = run_stream("garbage-run")
    client = redis.Redis.from_url(redis_url)
    claims = PromptClaims(redis_url, stream, dataset_size=10, range_size=2, seed=0)
    claims.claim("rollout-1")
    cases = {  # key: (how to spoil it, what is restored afterwards)
        f"{stream}:claims:next": (lambda k: client.set(k, "garbage"), lambda k: client.set(k, 1)),
        f"{stream}:weight_version": (lambda k: client.set(k, "v3"), lambda k: client.delete(k)),
        f"{stream}:stats": (lambda k: client.hset(k, "double_acked", "many"), lambda k: client.delete(k)),
        f"{stream}:claims:meta": (lambda k: client.hset(k, "dataset_size", "ten"),
                                  lambda k: client.hset(k, "dataset_size", 10)),
    }
    for key, (spoil, restore) in cases.items():
        spoil(key)
        assert status_main(["--redis", redis_url, "--run", "garbage-run"]) == 2
        err = capsys.readouterr().err
        assert f"error: run stream {stream} at {redis_url}: key {key}" in err and "Traceback" not in err, err
        restore(key)
    assert status_main(["--redis", redis_url, "--run", "garbage-run"]) == 0

    client.set(f"{stream}:claims:next", "garbage")
    with pytest.raises(ValueError, match=rf"{stream}:claims.*not written by PromptClaims.*clear"):
        claims.claim("rollout-1")
    client.delete(f"{stream}:claims:next")
    client.zadd(f"{stream}:claims:deadlines", {"not-a-range": 0, "-3": 0})
    claim = claims.claim("rollout-2")  # the garbage is removed, counted, and never handed out
    assert claim is not None and claim.range_id >= 0
    assert client.zscore(f"{stream}:claims:deadlines", "not-a-range") is None
    assert claims.position()["garbage_removed"] == 2
    claims.close()


def test_a_signed_stop_flag_shows_its_reason(redis_url: str) -> None:
    """The trainer job signs the stop flag with the run secret: status prints its reason, not the JSON
    envelope around it."""
    from cosmos_primitives.queue.run_control import RunControl
    from cosmos_primitives.sync.run_auth import RunSecret

    stream = run_stream("status-signed-stop")
    with RedisRolloutQueue(RedisConfig(stream=stream), url=redis_url) as queue, \
            RunControl(queue, RunSecret("status-test-run-secret-" + "3" * 32)) as control:
        control.request_stop("trainer finished at step 7")
    done = status("--redis", redis_url, "--run", "status-signed-stop", "--json")
    assert json.loads(done.stdout)["stop_requested"] == "trainer finished at step 7 (signed)", done.stdout


def test_a_signed_weight_version_shows_its_number(redis_url: str) -> None:
    """With the run secret the trainer signs ``<stream>:weight_version``: status (which holds no
    secret) shows the number, not an error about a non-integer key."""
    from cosmos_primitives.sync.run_auth import RunSecret

    stream = run_stream("status-signed-version")
    with RedisRolloutQueue(RedisConfig(stream=stream), url=redis_url,
                           secret=RunSecret("status-test-run-secret-" + "3" * 32)) as queue:
        queue.publish_weight_version(5)
    done = status("--redis", redis_url, "--run", "status-signed-version", "--json")
    assert json.loads(done.stdout)["weight_version"] == 5, done.stdout + done.stderr


def test_the_status_command_and_the_queue_import_no_torch() -> None:
    """``status`` is an operator's quick look at a run: it (and a process that only moves records)
    reads Redis and must not pay torch's import (2-3 CPU-s) for it."""
    code = ("import sys, cosmos_primitives.queue.status, cosmos_primitives.queue.redis_queue; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
