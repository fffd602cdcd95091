"""Chaos run of the rollout queue: a producer process puts records (some twice, some poisoned) into
the private redis-server started with the settings the library ships (AOF, ``appendfsync always``),
while consumer processes train and acknowledge; consumers are SIGKILLed and respawned, and the
redis-server is SIGKILLed and restarted on its data folder, during the run.

At the end every record was trained exactly once (its id in ``S:done``, acknowledged once,
``double_acked`` 0 group-wide, and no consumer logged it twice) or, for the poison, is in the
dead-letter stream with a reason. A consumer killed after training but before ``ack`` does not
count: its training died with it, and the record goes to another consumer by claim.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import redis

import cosmos_primitives as cp

N_RECORDS = 300
TESTS = Path(__file__).parent

SETUP = r"""
import sys
from cosmos_primitives.config import RedisConfig
from cosmos_primitives.queue import RedisRolloutQueue
# claim_idle_s: above a consumer's longest stall on this loaded machine (a starved process that
# does not renew for that long loses its entries to another consumer, which is the documented bound)
cfg = RedisConfig(url=sys.argv[1], block_s=0.1, socket_timeout_s=2.0, claim_idle_s=2.0,
                  reconnect_timeout_s=30.0, reconnect_max_backoff_s=0.2, max_pending=64)
"""

PRODUCER = SETUP + r"""
import time
import redis
from test_queue_hostile import HOSTILE
from test_queue_redis import make_record

n = int(sys.argv[2])
poison = [(name, fields) for name, fields, _ in HOSTILE
          if name in ("nested 5000 deep", "empty conversation", "no record_id", "NaN log-prob", "not msgpack",
                      "no record field")]
raw = redis.Redis.from_url(sys.argv[1])

def put_raw(fields):
    deadline = time.monotonic() + 30
    while True:
        try:
            return raw.xadd(cfg.stream, fields)
        except redis.exceptions.ConnectionError:  # the server is down (or loading): the same retry as put()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)

queue = RedisRolloutQueue(cfg, consumer="producer")
for i in range(n):
    record = make_record(i)
    queue.put(record)
    if i % 37 == 0:
        queue.put(record)  # a duplicated put
    if i % 50 == 25:
        name, fields = poison.pop()
        put_raw({**fields, "tag": name})
    time.sleep(0.01)
for name, fields in poison:
    put_raw({**fields, "tag": name})
print("PRODUCED", flush=True)
"""

CONSUMER = SETUP + r"""
import time
log = open(sys.argv[3], "a")
queue = RedisRolloutQueue(cfg, consumer=sys.argv[2])
while True:
    batch = queue.get(8, timeout=0.3)
    time.sleep(0.02)  # the training step
    queue.ack(batch)
    log.write("".join(r.record_id + "\n" for r in batch))  # trained: written after the ack committed
    log.flush()
"""


def _env() -> dict[str, str]:
    """The test's environment, with this folder on the path (the scripts import the record builders)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}


class Consumers:
    def __init__(self, url: str, logs: Path) -> None:
        self.url, self.logs, self.spawned = url, logs, 0
        self.procs: list[subprocess.Popen] = []
        self.names: list[str] = []

    def spawn(self) -> None:
        name = f"consumer-{self.spawned}"
        self.spawned += 1
        with open(self.logs / f"{name}.err", "wb") as err:
            self.procs.append(subprocess.Popen([sys.executable, "-c", CONSUMER, self.url, name,
                                                str(self.logs / f"{name}.trained")],
                                               stdout=subprocess.DEVNULL, stderr=err, env=_env()))
        self.names.append(name)

    def kill(self, k: int) -> None:
        proc, name = self.procs.pop(k), self.names.pop(k)
        # it must not have died of an entry's content
        assert proc.poll() is None, (self.logs / f"{name}.err").read_text()[-3000:]
        proc.kill()
        proc.wait(10)

    def kill_all(self) -> None:
        while self.procs:
            self.kill(0)


@pytest.mark.slow
def test_sigkilled_consumers_and_redis_server_lose_nothing_and_train_each_record_once(tmp_path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    stream = "cosmos:rollouts"
    server = cp.queue.RedisServer(data_dir=tmp_path / "redis").start()  # the shipped settings: AOF, fsync always
    client = redis.Redis.from_url(server.url, retry_on_error=[redis.exceptions.ConnectionError])
    consumers = Consumers(server.url, logs)
    producer_err = open(logs / "producer.err", "wb")  # noqa: SIM115 - closed in finally
    producer = subprocess.Popen([sys.executable, "-c", PRODUCER, server.url, str(N_RECORDS)],
                                stdout=subprocess.PIPE, stderr=producer_err, env=_env())
    try:
        for _ in range(3):
            consumers.spawn()
        # each event when that many records were trained (the processes take seconds to start here)
        chaos = [(30, "consumer"), (60, "redis"), (100, "consumer"), (140, "redis"), (180, "consumer"),
                 (220, "redis")]
        deadline = time.monotonic() + 60
        for at, what in chaos:
            while client.zcard(f"{stream}:done") < at:
                assert time.monotonic() < deadline, f"fewer than {at} records trained in 60 s"
                time.sleep(0.02)
            assert producer.poll() is None, "the producer finished before the chaos ended; slow it down"
            if what == "consumer":
                consumers.kill(0)  # SIGKILL, possibly between its training and its ack
                consumers.spawn()
            else:
                os.kill(server.pid, signal.SIGKILL)
                time.sleep(0.3)
                server.restart()
        out, _ = producer.communicate(timeout=60)
        assert producer.returncode == 0 and b"PRODUCED" in out, (logs / "producer.err").read_text()[-3000:]

        expected = {f"rec-{i:04d}" for i in range(N_RECORDS)}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the survivors drain the stream, claimed entries included
            done = {m.decode() for m in client.zrange(f"{stream}:done", 0, -1)}
            if done >= expected and client.xlen(stream) == 0:
                break
            time.sleep(0.2)
        consumers.kill_all()

        assert sorted(expected - done) == [], "records lost"
        assert done == expected
        assert client.xlen(stream) == 0
        assert int(client.hget(f"{stream}:stats", "double_acked") or 0) == 0
        trained = Counter(line for log in logs.glob("*.trained") for line in log.read_text().split())
        assert [rid for rid, count in trained.items() if count > 1] == [], "trained twice"
        assert set(trained) <= done and len(trained) >= N_RECORDS - 3 * 8  # a killed consumer may not log its ack
        dead = client.xrange(f"{stream}:dead")
        tags = {fields[b"field:tag"].decode(): fields[b"reason"].decode() for _, fields in dead}
        assert sorted(tags) == sorted(["nested 5000 deep", "empty conversation", "no record_id", "NaN log-prob",
                                       "not msgpack", "no record field"])
        assert all(tags.values())
        assert consumers.spawned == 6
    finally:
        consumers.kill_all()
        if producer.poll() is None:
            producer.kill()
            producer.communicate()
        producer_err.close()
        client.close()
        server.close()
