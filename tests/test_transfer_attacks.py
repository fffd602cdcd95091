"""Hostile inputs against the weight transfer between jobs (issue 30, items 1-3).

Two attackers: one holds the run's Redis URL (it can read and write every key) but not the run
secret; one holds only the network (it can open connections to any port of the trainer's
host). Neither may read the trainer's weights, make a member load other weights, or stop the
run's rollout jobs; a flood of idle connections or of (authentic) transfer requests from
member ids that never show up may neither make a real fetch miss its timeout nor exhaust the
trainer's threads, file descriptors or logs.

The server and its members run on threads of the test process over a real redis-server.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from datetime import timedelta

import msgspec
import pytest
import redis
import torch
import torch.distributed as dist

from cosmos_primitives.config.redis import RedisConfig
from cosmos_primitives.queue.redis_queue import RedisRolloutQueue
from cosmos_primitives.queue.run_control import RunControl
from cosmos_primitives.sync import WeightClient, WeightReceiver, WeightServer, WeightTransferError
from cosmos_primitives.sync.stateless_group import pair_group
from test_sync_broadcast import TinyQwen2Like, _state

PREFIX = "cosmos:attack-test"
SECRET = "attack-test-run-secret-" + "1" * 32


@pytest.fixture(autouse=True)
def _run_secret(monkeypatch):
    monkeypatch.setenv("COSMOS_RUN_SECRET", SECRET)


def _wait_for(condition, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.05)


def _record(r: redis.Redis) -> dict:
    """What anyone with the Redis URL reads of the server record (signed or not, it is not secret)."""
    raw = msgspec.json.decode(r.get(f"{PREFIX}:weights:server"))
    return msgspec.json.decode(raw["body"]) if "body" in raw else raw


def _steal_weights(redis_url: str, member: str, timeout_s: float) -> dict | None:
    """The Redis-URL attacker: ask for a transfer as a member would, over torch's own store client."""
    r = redis.Redis.from_url(redis_url)
    rec = _record(r)
    nonce = uuid.uuid4().hex
    r.rpush(f"{PREFIX}:weights:requests:{rec['session']}", msgspec.json.encode({"member": member, "nonce": nonce}))
    thief = TinyQwen2Like(seed=7)
    try:
        store = dist.TCPStore(rec["host"], rec["port"], is_master=False, timeout=timedelta(seconds=timeout_s))
        group = pair_group(store, f"{member}/{nonce}", 1, device_type="cpu", timeout_s=timeout_s,
                           peer_host=rec["host"])
        WeightReceiver(thief, group, device="cpu").sync()
    except Exception:  # any failure means nothing was stolen
        return None
    finally:
        r.close()
    return _state(thief.named_parameters())


def test_a_redis_url_holder_cannot_read_the_weights(redis_url):
    model = TinyQwen2Like(seed=0)
    server = WeightServer(model, redis_url, PREFIX, bucket_bytes=512, timeout_s=2.0, heartbeat_s=0.2)
    try:
        server.publish(0)
        result: list = []
        thread = threading.Thread(target=lambda: result.append(_steal_weights(redis_url, "thief", 2.0)), daemon=True)
        thread.start()
        thread.join(timeout=30)
        assert result == [None], "the attacker received the trainer's weights"
        _wait_for(lambda: server.metrics()["sync/rejected_requests"] >= 1)
    finally:
        server.close()


def _fake_trainer(redis_url: str, monkeypatch, secret: str) -> WeightServer:
    """The Redis-URL attacker's own weight server under the run's prefix (its own secret)."""
    monkeypatch.setenv("COSMOS_RUN_SECRET", secret)
    try:
        return WeightServer(TinyQwen2Like(seed=5), redis_url, PREFIX, bucket_bytes=512, timeout_s=2.0,
                            heartbeat_s=0.2)
    finally:
        monkeypatch.setenv("COSMOS_RUN_SECRET", SECRET)


def test_a_redis_url_holder_cannot_feed_members_its_weights(redis_url, monkeypatch):
    model = TinyQwen2Like(seed=0)
    server = WeightServer(model, redis_url, PREFIX, bucket_bytes=512, timeout_s=2.0, heartbeat_s=0.2)
    member_model = TinyQwen2Like(seed=1)
    member = WeightClient(member_model, redis_url, PREFIX, member_id="m", timeout_s=2.0)
    fake = _fake_trainer(redis_url, monkeypatch, "attacker-secret-" + "2" * 32)
    try:
        server.publish(0)
        assert member.fetch().version == 0
        real = _state(model.named_parameters())
        assert _state(member_model.named_parameters()) == real
        fake.publish(9)  # overwrites the run's server record with its own
        for _ in range(3):
            try:
                member.refresh()
            except WeightTransferError as exc:
                assert "not signed with this run's secret" in str(exc)
        assert _state(member_model.named_parameters()) == real and member.weight_version == 0
        assert fake.metrics()["sync/transfers"] == 0
    finally:
        fake.close()
        server.close()
        member.close()


def test_a_bucket_altered_after_the_digest_is_not_loaded(redis_url):
    """What the trainer signed is what a member loads: a bucket that differs (altered on the wire or in
    the snapshot) is refused before any of it reaches the engine, also on a kept pair's later fetch
    (which has no checksum round)."""
    model = TinyQwen2Like(seed=0)
    server = WeightServer(model, redis_url, PREFIX, bucket_bytes=512, timeout_s=2.0, heartbeat_s=0.2)
    member_model = TinyQwen2Like(seed=1)
    member = WeightClient(member_model, redis_url, PREFIX, member_id="m", timeout_s=2.0)
    try:
        server.publish(0)
        assert member.fetch().version == 0
        before = _state(member_model.named_parameters())
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        server.publish(1)
        server._current.buffers[0][0] ^= 0xFF  # after its digest was signed
        with pytest.raises(Exception, match="signed SHA-256"):
            member.fetch()
        assert _state(member_model.named_parameters()) == before, "an unverified bucket reached the engine"
        assert member.weight_version == -1
    finally:
        server.close()
        member.close()


def test_a_redis_url_holder_cannot_stop_the_run(redis_url):
    queue = RedisRolloutQueue(RedisConfig(stream=f"{PREFIX}:stream"), url=redis_url)
    with RunControl(queue) as control:
        attacker = redis.Redis.from_url(redis_url)
        attacker.set(control.stop_key, b"trainer finished at step 3")
        assert control.stop_requested() is None
        forged = msgspec.json.encode({"body": "x", "ts": time.time(), "nonce": "00" * 16, "mac": "00" * 32})
        attacker.set(control.stop_key, forged)
        assert control.stop_requested() is None
        control.request_stop("trainer finished at step 4")
        assert control.stop_requested() == "trainer finished at step 4"
        attacker.close()
    queue.close()


def test_the_store_listens_only_on_the_configured_address(redis_url):
    """transfer_host = 127.0.0.1 must not open the store to other addresses (127.0.0.2 reaches this
    machine too, through the loopback interface, as any other address of the host would)."""
    server = WeightServer(TinyQwen2Like(seed=0), redis_url, PREFIX, host="127.0.0.1", timeout_s=2.0)
    try:
        port = server.port
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.2", port), timeout=2).close()
    finally:
        server.close()


def test_a_network_attacker_can_neither_use_the_store_nor_crowd_out_a_member(redis_url):
    """Only the network: torch's store client cannot use the store, 1,000 idle connections delay
    a real member's first fetch by less than its timeout, and the store holds a bounded number."""
    timeout = 8.0
    model = TinyQwen2Like(seed=0)
    server = WeightServer(model, redis_url, PREFIX, host="127.0.0.1", bucket_bytes=512, timeout_s=timeout,
                          heartbeat_s=0.2)
    idle: list[socket.socket] = []
    try:
        server.publish(0)
        for _ in range(1000):
            idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
        member_model = TinyQwen2Like(seed=1)
        member = WeightClient(member_model, redis_url, PREFIX, member_id="m", timeout_s=timeout)
        start = time.monotonic()
        assert member.fetch().version == 0
        elapsed = time.monotonic() - start
        print(f"first fetch with 1000 idle connections held: {elapsed:.2f} s (timeout {timeout} s)")
        assert elapsed < timeout / 2
        assert _state(member_model.named_parameters()) == _state(model.named_parameters())
        pending, authed = server._store.connections
        assert pending <= server._store.max_pending and authed <= server._store.max_connections
        member.close()
        with pytest.raises(Exception):  # noqa: B017 - whatever torch raises: it must not get in
            store = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=2))
            store.set("pair/evil/0/x", b"1")
            store.get("pair/evil/0/x")
    finally:
        for s in idle:
            s.close()
        server.close()


def _signed_request(key: str, member: str, nonce: str) -> bytes:
    """An authentic request (as a buggy member with the run secret sends it)."""
    body = msgspec.json.encode({"member": member, "nonce": nonce})
    try:
        from cosmos_primitives.sync.run_auth import RunSecret
    except ImportError:  # the library before requests were signed (to watch this test fail there)
        return body
    return RunSecret(SECRET).sign(key, body)


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_ghost_members_are_capped_and_their_logs_rate_limited(redis_url, caplog):
    """700 authentic requests from member ids that never show up in the store: the trainer keeps at
    most ``max_members`` (64) of them waiting (no thread, no gloo group, no store socket each),
    refuses the rest, logs a handful of lines, and a real member still fetches within its timeout
    once they expired."""
    timeout = 3.0
    model = TinyQwen2Like(seed=0)
    server = WeightServer(model, redis_url, PREFIX, bucket_bytes=512, timeout_s=timeout, heartbeat_s=0.2)
    r = redis.Redis.from_url(redis_url)
    try:
        server.publish(0)
        threads0, fds0 = threading.active_count(), _fds()
        key = f"{PREFIX}:weights:requests:{server.session}"
        caplog.set_level(logging.WARNING)
        r.rpush(key, *(_signed_request(key, f"ghost-{i}", "n") for i in range(700)))
        _wait_for(lambda: r.llen(key) == 0)
        time.sleep(0.5)
        peak_threads, peak_fds = threading.active_count() - threads0, _fds() - fds0
        assert server.metrics()["sync/members"] <= 64
        assert peak_threads <= 64 + 4, f"{peak_threads} new threads for 700 ghost requests"
        # a forming gloo group holds a few descriptors (listener, epoll, events): bounded by the rounds
        assert peak_fds <= 6 * 64, f"{peak_fds} new file descriptors for 700 ghost requests"
        assert server.metrics()["sync/members_refused"] >= 700 - 64
        member = WeightClient(TinyQwen2Like(seed=1), redis_url, PREFIX, member_id="real", timeout_s=timeout)
        _wait_for(lambda: server.metrics()["sync/members"] == 0, seconds=3 * timeout)  # the ghosts' requests expire
        assert member.fetch().version == 0
        member.close()
        lines = [rec for rec in caplog.records if rec.name.startswith("cosmos_primitives.sync")]
        print(f"700 ghost requests: {peak_threads} threads, {peak_fds} fds at the peak, {len(lines)} log lines")
        assert len(lines) <= 10
    finally:
        r.close()
        server.close()


def test_a_replayed_request_is_served_once(redis_url):
    from cosmos_primitives.sync.run_auth import AuthError, ReplayGuard, RunSecret

    secret = RunSecret(SECRET)
    signed = secret.sign("k", b"body")
    guard = ReplayGuard()
    assert secret.open("k", signed, guard=guard) == b"body"
    with pytest.raises(AuthError, match="replayed"):
        secret.open("k", signed, guard=guard)
    with pytest.raises(AuthError, match="bad MAC"):
        secret.open("other-key", signed)
    with pytest.raises(AuthError, match="window"):
        secret.open("k", secret.sign("k", b"body", now=time.time() - 3600))


def test_the_store_and_its_members_authenticate_each_other():
    """A client with another secret is turned away, a member does not talk to an impostor store,
    and a connection that says nothing is closed after ``auth_timeout_s``."""
    from cosmos_primitives.sync.pair_store import PairStoreClient, PairStoreServer
    from cosmos_primitives.sync.run_auth import AuthError, RunSecret

    ours, theirs = RunSecret(SECRET), RunSecret("attacker-secret-" + "3" * 32)
    server = PairStoreServer("127.0.0.1", 0, ours, auth_timeout_s=0.5)
    impostor = PairStoreServer("127.0.0.1", 0, theirs, auth_timeout_s=0.5)
    try:
        good = PairStoreClient("127.0.0.1", server.port, ours, timeout_s=2.0)
        good.set("k", b"v")
        assert good.get("k") == b"v" and good.add("n", 2) == 2 and good.check(["k", "n"])
        with pytest.raises((AuthError, ConnectionError)):
            PairStoreClient("127.0.0.1", server.port, theirs, timeout_s=1.0)
        assert server.stats["auth_failures"] >= 1
        with pytest.raises(ConnectionError, match="could not authenticate"):  # it turns our proof away
            PairStoreClient("127.0.0.1", impostor.port, ours, timeout_s=1.0)
        # one that accepts anything must still prove it holds the secret
        fake = socket.create_server(("127.0.0.1", 0))

        def accept_anything() -> None:
            conn, _ = fake.accept()
            conn.sendall(b"CPS1" + os.urandom(32))
            conn.recv(64)
            conn.sendall(os.urandom(32))
            time.sleep(0.5)
            conn.close()

        threading.Thread(target=accept_anything, daemon=True).start()
        with pytest.raises(AuthError, match="does not hold this run's secret"):
            PairStoreClient("127.0.0.1", fake.getsockname()[1], ours, timeout_s=1.0)
        fake.close()
        silent = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        silent.settimeout(5)
        assert silent.recv(100)  # the challenge
        start = time.monotonic()
        assert silent.recv(100) == b""  # closed by the server
        assert time.monotonic() - start < 3
        silent.close()
        good.close()
    finally:
        server.close()
        impostor.close()


def test_a_redis_url_holder_cannot_inject_records(redis_url):
    """Issue 30 item 1: with the run secret, the trainer's queue takes only records a job of the run
    signed. A record XADDed by hand, one put by a queue with another secret and one signed for another
    run's stream (then copied into this one) are dead-lettered, each naming why; the run's own record
    is trained."""
    from cosmos_primitives.sync.run_auth import RunSecret
    from test_queue_redis import make_record

    stream = f"{PREFIX}:records-{uuid.uuid4().hex[:6]}"
    other_stream = f"{stream}-other"
    secret = RunSecret(SECRET)
    client = redis.Redis.from_url(redis_url)
    with RedisRolloutQueue(RedisConfig(stream=stream), url=redis_url, secret=secret, consumer="trainer-0") as trainer, \
            RedisRolloutQueue(RedisConfig(stream=stream), url=redis_url, secret=secret) as rollout, \
            RedisRolloutQueue(RedisConfig(stream=stream), url=redis_url,
                              secret=RunSecret("another-runs-secret-" + "2" * 32)) as forger, \
            RedisRolloutQueue(RedisConfig(stream=other_stream), url=redis_url, secret=secret) as other_run:
        trainer.get(1, timeout=0.05)  # creates the consumer group
        from cosmos_primitives.queue.record import encode_record

        client.xadd(stream, {"record": encode_record(make_record(1))})  # plain, as the attacker writes it
        forger.put(make_record(2))
        other_run.put(make_record(3))
        [(_, fields)] = client.xrange(other_stream)
        client.xadd(stream, {"record": fields[b"record"]})  # a valid record of another run, moved here
        rollout.put(make_record(4))
        got = trainer.get(4, timeout=2)
        assert [r.record_id for r in got] == ["rec-0004"]
        dead = trainer.dead_letters()
        reasons = sorted(d["reason"] for d in dead)
        assert len(reasons) == 3, dead
        assert sum("not signed with the run secret" in r for r in reasons) == 1, reasons
        assert sum("signature does not match" in r for r in reasons) == 2, reasons
    client.delete(stream, other_stream, *client.keys(f"{stream}:*"), *client.keys(f"{other_stream}:*"))
    client.close()


def test_a_redis_url_holder_cannot_read_records(redis_url):
    """Issue 30 acceptance: with the run secret the records in Redis are sealed (encrypted, then
    MACed): a holder of the Redis URL reading the stream finds neither the conversation's text, the
    completions, the media path nor the record id in the bytes, and two puts of one record differ (a
    fresh nonce each), while the run's trainer reads the record back whole."""
    from cosmos_primitives.queue.record import encode_record
    from cosmos_primitives.sync.run_auth import RunSecret
    from test_queue_redis import make_record

    stream = f"{PREFIX}:sealed-{uuid.uuid4().hex[:6]}"
    secret = RunSecret(SECRET)
    client = redis.Redis.from_url(redis_url)
    record = make_record(7)
    record.completions = ["the secret answer", "another answer"]
    with RedisRolloutQueue(RedisConfig(stream=stream), url=redis_url, secret=secret, consumer="trainer-0") as trainer, \
            RedisRolloutQueue(RedisConfig(stream=stream), url=redis_url, secret=secret) as rollout:
        trainer.get(1, timeout=0.05)  # creates the consumer group
        rollout.put(record)
        rollout.put(record)
        raw = [fields[b"record"] for _, fields in client.xrange(stream)]
        assert len(raw) == 2 and raw[0] != raw[1]
        plain = encode_record(record)
        for leaked in (b"question 7", b"the secret answer", b"clips/a.mp4", b"rec-0007", plain[:64]):
            assert all(leaked not in payload for payload in raw), leaked
        got = trainer.get(2, timeout=2)
        assert [r.record_id for r in got] == ["rec-0007"]  # the copy is trained once
        assert got[0].completions == ["the secret answer", "another answer"]
        assert got[0].conversation == record.conversation
    client.delete(stream, *client.keys(f"{stream}:*"))
    client.close()


def test_a_redis_url_holder_cannot_set_the_weight_version(redis_url, caplog):
    """Issue 30 item 1, run state: the trainer signs ``S:weight_version``; rollout jobs ignore a value
    not signed with the run secret (a plain huge or negative number, an envelope signed with another
    secret, a signed version moved from another run's key) and keep the last signed one, so a forger
    can neither hold back nor unthrottle them; the trainer's next publish is read again."""
    from cosmos_primitives.sync.run_auth import RunSecret

    stream = f"{PREFIX}:version-{uuid.uuid4().hex[:6]}"
    other = RunSecret("another-runs-secret-" + "3" * 32)
    client = redis.Redis.from_url(redis_url)
    secret = RunSecret(SECRET)
    with RedisRolloutQueue(RedisConfig(stream=stream), url=redis_url, secret=secret) as trainer, \
            RedisRolloutQueue(RedisConfig(stream=stream), url=redis_url, secret=secret) as rollout:
        trainer.publish_weight_version(3)
        assert rollout.weight_version() == 3
        forged = [b"1000000", b"-5", other.sign(trainer.version_key, b"1000000"),
                  secret.sign(f"{stream}-other:weight_version", b"1000000")]
        with caplog.at_level(logging.WARNING, logger="cosmos.queue"):
            for value in forged:
                client.set(trainer.version_key, value)
                assert rollout.weight_version() == 3, value
        assert "not signed with this run's secret" in caplog.text
        trainer.publish_weight_version(4)
        assert rollout.weight_version() == 4
    client.delete(*client.keys(f"{stream}*"))
    client.close()


def test_a_redis_url_holder_cannot_forge_or_alter_a_live_job(redis_url, caplog):
    """Issue 30 item 1, run state: with the run secret each job's registry fields carry an HMAC bound to
    the job's key. A trainer entry written by hand (which would make a fresh start refuse the run) and
    a real rollout job's fields altered in place (its ``records_per_step`` feeds the throttle) are left
    out of the live jobs, with a warning; the altered job is back after its next heartbeat."""
    from cosmos_primitives.queue.job_registry import JobRegistry, refuse_live_trainer

    prefix = f"{PREFIX}:jobs-{uuid.uuid4().hex[:6]}"
    client = redis.Redis.from_url(redis_url)
    with JobRegistry(redis_url, prefix, ttl_s=30) as registry:
        job = registry.join("rollout", records_per_step=8)
        assert set(registry.live()) == {job}
        # a forged live trainer, written as JobRegistry's Lua script writes one
        client.hset(f"{prefix}:jobs:trainer-forged", mapping={"role": '"trainer"', "host": '"x"', "pid": "1",
                                                              "last_seen": str(time.time())})
        client.expire(f"{prefix}:jobs:trainer-forged", 30)
        client.sadd(f"{prefix}:jobs", "trainer-forged")
        client.hset(registry.job_key(job), "records_per_step", "100000")  # altered in place
        with caplog.at_level(logging.WARNING, logger="cosmos.queue"):
            assert registry.live() == {}
            refuse_live_trainer(registry)  # the forged trainer holds nothing
        assert "not signed with this run's secret" in caplog.text
        registry.heartbeat(job)
        assert registry.live()[job]["records_per_step"] == 8
    client.delete(*client.keys(f"{prefix}*"))
    client.close()


def _claims_producer(redis_url: str, stream: str, job: str, stop: threading.Event, errors: list, crashes: list,
                     **sizes) -> None:
    """A rollout job's claim loop (examples/grpo_rollout_job.py) reduced to its claims and puts: a claims
    call that fails on damaged claims keys is logged and the loop goes on, as the job does."""
    from cosmos_primitives.queue.prompt_claims import PromptClaims
    from cosmos_primitives.sync.run_auth import RunSecret
    from test_queue_redis import make_record

    try:
        with PromptClaims(redis_url, stream, claim_ttl_s=2.0, **sizes) as claims, \
                RedisRolloutQueue(RedisConfig(stream=stream, max_pending=12, put_timeout_s=0.5), url=redis_url,
                                  secret=RunSecret(SECRET)) as queue:
            claims.start_renewal(job, interval_s=0.3)
            while not stop.is_set():
                try:
                    claim = claims.claim(job)
                except ValueError as error:  # damaged claims keys: the trainer repairs them
                    errors.append(str(error))
                    time.sleep(0.05)
                    continue
                if claim is None:
                    time.sleep(0.05)
                    continue
                records = [msgspec.structs.replace(make_record(i), record_id=claims.record_id(claim, i))
                           for i in claim.indices]
                while not stop.is_set():
                    try:
                        if not claims.holds(claim):
                            break
                    except ValueError as error:  # as the job: put anyway (a duplicate is trained once)
                        errors.append(str(error))
                    try:
                        queue.put_many(records)
                        break
                    except Exception as error:  # queue full: the trainer is behind
                        if "max_pending" not in str(error):
                            raise
                try:
                    claims.complete(claim)
                except ValueError as error:  # as the job: the trainer re-issues what it did not train
                    errors.append(str(error))
    except Exception as error:  # the test reports it
        crashes.append(repr(error))


def _int_or_zero(value: bytes | None) -> int:
    return int(value) if value is not None and value.isdigit() else 0


def test_a_redis_url_holder_cannot_make_a_prompt_be_skipped_or_trained_twice_through_the_claims(redis_url, caplog):
    """Issue 30 item 1, prompt claims: the claims are unsigned Lua state, so the trainer is their
    authority. Two rollout producers claim ranges of a 24-prompt dataset while a trainer loop takes
    their signed records; mid-epoch an attacker holding only the Redis URL deletes the claims position
    (epoch reset) and adds garbage and trained ranges to the re-issue list, writes garbage into the
    position, replaces the holders' hash with a string, skips the position two epochs forward, adds
    the prompts not trained yet to the queue's set of trained record ids (``S:done``, which makes the
    queue drop their records), deletes the claims in flight (marks them done), and hands the claims
    then in flight to a ghost job with a deadline that never comes. Every prompt of epoch 0 is still
    trained exactly once, no record id is trained twice, no producer crashes, and the damage is logged."""
    from cosmos_primitives.queue.prompt_claims import PromptClaims, claim_keys
    from cosmos_primitives.queue.trained_prompts import TrainedPrompts
    from cosmos_primitives.sync.run_auth import RunSecret

    stream = f"{PREFIX}:claims-{uuid.uuid4().hex[:6]}"
    sizes = {"dataset_size": 24, "range_size": 3, "seed": 5}
    keys = claim_keys(stream)
    client = redis.Redis.from_url(redis_url)
    stop = threading.Event()
    errors: list[str] = []
    crashes: list[str] = []
    trained: dict[str, int] = {}
    attacks = [  # (epoch-0 prompts trained before it, what the attacker does)
        (3, lambda: (client.delete(keys["next"]),
                     client.zadd(keys["deadlines"], {"abc": 0, "-3": 0, "0": 0}))),
        (6, lambda: client.set(keys["next"], "zzz")),
        (8, lambda: (client.delete(keys["owners"]), client.set(keys["owners"], "x"))),  # a key of another type
        (10, lambda: client.set(keys["next"], _int_or_zero(client.get(keys["next"])) + 2 * 8)),
        (11, lambda: client.zadd(f"{stream}:done", {f"e0-i{i}": time.time() for i in range(24)
                                                   if f"e0-i{i}" not in trained})),  # "trained" in the queue's set
        (13, lambda: client.delete(keys["deadlines"], keys["owners"])),
        (16, lambda: [(client.zadd(keys["deadlines"], {m: 1e15}), client.hset(keys["owners"], m, "ghost"))
                      for m in client.zrange(keys["deadlines"], 0, -1)]),  # held forever by nobody
    ]
    with PromptClaims(redis_url, stream, **sizes) as claims, \
            RedisRolloutQueue(RedisConfig(stream=stream, max_pending=12), url=redis_url, secret=RunSecret(SECRET),
                              consumer="trainer-0") as queue, caplog.at_level(logging.WARNING):
        ledger = TrainedPrompts(**sizes)
        producers = [threading.Thread(target=_claims_producer, args=(redis_url, stream, f"job-{k}", stop, errors,
                                                                     crashes), kwargs=sizes, daemon=True)
                     for k in range(2)]
        for producer in producers:
            producer.start()
        deadline = time.monotonic() + 35
        step = 0
        try:
            while sum(rid.startswith("e0-") for rid in trained) < 24 and time.monotonic() < deadline:
                got = queue.get(4, timeout=0.3)
                repeated = [r for r in got if ledger.is_trained(r.record_id)]
                if repeated:
                    queue.ack(repeated)
                fresh = [r for r in got if not ledger.is_trained(r.record_id)]
                for record in fresh:
                    trained[record.record_id] = trained.get(record.record_id, 0) + 1
                if fresh:
                    step += 1
                    queue.ack(fresh, step=step)
                    ledger.mark([r.record_id for r in fresh])
                done = sum(rid.startswith("e0-") for rid in trained)
                if attacks and done >= attacks[0][0]:  # one a step: the trainer sees each
                    attacks.pop(0)[1]()
                ledger.audit(claims, grace_steps=3, untrain=queue.untrain)
        finally:
            stop.set()
            for producer in producers:
                producer.join(timeout=10)
    epoch0 = sorted(rid for rid in trained if rid.startswith("e0-"))
    assert not attacks, f"the run ended before every attack was made: {len(attacks)} left"
    never = sorted({f"e0-i{i}" for i in range(24)} - set(epoch0))
    assert len(epoch0) == 24, f"prompts of epoch 0 never trained: {never}"
    assert all(n == 1 for n in trained.values()), {rid: n for rid, n in trained.items() if n > 1}
    assert not crashes, crashes
    assert all("not written by PromptClaims" in e for e in errors), errors  # clear errors, never Lua's own
    assert "hold what cosmos_primitives never writes" in caplog.text, caplog.text[-2000:]  # the garbage position
    assert "handed out again" in caplog.text, caplog.text[-2000:]  # the ranges skipped or marked done
    assert "were marked trained in the queue" in caplog.text, caplog.text[-2000:]  # S:done un-marked
    client.delete(*client.keys(f"{stream}*"))
    client.close()
