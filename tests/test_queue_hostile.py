"""Hostile queue entries, duplicated puts and a crashing redis-server, against a real redis-server:
every bad entry is dead-lettered with its reason and counted while the good records behind it are
delivered; a record is trained once however often it was put; a SIGKILLed server restarted on its
data folder has kept every record it acknowledged."""

from __future__ import annotations

import os
import signal
import time

import msgspec
import pytest
import redis

import cosmos_primitives as cp
from cosmos_primitives.data import BadSampleTracker, MediaSettings
from cosmos_primitives.queue import (
    InMemoryRolloutQueue,
    MalformedRecordError,
    RedisRolloutQueue,
    StalenessFilter,
    decode_record,
    fetch_records,
)
from test_queue_redis import fast_config, ids, make_record

VOCAB = 1000


def _fields(**changes) -> dict:
    fields = msgspec.to_builtins(make_record(900))
    fields.update(changes)
    return fields


def _deeply_nested(depth: int) -> bytes:
    """A record whose conversation is ``depth`` lists deep (msgspec itself cannot encode that)."""
    marker = msgspec.msgpack.encode("NESTED")
    data = msgspec.msgpack.encode(_fields(conversation=[{"role": "user", "content": "NESTED"}]))
    return data.replace(marker, b"\x91" * depth + msgspec.msgpack.encode("leaf"))


def _without(name: str) -> dict:
    fields = _fields()
    del fields[name]
    return fields


def _hostile_entries() -> list[tuple[str, dict[str, bytes], str]]:
    """(name, stream fields, what the dead-letter reason must say), one per kind of poison."""
    good = msgspec.msgpack.encode(_fields())
    pack = msgspec.msgpack.encode
    return [
        ("nested 5000 deep", {"record": _deeply_nested(5000)}, "nested too deep"),
        ("nested 40 deep", {"record": _deeply_nested(40)}, "nested deeper than 32 levels"),
        ("empty conversation", {"record": pack(_fields(conversation=[], media=[]))}, "conversation is empty"),
        ("no record_id", {"record": pack(_without("record_id"))}, "missing required field `record_id`"),
        ("empty record_id", {"record": pack(_fields(record_id=""))}, "record_id is empty"),
        ("ids vs log-probs", {"record": pack(_fields(logprobs=[[-0.1], [-0.3]]))}, "2 token ids but 1 log-probs"),
        ("NaN log-prob", {"record": pack(_fields(logprobs=[[float("nan"), -0.2], [-0.3]]))}, "logprobs[0] holds nan"),
        ("-inf log-prob", {"record": pack(_fields(logprobs=[[-0.1, -0.2], [float("-inf")]]))}, "holds -inf"),
        ("positive log-prob", {"record": pack(_fields(logprobs=[[5.0, -0.2], [-0.3]]))}, "holds 5.0"),
        ("NaN reward", {"record": pack(_fields(rewards=[float("nan"), 0.0]))}, "rewards[0] is nan"),
        ("inf advantage", {"record": pack(_fields(advantages=[0.0, float("inf")]))}, "advantages[1] is inf"),
        ("NaN in meta", {"record": pack(_fields(meta={"reward/format": float("nan")}))}, "meta['reward/format']"),
        ("unknown finish reason", {"record": pack(_fields(finish_reasons=["stop", "exploded"]))}, "'exploded'"),
        ("token id past vocab", {"record": pack(_fields(completion_token_ids=[[7, 10**6], [9]]))},
         "outside the vocabulary of 1000"),
        ("token id past int64", {"record": pack(_fields(prompt_token_ids=[1, 2**64 - 1]))}, "prompt_token_ids"),
        ("negative token id", {"record": pack(_fields(prompt_token_ids=[1, -5]))}, "token id -5"),
        ("empty prompt", {"record": pack(_fields(prompt_token_ids=[]))}, "prompt_token_ids is empty"),
        ("no completions", {"record": pack(_fields(completions=[], completion_token_ids=[], logprobs=[],
                                                   finish_reasons=[], rewards=[], advantages=[]))},
         "no completions"),
        ("media vs conversation", {"record": pack(_fields(media=["a.mp4", "b.mp4"]))}, "media lists 2 references"),
        ("inline media bytes", {"record": pack(_fields(conversation=[{"role": "user", "content": b"\x89PNG"}],
                                                       media=[]))}, "never media bytes"),
        ("negative version", {"record": pack(_fields(weight_version=-1))}, "weight_version"),
        ("mistyped field", {"record": pack(_fields(weight_version="three"))}, "$.weight_version"),
        ("a list, not a map", {"record": pack([1, 2, 3])}, "Expected `object`"),
        ("not msgpack", {"record": b"\xc1 not msgpack"}, "is not msgpack"),
        ("truncated", {"record": good[: len(good) // 2]}, "is not msgpack"),
        ("no record field", {"payload": good}, "no 'record' field"),
    ]


HOSTILE = _hostile_entries()
PAYLOADS = [h for h in HOSTILE if "record" in h[1]]  # the others are the stream reader's to report


@pytest.mark.parametrize(("name", "fields", "reason"), PAYLOADS, ids=[h[0] for h in PAYLOADS])
def test_decode_refuses_each_hostile_entry_with_its_reason(name, fields, reason) -> None:
    with pytest.raises(MalformedRecordError) as info:
        decode_record(fields["record"], entry_id="5-0", vocab_size=VOCAB)
    assert reason in info.value.reason and info.value.entry_id == "5-0"


def test_poison_entries_are_dead_lettered_counted_and_good_records_behind_them_delivered(redis_url) -> None:
    cfg = fast_config(redis_url)
    raw = redis.Redis.from_url(redis_url)
    producer = RedisRolloutQueue(cfg, consumer="rollout")
    trainer = RedisRolloutQueue(cfg, consumer="trainer-0", vocab_size=VOCAB)
    bad_ids: dict[str, str] = {}
    for k, (name, fields, _) in enumerate(HOSTILE):
        producer.put(make_record(k))
        bad_ids[raw.xadd(cfg.stream, fields).decode()] = name
    producer.put(make_record(len(HOSTILE)))

    trained: list[str] = []
    for _ in range(20):  # a trainer loop that must not die on any entry
        batch = trainer.get(4, timeout=0.1)
        trained += ids(batch)
        trainer.ack(batch)
        if len(trained) == len(HOSTILE) + 1:
            break
    assert trained == [f"rec-{k:04d}" for k in range(len(HOSTILE) + 1)]
    assert trainer.metrics()["queue/malformed"] == len(HOSTILE)
    assert trainer.group_counters()["dead_letters"] == len(HOSTILE)
    dead = {d["entry_id"]: d for d in trainer.dead_letters(count=1000)}
    assert set(dead) == set(bad_ids)
    for entry_id, name in bad_ids.items():
        expected = next(reason for n, _, reason in HOSTILE if n == name)
        assert expected in dead[entry_id]["reason"], (name, dead[entry_id]["reason"])
    assert producer.pending() == 0
    raw.close()
    producer.close()
    trainer.close()


def test_a_record_the_trainer_cannot_rebuild_is_dead_lettered_not_fatal() -> None:
    queue = InMemoryRolloutQueue()
    broken, fine = make_record(1), make_record(2)
    broken.conversation = []  # emptied after construction: the trainer's rebuild refuses it
    fine.conversation = [{"role": "user", "content": [{"type": "text", "text": "no media"}]}]
    fine.media = []
    queue.put_many([broken, fine])
    records, groups = fetch_records(queue, StalenessFilter(allowed_outdated_steps=4), 1, trainer_step=0,
                                    settings=MediaSettings(), bad=BadSampleTracker(0.5), timeout_s=1)
    assert ids(records) == ["rec-0002"] and len(groups) == 1
    assert [(r.record_id, "carries no conversation" in why) for r, why in queue.rejected] == [("rec-0001", True)]
    assert queue.metrics()["queue/malformed"] == 1 and queue.pending() == 1  # rec-0002 waits for its ack


# -- item 4: a record is trained once however often it was put ---------------------------------------


def test_a_duplicated_put_is_delivered_to_one_consumer_only(redis_url) -> None:
    cfg = fast_config(redis_url, claim_idle_s=0.5)
    producer = RedisRolloutQueue(cfg, consumer="rollout")
    first, second = RedisRolloutQueue(cfg, consumer="trainer-0"), RedisRolloutQueue(cfg, consumer="trainer-1")
    twice = make_record(1)
    producer.put(twice)
    producer.put(twice)  # a put retried after its reply was lost
    got_first = first.get(1, timeout=1)
    assert ids(got_first) == ["rec-0001"]
    assert second.get(1, timeout=0.3) == []  # the other copy is not handed to another trainer
    first.ack(got_first)
    producer.put(twice)  # a late copy after training
    assert second.get(1, timeout=0.3) == []
    assert first.group_counters()["double_acked"] == 0 and producer.pending() == 0
    assert first.metrics()["queue/duplicates_skipped"] + second.metrics()["queue/duplicates_skipped"] == 2

    # a copy put while its first copy is held by a trainer that then dies: trained once, by the survivor
    other = make_record(2)
    producer.put_many([other, other])
    doomed = RedisRolloutQueue(cfg, consumer="doomed")
    assert ids(doomed.get(1, timeout=1)) == ["rec-0002"]
    doomed._stop.set()  # stops renewing, as a SIGKILLed consumer would; it never acks
    deadline = time.monotonic() + 10
    taken = []
    while not taken and time.monotonic() < deadline:
        taken = second.get(2, timeout=0.2)
    assert ids(taken) == ["rec-0002"]
    second.ack(taken)
    assert producer.pending() == 0
    assert second.group_counters()["double_acked"] == 0
    for queue in (producer, first, second, doomed):
        queue.close()


def test_records_without_an_id_are_dead_lettered_not_given_one(redis_url) -> None:
    cfg = fast_config(redis_url)
    raw = redis.Redis.from_url(redis_url)
    anonymous = msgspec.msgpack.encode(_without("record_id"))
    raw.xadd(cfg.stream, {"record": anonymous})
    raw.xadd(cfg.stream, {"record": anonymous})
    with RedisRolloutQueue(cfg, consumer="trainer-0") as trainer:
        assert trainer.get(2, timeout=0.3) == []
        assert [d["reason"] for d in trainer.dead_letters()] == [
            "not a valid RolloutRecord: Object missing required field `record_id`"] * 2
    raw.close()


def test_an_ack_retried_after_a_lost_reply_is_not_a_second_training(redis_url) -> None:
    cfg = fast_config(redis_url)
    with RedisRolloutQueue(cfg) as producer, RedisRolloutQueue(cfg, consumer="trainer-0") as trainer:
        producer.put(make_record(1))
        got = trainer.get(1, timeout=1)
        entries = list(trainer._outstanding.items())
        trainer._ack_entries(entries)  # the first attempt ran in Redis, its reply was lost
        assert trainer._ack_entries(entries) == []  # the retry
        assert trainer.group_counters()["double_acked"] == 0 and ids(got) == ["rec-0001"]


# -- item 5: the private server keeps what it acknowledged -----------------------------------------


def test_private_server_is_persistent_and_a_sigkilled_server_keeps_its_records(tmp_path) -> None:
    server = cp.queue.RedisServer(data_dir=tmp_path / "redis").start()
    try:
        client = redis.Redis.from_url(server.url)
        settings = {k: client.config_get(k)[k] for k in ("appendonly", "appendfsync", "maxmemory-policy")}
        assert settings == {"appendonly": "yes", "appendfsync": "always", "maxmemory-policy": "noeviction"}
        client.close()
        cfg = fast_config(server.url, reconnect_timeout_s=10)
        with RedisRolloutQueue(cfg, consumer="rollout") as producer:
            producer.put_many([make_record(i) for i in range(20)])  # acknowledged by the server
        os.kill(server.pid, signal.SIGKILL)  # no shutdown, no final fsync
        server.restart()
        with RedisRolloutQueue(cfg, consumer="trainer-0") as trainer:
            got = trainer.get(20, timeout=2)
            assert ids(got) == [f"rec-{i:04d}" for i in range(20)]
            trainer.ack(got[:5])
    finally:
        server.close()
    assert (tmp_path / "redis").is_dir()  # a given data folder is kept, for a resumed run

    # the next run on that folder
    with cp.queue.RedisServer(data_dir=tmp_path / "redis") as again, \
            RedisRolloutQueue(fast_config(again.url), consumer="trainer-1") as trainer:
        assert ids(trainer.get(20, timeout=0.5)) == []  # still delivered to trainer-0, not acked
        assert trainer.pending() == 15


def test_records_held_through_a_server_outage_longer_than_claim_idle_s_are_not_taken_over(tmp_path) -> None:
    """Pending entries age while the server is down (their owner cannot renew them); after the
    restart the other consumers leave them to their live owner instead of training them twice."""
    with cp.queue.RedisServer(data_dir=tmp_path / "redis") as server:
        # claim_idle_s leaves the owner's renewals (every 0.5 s) a 1.5 s margin on a loaded machine
        cfg = fast_config(server.url, claim_idle_s=1.5)
        producer = RedisRolloutQueue(cfg, consumer="rollout")
        owner, other = RedisRolloutQueue(cfg, consumer="owner"), RedisRolloutQueue(cfg, consumer="other")
        producer.put_many([make_record(i) for i in range(4)])
        held = owner.get(4, timeout=1)
        assert other.get(1, timeout=0.1) == []  # other is connected, as a running trainer is
        os.kill(server.pid, signal.SIGKILL)
        time.sleep(3.5)  # over 2x claim_idle_s down
        server.restart()
        late = RedisRolloutQueue(cfg, consumer="late")  # started after the restart: it saw no reconnect
        stolen = []
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:  # the others poll while owner trains a long step
            stolen += other.get(4, timeout=0.05) + late.get(4, timeout=0.05)
        assert ids(stolen) == []
        assert owner.ack(held) == 4 and owner.group_counters()["double_acked"] == 0
        for queue in (producer, owner, other, late):
            queue.close()
