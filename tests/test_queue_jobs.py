"""The job registry against a real redis-server: join, heartbeat, expiry of a silent job, leave, the
heartbeat thread (which survives its own failures), and joining again after dropping out."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from cosmos_primitives.config import run_stream
from cosmos_primitives.queue import JobRegistry, RedisServer
from cosmos_primitives.queue.job_registry import RunInUseError, refuse_live_trainer

RUN = run_stream("jobs-test")


def _server_time(client) -> float:
    seconds, micros = client.time()
    return seconds + micros / 1e6


def test_join_lists_the_job_with_its_fields_and_heartbeat_updates_them(redis_url: str) -> None:
    registry = JobRegistry(redis_url, RUN)
    client = registry._link.client
    before = _server_time(client)
    trainer = registry.join("trainer", weight_version=0)
    rollout = registry.join("rollout", job_id="rollout-a", weight_version=0, records_put=0)
    assert trainer.startswith(f"trainer-{socket.gethostname()}-{os.getpid()}-")
    live = registry.live()
    after = _server_time(client)
    assert set(live) == {trainer, "rollout-a"}
    job = live["rollout-a"]
    assert (job["role"], job["host"], job["pid"]) == ("rollout", socket.gethostname(), os.getpid())
    assert job["records_put"] == 0
    assert job["started"] == job["last_seen"] and before <= job["last_seen"] <= after
    assert 0 <= job["age_s"] <= after - job["last_seen"]
    time.sleep(0.05)
    registry.heartbeat(rollout, weight_version=3, records_put=16)
    job = registry.live()["rollout-a"]
    assert (job["weight_version"], job["records_put"]) == (3, 16)
    assert job["last_seen"] > job["started"]
    assert set(registry.live(role="rollout")) == {"rollout-a"}
    registry.close()


def test_age_is_measured_from_the_last_heartbeat_not_the_join(redis_url: str) -> None:
    registry = JobRegistry(redis_url, RUN, ttl_s=60)
    client = registry._link.client
    job = registry.join("trainer", job_id="old-timer")
    now = _server_time(client)
    client.hset(registry.job_key(job), mapping={"started": f"{now - 100:.6f}", "last_seen": f"{now - 7.25:.6f}"})
    age = registry.live()[job]["age_s"]
    assert 7.25 <= age <= 7.25 + (_server_time(client) - now)
    registry.close()


def test_a_job_that_stops_heartbeating_drops_out_and_leave_is_at_once(redis_url: str) -> None:
    """The silent job's key is made to run out by hand (its ttl went by; no race with the clock); a
    heartbeat gives the beating job the whole ttl again."""
    registry = JobRegistry(redis_url, RUN, ttl_s=60)
    client = registry._link.client
    silent = registry.join("rollout")
    beating = registry.join("rollout")
    leaving = registry.join("trainer")
    registry.leave(leaving)
    assert set(registry.live()) == {silent, beating}
    client.pexpire(registry.job_key(silent), 1)
    client.pexpire(registry.job_key(beating), 1000)
    registry.heartbeat(beating)
    assert 59_000 < client.pttl(registry.job_key(beating)) <= 60_000
    deadline = time.monotonic() + 10
    while client.exists(registry.job_key(silent)):
        assert time.monotonic() < deadline, "redis never expired the silent job's key"
        time.sleep(0.01)
    assert set(registry.live()) == {beating}
    assert client.smembers(registry.index_key) == {beating.encode()}  # the expired id was pruned
    registry.close()


def test_the_heartbeat_thread_keeps_a_job_alive_with_fresh_fields_and_survives_failures(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Rounds every 0.05 s under a 60 s ttl: the test waits for the rounds, whenever they come."""
    registry = JobRegistry(redis_url, RUN, ttl_s=60)
    client = registry._link.client
    job = registry.join("rollout", records_put=0)
    calls = {"n": 0}

    def fields() -> dict:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("engine busy")
        return {"records_put": calls["n"]}

    with caplog.at_level(logging.WARNING, logger="cosmos.queue"):
        client.pexpire(registry.job_key(job), 1000)
        registry.start_heartbeat(job, fields, interval_s=0.05)
        deadline = time.monotonic() + 10
        while registry.live().get(job, {}).get("records_put", 0) < 3:
            assert time.monotonic() < deadline, f"no third heartbeat in 10 s: {registry.live()}"
            time.sleep(0.02)
    assert client.pttl(registry.job_key(job)) > 50_000  # each beat gave the key the whole ttl again
    assert any("heartbeat of job" in r.message and "engine busy" in r.message for r in caplog.records)
    with pytest.raises(ValueError, match="already heartbeats"):
        registry.start_heartbeat(job)
    registry.leave(job)
    time.sleep(0.25)  # five rounds' time: a thread still running would have re-created the key
    assert registry.live() == {}
    registry.close()


def test_a_job_that_dropped_out_joins_again_on_its_next_heartbeat(redis_url: str,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    registry = JobRegistry(redis_url, RUN, ttl_s=0.2)
    job = registry.join("rollout", job_id="slow", weight_version=1, records_put=0)
    time.sleep(0.3)
    assert registry.live() == {}
    with caplog.at_level(logging.WARNING, logger="cosmos.queue"):
        registry.heartbeat(job, weight_version=2, records_put=8)
    back = registry.live()["slow"]
    # the beat's fields win over those it joined with
    assert (back["role"], back["weight_version"], back["records_put"], registry.rejoins) == ("rollout", 2, 8, 1)
    registry.heartbeat(job, records_put=9)  # and are kept by the next beat, which finds the key
    back = registry.live()["slow"]
    assert (back["weight_version"], back["records_put"], registry.rejoins) == (2, 9, 1)
    assert "joined again" in caplog.text
    other = JobRegistry(redis_url, RUN, ttl_s=0.2)  # another object never joined it: it cannot rebuild the job
    time.sleep(0.3)
    with pytest.raises(ValueError, match=r"'slow' is not registered.*join it again"):
        other.heartbeat("slow")


def test_joining_an_id_again_starts_it_afresh_with_only_the_new_fields(redis_url: str) -> None:
    registry = JobRegistry(redis_url, RUN, ttl_s=60)
    registry.join("trainer", job_id="restarted", weight_version=7, step=120)
    first = registry.live()["restarted"]
    time.sleep(0.01)
    registry.join("trainer", job_id="restarted", weight_version=0)  # the job's new process
    again = registry.live()["restarted"]
    assert again["weight_version"] == 0 and "step" not in again
    assert again["started"] == again["last_seen"] > first["started"]
    registry.close()


def test_bad_names_are_refused(redis_url: str) -> None:
    registry = JobRegistry(redis_url, RUN)
    with pytest.raises(ValueError, match="role"):
        registry.join("")
    with pytest.raises(ValueError, match="without whitespace"):
        registry.join("rollout", job_id="a b")
    with pytest.raises(ValueError, match="ttl_s"):
        JobRegistry(redis_url, RUN, ttl_s=0)


_JOB = """
import sys, time
from cosmos_primitives.queue.job_registry import JobRegistry
registry = JobRegistry(sys.argv[1], sys.argv[2], ttl_s=0.5)
job = registry.join("rollout", job_id="doomed", records_put=0)
registry.start_heartbeat(job, lambda: {"records_put": 7})
print("joined", flush=True)
time.sleep(600)
"""


def test_a_sigkilled_job_drops_out_after_its_ttl(redis_url: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _JOB, redis_url, RUN], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "joined"
        registry = JobRegistry(redis_url, RUN)
        time.sleep(0.7)  # past one ttl: only the heartbeat thread keeps it listed
        assert registry.live()["doomed"]["records_put"] == 7
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        time.sleep(0.7)
        assert registry.live() == {}
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_heartbeats_outlive_a_redis_restart_without_persistence(caplog: pytest.LogCaptureFixture) -> None:
    with RedisServer(persistent=False) as server, caplog.at_level(logging.WARNING, logger="cosmos.queue"):
        registry = JobRegistry(server.url, RUN, ttl_s=0.6)
        job = registry.join("trainer", step=1)
        registry.start_heartbeat(job, lambda: {"step": 2}, interval_s=0.1)
        server.restart(down_s=0.5)  # the server forgets every key
        time.sleep(0.5)
        live = registry.live()
        assert live[job]["role"] == "trainer" and live[job]["step"] == 2
        assert registry.rejoins >= 1
        registry.close()


def test_a_live_trainer_refuses_a_fresh_start_naming_the_run_and_the_trainer(redis_url: str) -> None:
    registry = JobRegistry(redis_url, RUN, ttl_s=0.5)
    refuse_live_trainer(registry)  # nobody holds the run
    registry.join("rollout", job_id="r1")  # a rollout job alone does not hold it
    refuse_live_trainer(registry)
    registry.join("trainer", job_id="trainer-live", ranks=1)
    with pytest.raises(RunInUseError, match=rf"run '{RUN}' is held by the live trainer job trainer-live \(host "
                       r".*--force"):
        refuse_live_trainer(registry)
    time.sleep(0.7)  # its heartbeat expired (a SIGKILLed trainer): the run may be started afresh
    refuse_live_trainer(registry)
    registry.close()


def test_a_resume_waits_for_a_killed_trainers_heartbeat_to_expire_then_goes_on(redis_url: str) -> None:
    """Issue 30 item 5: a trainer resumed right after a SIGKILL sees the killed one live for heartbeat_ttl_s;
    it waits for the key to expire, and refuses a trainer that keeps beating."""
    registry = JobRegistry(redis_url, RUN, ttl_s=0.6)
    registry.join("trainer", job_id="killed")  # never beats again
    t0 = time.monotonic()
    refuse_live_trainer(registry, action="resume the run", wait_s=5.0, poll_s=0.05)
    assert 0.3 < time.monotonic() - t0 < 3.0
    registry.join("trainer", job_id="alive")
    registry.start_heartbeat("alive", interval_s=0.1)
    with pytest.raises(RunInUseError, match=r"cannot resume the run: .* held by the live trainer job alive"):
        refuse_live_trainer(registry, action="resume the run", wait_s=1.0, poll_s=0.05)
    registry.close()
