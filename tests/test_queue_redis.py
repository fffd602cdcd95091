"""The rollout queue against a real redis-server (and the in-memory queue where the contract is shared):
ordering, acknowledgement, back-pressure, de-duplication, weight version, redelivery after SIGKILL,
renewal of a slow live consumer, Redis restarts, malformed entries, the reconnect bound."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import msgspec
import pytest
import redis

import cosmos_primitives as cp
from cosmos_primitives.config import RedisConfig, load_config, redact_url
from cosmos_primitives.queue import (
    InMemoryRolloutQueue,
    QueueConnectionError,
    QueueFullError,
    RedisRolloutQueue,
    RolloutQueue,
    RolloutRecord,
    encode_record,
    record_byte_limit,
    resolve_redis_url,
)


def make_record(i: int, version: int = 0) -> RolloutRecord:
    return RolloutRecord(
        record_id=f"rec-{i:04d}", prompt_id=f"p{i}", group_id=f"p{i}:g", weight_version=version,
        prompt_token_ids=[1, 2], completions=["A", "B"], completion_token_ids=[[7, 8], [9]],
        logprobs=[[-0.1, -0.2], [-0.3]], finish_reasons=["stop", "length"], rewards=[1.0, 0.0],
        advantages=[0.5, -0.5], media=["clips/a.mp4"],
        conversation=[{"role": "user", "content": [{"type": "video", "video": "clips/a.mp4"},
                                                   {"type": "text", "text": f"question {i}"}]}],
    )


def ids(records: list[RolloutRecord]) -> list[str]:
    return [r.record_id for r in records]


def fast_config(url: str, **kw) -> RedisConfig:
    return RedisConfig(url=url, **{"block_s": 0.1, "claim_idle_s": 30.0, "reconnect_timeout_s": 20.0, **kw})


@pytest.fixture(params=["memory", "redis"])
def make_queues(request):
    """``make(max_pending) -> (producer, consumer)``: one in-memory queue twice, or two Redis clients."""
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    created = []

    def make(max_pending: int = 64):
        if url is None:
            queue = InMemoryRolloutQueue(max_pending=max_pending)
            return queue, queue
        cfg = fast_config(url, max_pending=max_pending)
        pair = RedisRolloutQueue(cfg, consumer="rollout-0"), RedisRolloutQueue(cfg, consumer="trainer-0")
        created.extend(pair)
        return pair

    yield make
    for queue in created:
        queue.close()


# -- the shared contract -------------------------------------------------------------------------


def test_records_arrive_in_order_and_get_returns_what_there_is(make_queues) -> None:
    producer, consumer = make_queues()
    assert isinstance(producer, RolloutQueue) and isinstance(consumer, RolloutQueue)
    sent = [make_record(i) for i in range(12)]
    producer.put_many(sent[:7])
    for r in sent[7:]:
        producer.put(r)
    got = consumer.get(5, timeout=2) + consumer.get(5, timeout=2) + consumer.get(5, timeout=0.2)
    assert ids(got) == ids(sent)
    assert got[3] == sent[3]  # every field survives the trip
    assert consumer.get(3, timeout=0) == []


def test_ack_frees_records_and_rejects_unknown_ones(make_queues) -> None:
    producer, consumer = make_queues()
    producer.put_many([make_record(i) for i in range(3)])
    got = consumer.get(3, timeout=2)
    assert producer.pending() == 3  # delivered but not acknowledged still counts
    assert consumer.ack(got[:2]) == 2
    assert producer.pending() == 1
    with pytest.raises(ValueError, match=r"cannot acknowledge records \['rec-0000'\]"):
        consumer.ack(got[:1])
    with pytest.raises(ValueError, match="not delivered"):
        consumer.ack([make_record(99)])
    consumer.ack(got[2:])
    assert producer.pending() == 0
    assert consumer.metrics()["queue/acked"] == 3


def test_back_pressure_blocks_the_producer_until_acks_make_room(make_queues) -> None:
    producer, consumer = make_queues(max_pending=4)
    sent = [make_record(i) for i in range(10)]
    feeder = threading.Thread(target=producer.put_many, args=(sent,), kwargs={"timeout": 30})
    feeder.start()
    deadline = time.monotonic() + 10
    while producer.pending() < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    feeder.join(0.3)
    assert feeder.is_alive(), "the producer must wait at the bound"
    assert producer.pending() == 4  # nothing trimmed, nothing beyond the bound

    with pytest.raises(QueueFullError, match="max_pending"):
        producer.put(make_record(100), timeout=0.05)

    assert producer.metrics()["queue/put_wait_s"] > 0
    received = []
    while len(received) < 10:
        batch = consumer.get(2, timeout=5)
        assert batch, "the producer stalled"
        received += batch
        consumer.ack(batch)
    feeder.join(10)
    assert not feeder.is_alive()
    assert ids(received) == ids(sent)
    assert producer.pending() == 0


def test_a_record_is_delivered_once_even_if_put_twice(make_queues) -> None:
    producer, consumer = make_queues()
    twice = make_record(1)
    producer.put_many([twice, twice, make_record(2)])  # e.g. a put retried after a lost reply
    got = consumer.get(3, timeout=0.3)
    assert ids(got) == ["rec-0001", "rec-0002"]
    consumer.ack(got)
    assert producer.pending() == 0  # the second copy was acknowledged with the first
    producer.put(twice)  # a late copy of a trained record
    assert consumer.get(1, timeout=0.3) == []
    assert producer.pending() == 0
    assert consumer.metrics()["queue/duplicates_skipped"] == 2
    assert consumer.metrics()["queue/double_acked"] == 0


def test_weight_version_is_published_and_awaited(make_queues) -> None:
    producer, consumer = make_queues()
    assert producer.weight_version() is None
    consumer.publish_weight_version(5)
    assert producer.weight_version() == 5
    with pytest.raises(TimeoutError, match="weight version >= 6; the last published version is 5"):
        producer.wait_for_weight_version(6, timeout=0.1)
    timer = threading.Timer(0.1, consumer.publish_weight_version, args=(6,))
    timer.start()
    assert producer.wait_for_weight_version(6, timeout=10) == 6
    timer.join()


# -- Redis only --------------------------------------------------------------------------------


def test_producer_state_round_trips_and_a_fresh_stream_clears_it(redis_url: str) -> None:
    from cosmos_primitives.queue.run_control import RunControl

    cfg = fast_config(redis_url, stream="cp:test:producers")
    with RedisRolloutQueue(cfg) as writer, RedisRolloutQueue(cfg) as reader, RunControl(writer) as control:
        control.clear_stream()
        assert reader.producer_state("rollout0") is None
        writer.save_producer_state("rollout0", {"sampler": {"epoch": 1, "position": 6}, "batches": 4})
        writer.save_producer_state("rollout1", {"batches": 2})
        assert reader.producer_state("rollout0") == {"sampler": {"epoch": 1, "position": 6}, "batches": 4}
        writer.save_producer_state("rollout0", {"batches": 5})  # the latest save wins
        assert reader.producer_state("rollout0") == {"batches": 5}
        redis.Redis.from_url(redis_url).hset("cp:test:producers:producers", "rollout1", b"\x00not json")
        with pytest.raises(ValueError, match=r"field 'rollout1' .* not JSON"):
            reader.producer_state("rollout1")
        assert control.clear_stream() >= 1
        assert reader.producer_state("rollout0") is None

DOOMED_CONSUMER = r"""
import sys, time
from cosmos_primitives.config import RedisConfig
from cosmos_primitives.queue import RedisRolloutQueue

url, n_trained, n_held = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
queue = RedisRolloutQueue(RedisConfig(url=url, block_s=0.1, claim_idle_s=0.6), consumer="doomed")
trained = queue.get(n_trained, timeout=20)
queue.ack(trained)
held = queue.get(n_held, timeout=20)
print("TRAINED", *[r.record_id for r in trained], flush=True)
print("HELD", *[r.record_id for r in held], flush=True)
time.sleep(600)
"""


def test_records_of_a_sigkilled_consumer_are_redelivered_and_trained_exactly_once(redis_url) -> None:
    cfg = fast_config(redis_url, claim_idle_s=0.6)
    producer = RedisRolloutQueue(cfg, consumer="rollout")
    all_ids = [f"rec-{i:04d}" for i in range(30)]
    producer.put_many([make_record(i) for i in range(30)])

    proc = subprocess.Popen([sys.executable, "-c", DOOMED_CONSUMER, redis_url, "5", "7"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        trained_by_doomed = proc.stdout.readline().split()[1:]
        held_by_doomed = proc.stdout.readline().split()[1:]
        assert len(trained_by_doomed) == 5 and len(held_by_doomed) == 7, proc.stderr.read()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()

    survivors = [RedisRolloutQueue(cfg, consumer=f"trainer-{k}") for k in range(2)]
    trained: dict[str, list[str]] = {"doomed": trained_by_doomed, "trainer-0": [], "trainer-1": []}
    deadline = time.monotonic() + 20
    while sum(map(len, trained.values())) < 30 and time.monotonic() < deadline:
        for queue in survivors:
            batch = queue.get(4, timeout=0.2)
            trained[queue.consumer] += ids(batch)
            queue.ack(batch)

    counts = Counter(rid for per_consumer in trained.values() for rid in per_consumer)
    assert sorted(counts) == all_ids, "a record was lost"
    assert set(counts.values()) == {1}, f"trained twice: {[r for r, c in counts.items() if c > 1]}"
    assert set(held_by_doomed) <= set(trained["trainer-0"]) | set(trained["trainer-1"])
    assert sum(q.metrics()["queue/redelivered"] for q in survivors) == 7
    assert producer.pending() == 0
    for queue in [*survivors, producer]:
        queue.close()


def test_a_slow_live_consumer_keeps_its_records(redis_url) -> None:
    cfg = fast_config(redis_url, claim_idle_s=0.8)
    producer = RedisRolloutQueue(cfg)
    slow, other = RedisRolloutQueue(cfg, consumer="slow"), RedisRolloutQueue(cfg, consumer="other")
    producer.put_many([make_record(i) for i in range(3)])
    held = slow.get(3, timeout=2)
    stolen = []
    deadline = time.monotonic() + 2.0  # 2.5x claim_idle_s: a long training step
    while time.monotonic() < deadline:
        stolen += other.get(3, timeout=0.1)
    assert stolen == []
    assert slow.ack(held) == 3
    assert slow.metrics()["queue/double_acked"] == 0 and slow.metrics()["queue/lost_claims"] == 0
    for queue in (producer, slow, other):
        queue.close()


def test_malformed_entries_are_dead_lettered_and_the_trainer_loop_goes_on(redis_url) -> None:
    cfg = fast_config(redis_url)
    producer, trainer = RedisRolloutQueue(cfg), RedisRolloutQueue(cfg, consumer="trainer-0")
    raw = redis.Redis.from_url(redis_url)
    short = msgspec.to_builtins(make_record(50))
    short["advantages"] = [0.5]
    producer.put(make_record(1))
    bad_ids = [
        raw.xadd(cfg.stream, {"record": b"\xc1 not msgpack"}).decode(),
        raw.xadd(cfg.stream, {"payload": encode_record(make_record(51))}).decode(),
        raw.xadd(cfg.stream, {"record": msgspec.msgpack.encode(short)}).decode(),
    ]
    producer.put(make_record(2))

    trained = []
    for _ in range(3):  # a trainer loop: it must keep running through the bad entries
        batch = trainer.get(4, timeout=0.3)
        trained += ids(batch)
        trainer.ack(batch)
    assert trained == ["rec-0001", "rec-0002"]
    assert trainer.metrics()["queue/malformed"] == 3
    messages = [str(e) for e in trainer.rejected]
    assert [e.entry_id for e in trainer.rejected] == bad_ids
    assert "is not msgpack" in messages[0] and bad_ids[0] in messages[0]
    assert "no 'record' field (its fields: ['payload'])" in messages[1]
    assert "advantages has 1 entries but there are 2 completions" in messages[2]
    dead = trainer.dead_letters()
    assert sorted(d["entry_id"] for d in dead) == sorted(bad_ids)
    assert all(d["consumer"] == "trainer-0" and d["reason"] for d in dead)
    assert producer.pending() == 0  # the bad entries left the main stream
    raw.close()
    producer.close()
    trainer.close()


def test_restart_without_persistence_reconnects_and_carries_on() -> None:
    """Documented semantics: a server without AOF / RDB forgets its data. Clients reconnect, the
    trainer recreates its consumer group and republishes its weight version; records that were in
    the stream are gone, records put after the restart are trained."""
    with cp.queue.RedisServer(persistent=False) as server:
        restart_without_persistence(server)


def restart_without_persistence(own_redis_server) -> None:
    cfg = fast_config(own_redis_server.url)
    producer, trainer = RedisRolloutQueue(cfg), RedisRolloutQueue(cfg, consumer="trainer-0")
    trainer.publish_weight_version(3)
    producer.put_many([make_record(i) for i in range(3)])
    held = trainer.get(1, timeout=2)

    own_redis_server.restart(down_s=0.3)

    producer.put_many([make_record(i) for i in range(10, 13)])
    got = trainer.get(3, timeout=5)
    assert ids(got) == ["rec-0010", "rec-0011", "rec-0012"]
    assert trainer.ack(held + got) == 4  # acknowledging records from before the restart does not fail
    assert trainer.metrics()["queue/groups_recreated"] == 1
    assert trainer.metrics()["queue/reconnects"] >= 1 and producer.metrics()["queue/reconnects"] >= 1
    assert producer.weight_version() == 3  # republished by the trainer after it reconnected
    assert producer.pending() == 0
    producer.close()
    trainer.close()


def test_restart_mid_run_with_aof_loses_nothing_and_trains_each_record_once() -> None:
    total = 60
    with cp.queue.RedisServer() as server:  # AOF, appendfsync always: the defaults
        cfg = fast_config(server.url, max_pending=16)
        producer, trainer = RedisRolloutQueue(cfg), RedisRolloutQueue(cfg, consumer="trainer-0")

        def produce() -> None:
            for i in range(total):
                producer.put(make_record(i))
                time.sleep(0.005)

        feeder = threading.Thread(target=produce)
        feeder.start()
        trained: list[str] = []
        restarted = False
        deadline = time.monotonic() + 30
        while len(set(trained)) < total and time.monotonic() < deadline:
            batch = trainer.get(4, timeout=0.2)
            trained += ids(batch)
            trainer.ack(batch)
            if not restarted and len(trained) >= 20:
                producing_at_restart = feeder.is_alive()
                server.restart(down_s=0.3)
                restarted = True
        feeder.join(20)
        assert restarted and producing_at_restart and not feeder.is_alive()
        counts = Counter(trained)
        assert sorted(counts) == [f"rec-{i:04d}" for i in range(total)]
        assert set(counts.values()) == {1}
        assert trainer.metrics()["queue/reconnects"] >= 1
        assert trainer.metrics()["queue/groups_recreated"] == 0  # the group survived in the AOF
        producer.close()
        trainer.close()


def test_unreachable_redis_fails_past_the_bound_naming_the_url(own_redis_server) -> None:
    url = own_redis_server.url.replace("redis://", "redis://:s3cret@")
    queue = RedisRolloutQueue(fast_config(url, reconnect_timeout_s=0.3))
    own_redis_server.stop()
    with pytest.raises(QueueConnectionError) as info:
        queue.put(make_record(1))
    message = str(info.value)
    assert f"127.0.0.1:{own_redis_server.port}" in message and "reconnect_timeout_s = 0.3" in message
    assert "s3cret" not in message and ":***@" in message
    queue.close()


def test_url_comes_from_config_or_env(monkeypatch) -> None:
    monkeypatch.delenv("COSMOS_REDIS_URL", raising=False)
    with pytest.raises(ValueError, match="COSMOS_REDIS_URL"):
        resolve_redis_url(config=RedisConfig())
    monkeypatch.setenv("COSMOS_REDIS_URL", "redis://env-host:6380/1")
    assert resolve_redis_url(config=RedisConfig()) == "redis://env-host:6380/1"
    assert resolve_redis_url(config=RedisConfig(url="redis://cfg:6379/0")) == "redis://cfg:6379/0"
    with pytest.raises(ValueError, match="must start with redis://"):
        resolve_redis_url("http://x:1")
    assert redact_url("redis://user:pw@h:1/0") == "redis://user:***@h:1/0"
    with pytest.raises(ValueError, match=r"socket_timeout_s = 1\.0 must exceed block_s = 5\.0"):
        RedisRolloutQueue(RedisConfig(block_s=5.0, socket_timeout_s=1.0))


def test_queue_knobs_load_from_toml_overrides() -> None:
    cfg = load_config(overrides=["redis.max_pending=8", "redis.stream=run7:rollouts", "redis.claim_idle_s=120"])
    assert (cfg.redis.max_pending, cfg.redis.stream, cfg.redis.claim_idle_s) == (8, "run7:rollouts", 120.0)


def test_the_trainers_bounds_dead_letter_long_and_huge_records_at_get(redis_url: str) -> None:
    """Issue 30 item 4: records beyond the trainer's sequence length or byte bound never reach it."""
    cfg = fast_config(redis_url)
    limit = record_byte_limit(16, 2)
    huge = make_record(1)
    huge.completions = ["x" * (limit + 1), "B"]
    long = make_record(2)
    long.prompt_token_ids = [1] * 15  # + a 2-token completion > 16
    with RedisRolloutQueue(cfg) as producer, RedisRolloutQueue(cfg, max_tokens=16, max_bytes=limit) as consumer:
        producer.put_many([huge, long, make_record(3)])
        assert ids(consumer.get(3, timeout=1.0)) == ["rec-0003"]
        reasons = [d["reason"] for d in consumer.dead_letters()]
        assert any("exceeds the trainer's bound" in r for r in reasons), reasons
        assert any("exceed the trainer's 16-token sequences" in r for r in reasons), reasons


def test_a_non_finite_step_dead_letters_its_batch_so_a_restart_goes_past_it(redis_url: str) -> None:
    """Issue 30 item 4: a record that made the step non-finite stayed unacknowledged, and the resumed
    trainer took it again and stopped at the same step, for ever."""
    from cosmos_primitives.policy import NonFiniteError
    from cosmos_primitives.queue.record_groups import dead_letter_on_nonfinite

    cfg = fast_config(redis_url, claim_idle_s=0.3)
    with RedisRolloutQueue(cfg) as producer:
        producer.put_many([make_record(i) for i in range(3)])
    trainer = RedisRolloutQueue(cfg, consumer="trainer-0")
    batch = trainer.get(2, timeout=1.0)
    with pytest.raises(NonFiniteError), dead_letter_on_nonfinite(trainer, batch, step=5):
        raise NonFiniteError("step 5: non-finite loss or gradient norm")
    trainer.close()  # the trainer stops; its restart must not see the batch again
    time.sleep(0.5)
    with RedisRolloutQueue(cfg, consumer="trainer-0-restarted") as restarted:
        assert ids(restarted.get(3, timeout=1.0)) == ["rec-0002"]
        dead = restarted.dead_letters()
        assert len(dead) == 2 and all("trainer step 5 on the batch holding this record was non-finite" in d["reason"]
                                      for d in dead), dead
