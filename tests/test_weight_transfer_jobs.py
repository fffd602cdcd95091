"""Weights from a trainer job to rollout processes of other jobs (``WeightServer`` / ``WeightClient``).

The trainer is a job of its own: two gloo ranks in their own world (``run_distributed``), the
model FSDP2-sharded over them. Each member is a separate spawned process with no process group
at all. They meet only through a real redis-server; the test drives each of them through Redis
lists (``ctl:*``) and checks, in one run: a member started before the trainer waits and then loads
(4); a member started after a publish gets the trainer's weights bit for bit (1); members that
skip versions get the newest (2); a member SIGKILLed mid-transfer delays no publish past the
timeout, the other member keeps receiving, and a restarted process with the same member id
loads the current version (3); after ``close()`` a fetch fails with a clear error (slow: five
process starts).

A second, fast test runs the server and its members on threads of the test process (the same
groups and protocol, no process starts) through the failure cases: a member that asks and never
shows up, one that stalls mid-transfer, a restarted member id, a trainer that closed or died, and
a restarted trainer. Another has three members wait for each of two versions: the bytes leaving
the trainer per version are one snapshot (the relay chain). The model is ``test_sync_broadcast``'s plain-torch Qwen2
look-alike, which keeps ``transformers`` out of the spawned processes.

Another holds a snapshot as a slow member's transfer does while two publishes go by: the one
that stops waiting for it takes fresh buffers (the reader keeps one whole version) and later
fetches are checked and exact.

A trainer process SIGKILLed after publishing leaves a record in Redis that expires by itself.

A third (threads too) serves the tiny VL models (Qwen2.5-VL, Qwen3-VL tied and untied) in vLLM's
fused layout to a member holding the tensors of the vLLM stand-in's model.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest
import redis
import torch
import torch.distributed as dist

from cosmos_primitives.parallel.distributed import free_port
from cosmos_primitives.sync.run_auth import RunSecret
from cosmos_primitives.testing import run_distributed
from test_sync_broadcast import VOCAB, TinyQwen2Like, _state

PREFIX = "cosmos:transfer-test"
TIMEOUT_S = 5.0  # the round timeout of both sides
SLACK_S = 5.0


@pytest.fixture(autouse=True)
def _run_secret(monkeypatch):
    """Every side of a transfer reads the run secret from the environment (spawned members inherit it)."""
    monkeypatch.setenv("COSMOS_RUN_SECRET", "test-run-secret-" + "0" * 32)


def _redis(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=None)  # blocking pops wait longer than the default 5 s


def _send(r: redis.Redis, key: str, obj) -> None:
    r.rpush(key, pickle.dumps(obj))


def _recv(r: redis.Redis, key: str, timeout_s: float = 120.0):
    popped = r.blpop([key], timeout=timeout_s)
    if popped is None:
        raise TimeoutError(f"nothing on '{key}' within {timeout_s}s")
    return pickle.loads(popped[1])


# the trainer job ---------------------------------------------------------------------------------

def _trainer_rank(url: str) -> None:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    from cosmos_primitives.sync import WeightServer
    from cosmos_primitives.sync.sources import full_tensor

    rank = dist.get_rank()
    model = TinyQwen2Like(seed=0)
    mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    server = WeightServer(model, url, PREFIX, bucket_bytes=700, timeout_s=TIMEOUT_S, heartbeat_s=0.5)
    r = _redis(url) if rank == 0 else None
    version = 0
    times = [server.publish(version).seconds]
    while True:
        full = _state((n, full_tensor(p)) for n, p in model.named_parameters())
        if rank == 0:
            _send(r, "ctl:trainer:out", SimpleNamespace(version=version, state=full, publish_s=times,
                                                        metrics=server.metrics()))
            command = _recv(r, "ctl:trainer:in")
        else:
            command = None
        box = [command]
        dist.broadcast_object_list(box, src=0)
        command = box[0]
        if command == "stop":
            server.close()
            return
        times = []
        for _ in range(command):  # optimizer steps, each published
            torch.manual_seed(100 * version + rank)
            model(torch.randint(0, VOCAB, (2, 5))).square().mean().backward()
            optim.step()
            optim.zero_grad()
            version += 1
            times.append(server.publish(version).seconds)


def _trainer_job(url: str, done: list) -> threading.Thread:
    """The trainer job's two ranks, started (and waited for) from a thread of the test process."""

    def run() -> None:
        done.append(run_distributed(_trainer_rank, 2, args=(url,), timeout_s=300))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


# members -----------------------------------------------------------------------------------------

class _StuckEngine:
    """A RolloutEngine whose loader hangs in the first bucket (so the test can kill it mid-transfer)."""

    def __init__(self, r: redis.Redis, key: str) -> None:
        self.r, self.key, self.weight_version = r, key, -1

    def update_weights(self, named_tensors, version: int) -> None:
        _send(self.r, self.key, "inside")
        time.sleep(3600)


def _member(url: str, member_id: str, stuck: bool = False) -> None:
    from cosmos_primitives.sync import WeightClient, WeightTransferError

    r = _redis(url)
    out = f"ctl:{member_id}:out"
    model = TinyQwen2Like(seed=11)
    holder = SimpleNamespace(weight_version=-1)
    target = _StuckEngine(r, out) if stuck else model
    client = WeightClient(target, url, PREFIX, member_id=member_id, engine=holder, timeout_s=TIMEOUT_S)
    _send(r, out, ("ready", client.published_version(), client.weight_version))
    while (command := _recv(r, f"ctl:{member_id}:in", timeout_s=300)) != "stop":
        try:
            if command == "wait_and_fetch":
                client.wait_for_server(timeout_s=120)
            result = client.fetch()
            _send(r, out, (result, client.weight_version, holder.weight_version, _state(model.named_parameters())))
        except WeightTransferError as exc:
            _send(r, out, ("error", str(exc)))
    client.close()


def _spawn(target, *args) -> multiprocessing.Process:
    proc = multiprocessing.get_context("spawn").Process(target=target, args=args)
    proc.start()
    return proc


def _ask(r: redis.Redis, who: str, command):
    _send(r, f"ctl:{who}:in", command)
    return _recv(r, f"ctl:{who}:out")


@pytest.mark.slow  # five process starts (~10 s each on a loaded 2-core machine)
def test_rollout_members_of_other_jobs_follow_the_trainer(redis_url):
    r = _redis(redis_url)
    procs: list[multiprocessing.Process] = []
    try:
        # (4) a member started before any trainer: nothing on offer, it waits, then loads
        procs.append(_spawn(_member, redis_url, "early"))
        assert _recv(r, "ctl:early:out") == ("ready", None, -1)
        _send(r, "ctl:early:in", "wait_and_fetch")
        trainer_job = _trainer_job(redis_url, trainer_done := [])
        trainer = _recv(r, "ctl:trainer:out")
        result, version, holder_version, state = _recv(r, "ctl:early:out")
        assert (result.version, version, holder_version, result.verified) == (0, 0, 0, True)
        assert state == trainer.state
        first_state = trainer.state

        # (1) a member started after the trainer published gets exactly its current weights
        trainer = _ask(r, "trainer", 1)
        procs.append(_spawn(_member, redis_url, "late"))
        assert _recv(r, "ctl:late:out")[:2] == ("ready", 1)
        result, version, _, state = _ask(r, "late", "fetch")
        assert (result.version, version, result.verified) == (1, 1, True)
        assert state == trainer.state

        # (2) members that skipped versions get the newest; later transfers reuse the pair
        trainer = _ask(r, "trainer", 3)
        for who in ("late", "early"):
            result, version, holder_version, state = _ask(r, who, "fetch")
            assert (result.version, version, holder_version, result.verified) == (4, 4, 4, False)
            assert state == trainer.state
        assert trainer.state != first_state, "the optimizer steps changed nothing"

        # (3) a member killed mid-transfer: publishes stay bounded, the others keep receiving,
        #     a restarted process with the same member id loads the current version
        procs.append(stuck := _spawn(_member, redis_url, "victim", True))
        assert _recv(r, "ctl:victim:out")[0] == "ready"
        assert _ask(r, "victim", "fetch") == "inside"
        os.kill(stuck.pid, signal.SIGKILL)
        stuck.join(timeout=30)
        trainer = _ask(r, "trainer", 3)
        assert len(trainer.publish_s) == 3 and max(trainer.publish_s) < TIMEOUT_S + SLACK_S, trainer.publish_s
        result, version, _, state = _ask(r, "early", "fetch")
        assert (result.version, version) == (7, 7) and state == trainer.state
        procs.append(_spawn(_member, redis_url, "victim"))
        assert _recv(r, "ctl:victim:out")[:2] == ("ready", 7)
        result, version, _, state = _ask(r, "victim", "fetch")
        assert (result.version, version, result.verified) == (7, 7, True) and state == trainer.state
        metrics = _ask(r, "trainer", 0).metrics
        # 6 transfers were received; the last may not be counted yet when the trainer reports
        assert metrics["sync/transfer_failures"] >= 1 and metrics["sync/transfers"] >= 5
        assert metrics["sync/published_version"] == 7

        # the trainer stops serving: a fetch then fails naming the member and the run
        _send(r, "ctl:trainer:in", "stop")
        trainer_job.join(timeout=60)
        assert trainer_done == [[None, None]]
        error = _ask(r, "early", "fetch")
        assert error[0] == "error" and "'early'" in error[1] and PREFIX in error[1], error
        for who in ("early", "late", "victim"):
            _send(r, f"ctl:{who}:in", "stop")
        for proc in procs:
            proc.join(timeout=30)
        assert [p.exitcode for p in procs] == [0, 0, -signal.SIGKILL, 0]
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=10)
        r.close()


# one process: the server and its members on threads (fast; the same protocol and groups) ------

class _HeldEngine:
    """A RolloutEngine whose loader waits for ``release`` (a member that stalls mid-transfer);
    it loads into ``weights`` (not ``.model``: the check reads them back through ``read_back``)."""

    def __init__(self) -> None:
        self.inside, self.release = threading.Event(), threading.Event()
        self.weights = dict(TinyQwen2Like(seed=4).named_parameters())
        self.weight_version = -1

    def update_weights(self, named_tensors, version: int) -> None:
        self.inside.set()
        self.release.wait(60)
        with torch.no_grad():
            for name, tensor in named_tensors:
                self.weights[name].copy_(tensor)
        self.weight_version = version


def _in_thread(fn) -> tuple[threading.Thread, list]:
    box: list = []

    def run() -> None:
        try:
            box.append(fn())
        except Exception as exc:
            box.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def _wait_for(condition, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the server's threads did not get there in time"
        time.sleep(0.05)


def test_weight_server_serves_members_and_bounds_a_stalled_one(redis_url):
    from cosmos_primitives.sync import WeightClient, WeightServer, WeightTransferError

    timeout = 2.0
    model = TinyQwen2Like(seed=0)
    engine_model, holder = TinyQwen2Like(seed=1), SimpleNamespace(weight_version=-1)
    a = WeightClient(engine_model, redis_url, PREFIX, member_id="a", engine=holder, timeout_s=timeout)

    # no trainer yet: nothing on offer, waiting and fetching fail clearly
    assert a.published_version() is None and a.weight_version == -1
    with pytest.raises(WeightTransferError, match=f"'a'.*{PREFIX}"):
        a.wait_for_server(timeout_s=0.3)
    with pytest.raises(WeightTransferError, match="no trainer serves"):
        a.fetch()

    with pytest.raises(ValueError, match="nccl"):
        WeightServer(model, redis_url, PREFIX, backend="nccl")  # a CPU model has no NCCL transfer
    server = WeightServer(model, redis_url, PREFIX, bucket_bytes=512, timeout_s=timeout, heartbeat_s=0.2)
    clients = [a]
    try:
        assert server.publish(0).bytes_moved > 0 and a.wait_for_server(timeout_s=5) == 0
        first = a.fetch()
        assert (first.version, first.verified, a.weight_version, holder.weight_version) == (0, True, 0, 0)
        assert _state(engine_model.named_parameters()) == _state(model.named_parameters())

        # a malformed or unsigned request is dropped; a member that asks (signed) and never shows up in
        # the store (is never live) delays no other member's first fetch
        ghost = redis.Redis.from_url(redis_url)
        key = f"{PREFIX}:weights:requests:{server.session}"
        ghost.rpush(key, b"not json", b'{"member": "ghost", "nonce": "n0"}',
                    RunSecret.from_env().sign(key, b'{"member": "ghost", "nonce": "n0"}'))
        ghost.close()
        _wait_for(lambda: server.metrics()["sync/rejected_requests"] == 2)
        time.sleep(0.3)  # the ghost's request now waits for it to show up in the store
        other = WeightClient(TinyQwen2Like(seed=3), redis_url, PREFIX, member_id="other", timeout_s=timeout)
        clients.append(other)
        start = time.monotonic()
        assert other.fetch().version == 0 and time.monotonic() - start < timeout / 2
        _wait_for(lambda: server.metrics()["sync/transfer_failures"] == 1)  # the ghost's request, after `timeout`
        assert "'ghost'" in server.last_failure

        # versions published since the last fetch are skipped; the plan is kept (no new check)
        for version in (1, 2, 3):
            with torch.no_grad():
                model.model.layers[0].mlp.up_proj.weight.mul_(1.5)
            server.publish(version)
        assert a.published_version() == 3
        result = a.refresh()
        assert (result.version, result.verified, holder.weight_version) == (3, False, 3)
        assert _state(engine_model.named_parameters()) == _state(model.named_parameters())
        _wait_for(lambda: server.metrics()["sync/transfers"] == 3)  # counted once the member has them
        assert a.refresh() is None  # nothing new: no request
        time.sleep(0.2)
        assert server.metrics()["sync/transfers"] == 3

        # a member stalled mid-transfer holds snapshot 3: the next publish reuses snapshot 2's
        # buffers at once, the one after waits for snapshot 3 at most `timeout` (then takes fresh
        # buffers); the stalled round's own operation timeout ends it
        held = _HeldEngine()
        stalled = WeightClient(held, redis_url, PREFIX, member_id="stalled", timeout_s=timeout,
                               read_back=held.weights.__getitem__)
        clients.append(stalled)
        stalled_thread, stalled_box = _in_thread(stalled.fetch)
        assert held.inside.wait(30)
        with torch.no_grad():
            model.model.norm.weight.add_(1.0)
        assert server.publish(4).seconds < timeout
        assert server.publish(5).seconds < timeout + 3.0
        _wait_for(lambda: server.metrics()["sync/transfer_failures"] == 2)  # the round's own op timeout
        assert "'stalled'" in server.last_failure
        result = a.fetch()  # the other member is served meanwhile
        assert result.version == 5 and _state(engine_model.named_parameters()) == _state(model.named_parameters())
        held.release.set()
        stalled_thread.join(30)
        assert isinstance(stalled_box[0], WeightTransferError) and "'stalled'" in str(stalled_box[0])
        assert stalled.weight_version == held.weight_version == -1  # part of version 3 was written
        # its next fetch gets the plan again (checked) and loads the current version
        held.inside.clear()
        result = stalled.fetch()
        assert (result.version, result.verified, held.weight_version) == (5, True, 5)
        assert _state(held.weights.items()) == _state(model.named_parameters())

        # a restarted member with the same id gets the plan and the checked transfer again; the
        # other process with that id is unaffected (each fetch is a round of its own)
        restarted_model = TinyQwen2Like(seed=2)
        restarted = WeightClient(restarted_model, redis_url, PREFIX, member_id="a", timeout_s=timeout)
        clients.append(restarted)
        assert restarted.fetch().verified
        assert _state(restarted_model.named_parameters()) == _state(model.named_parameters())
        assert not a.fetch().verified and a.weight_version == 5
        _wait_for(lambda: server.metrics()["sync/transfers"] == 7)
        _wait_for(lambda: server.metrics()["sync/members"] == 0)  # nobody waits or is in a round
        metrics = server.metrics()
        assert metrics["sync/published_version"] == 5.0 and metrics["sync/transfer_failures"] == 2.0
    finally:
        server.close()

    # the trainer stops serving: fetches fail; a restarted trainer (new session) is found again
    with pytest.raises(WeightTransferError, match="no trainer serves"):
        a.fetch()
    # a trainer killed without close(): its record outlives it for a few seconds, and a fetch
    # then fails at once instead of retrying a dead address for the whole timeout
    r = redis.Redis.from_url(redis_url)
    r.set(f"{PREFIX}:weights:server", RunSecret.from_env().sign(
        f"{PREFIX}:weights:server", b'{"session": "dead", "host": "127.0.0.1", "port": %d, "backend": "gloo", '
        b'"version": 5, "pid": 1, "hostname": "gone"}' % free_port()), px=3000)
    r.close()
    start = time.monotonic()
    with pytest.raises(WeightTransferError, match="no weight server listens"):
        a.fetch()
    assert time.monotonic() - start < timeout / 2
    with pytest.raises(WeightTransferError, match="no trainer serves"):
        a.wait_for_server(timeout_s=0.5)  # the record alone is not a serving trainer
    with torch.no_grad():
        model.model.norm.weight.add_(1.0)
    again = WeightServer(model, redis_url, PREFIX, bucket_bytes=512, timeout_s=timeout, heartbeat_s=0.2)
    try:
        again.publish(5)  # a restarted trainer at a version the member has: new weights all the same
        result = a.refresh()
        assert (result.version, result.verified) == (5, True)
        again.publish(6)
        result = a.fetch()
        assert (result.version, result.verified) == (6, False)
        assert _state(engine_model.named_parameters()) == _state(model.named_parameters())
        again.publish(7)
        start = time.monotonic()
        result = a.fetch()
        assert (result.version, result.verified) == (7, False) and time.monotonic() - start < timeout
    finally:
        again.close()
        for client in clients:
            client.close()


def test_the_trainer_sends_each_bucket_once_however_many_members_wait(redis_url):
    """K members waiting for a version: the bytes leaving the trainer are one snapshot, not K (the
    trainer's cost per version does not grow with the rollout jobs); every member holds it exactly,
    the first time (plan and check) and again for a later version."""
    from cosmos_primitives.sync import WeightClient, WeightServer

    members = 3
    model = TinyQwen2Like(seed=0)
    server = WeightServer(model, redis_url, PREFIX, bucket_bytes=512, timeout_s=TIMEOUT_S, heartbeat_s=0.2,
                          max_members=members, gather_s=60.0)  # a round starts once all ``members`` ask
    engines = [TinyQwen2Like(seed=1 + i) for i in range(members)]
    clients = [WeightClient(e, redis_url, PREFIX, member_id=f"m{i}", timeout_s=TIMEOUT_S)
               for i, e in enumerate(engines)]
    try:
        for version in (0, 1):
            with torch.no_grad():
                model.model.norm.weight.add_(1.0)
            snapshot_bytes = server.publish(version).bytes_moved
            before = server.metrics()
            start = time.perf_counter()
            runs = [_in_thread(c.fetch) for c in clients]
            for thread, box in runs:
                thread.join(60)
                assert not isinstance(box[0], Exception), box[0]
                assert box[0].version == version and box[0].verified == (version == 0)
            wall = time.perf_counter() - start
            for engine in engines:
                assert _state(engine.named_parameters()) == _state(model.named_parameters())
            deadline = time.monotonic() + 30  # a member can hold the version before the trainer counted it
            while (after := server.metrics())["sync/rounds"] == before["sync/rounds"] and time.monotonic() < deadline:
                time.sleep(0.01)
            sent = after["sync/bytes_served"] - before["sync/bytes_served"]
            assert sent == snapshot_bytes, f"trainer sent {sent / snapshot_bytes:.1f} snapshots to {members} members"
            # the serving thread's own CPU time for the round (what the benchmark compares across
            # member counts): spent, and no more than the round's wall time
            cpu = after["sync/serve_cpu_s"] - before["sync/serve_cpu_s"]
            assert after["sync/rounds"] - before["sync/rounds"] == 1 and 0 < cpu <= wall, (cpu, wall)
    finally:
        for client in clients:
            client.close()
        server.close()


def test_a_publish_that_stops_waiting_for_a_slow_reader_leaves_its_snapshot_whole(redis_url):
    from cosmos_primitives.sync import WeightClient, WeightServer

    prefix = f"{PREFIX}:slow-reader"
    model = TinyQwen2Like(seed=0)
    server = WeightServer(model, redis_url, prefix, bucket_bytes=512, timeout_s=0.3, heartbeat_s=0.2)
    client = None
    try:
        server.publish(0)
        server.publish(1)
        # what a member's pair thread holds while it sends version 1 (taken by hand: no stall to race)
        reading = server._acquire()
        sent = [b.clone() for b in reading.buffers]
        for version in (2, 3):  # 2 reuses version 0's buffers; 3 gives up waiting for version 1's
            with torch.no_grad():
                model.model.norm.weight.add_(1.0)
            server.publish(version)
        assert server.metrics()["sync/publish_waits_timed_out"] == 1.0
        assert reading.version == 1
        assert all(torch.equal(b, s) for b, s in zip(reading.buffers, sent, strict=True))
        server._release(reading)

        engine_model = TinyQwen2Like(seed=1)
        client = WeightClient(engine_model, redis_url, prefix, member_id="m", timeout_s=5.0)
        first = client.fetch()
        assert (first.version, first.verified) == (3, True)
        assert _state(engine_model.named_parameters()) == _state(model.named_parameters())
        with torch.no_grad():
            model.model.layers[0].mlp.up_proj.weight.mul_(1.5)
        server.publish(4)  # back to double buffering: version 2's buffers, nothing waits
        assert client.fetch().version == 4 and server.metrics()["sync/publish_waits_timed_out"] == 1.0
        assert _state(engine_model.named_parameters()) == _state(model.named_parameters())
    finally:
        server.close()
        if client is not None:
            client.close()


_DOOMED_TRAINER = """
import sys, time
sys.path.insert(0, sys.argv[3])
from cosmos_primitives.sync import WeightServer
from test_sync_broadcast import TinyQwen2Like
server = WeightServer(TinyQwen2Like(seed=0), sys.argv[1], sys.argv[2], bucket_bytes=512, heartbeat_s=0.2)
server.publish(4)
print(server.record_ttl_s, flush=True)
time.sleep(600)
"""


def test_a_sigkilled_trainer_s_advertisement_expires(redis_url):
    prefix = f"{PREFIX}:killed"
    r = redis.Redis.from_url(redis_url)
    proc = subprocess.Popen([sys.executable, "-c", _DOOMED_TRAINER, redis_url, prefix, os.path.dirname(__file__)],
                            stdout=subprocess.PIPE, text=True)
    try:
        ttl_s = float(proc.stdout.readline())
        key = f"{prefix}:weights:server"
        from cosmos_primitives.sync.transfer_protocol import decode_record
        assert decode_record(r.get(key), RunSecret.from_env(), prefix).version == 4
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        # nothing renews it now: it expires within the ttl it was last written with (5 s), and is gone after
        assert 0 < r.pttl(key) <= 1000 * ttl_s
        deadline = time.monotonic() + ttl_s + 5
        while r.exists(key):
            assert time.monotonic() < deadline, f"the record of a killed trainer outlived its {ttl_s} s ttl"
            time.sleep(0.1)
    finally:
        proc.kill()
        proc.wait(timeout=10)
        r.close()


def test_the_advertised_address_reaches_this_machine(monkeypatch):
    """The default transfer host is an address a listener on every interface answers at (not
    merely what the hostname resolves to); ``host`` and ``$COSMOS_TRANSFER_HOST`` win over it."""
    import socket

    from cosmos_primitives.sync.stateless_group import HOST_ENV, local_address_toward, transfer_host

    monkeypatch.delenv(HOST_ENV, raising=False)
    with socket.create_server(("0.0.0.0", 0)) as listener:
        port = listener.getsockname()[1]
        socket.create_connection((transfer_host(), port), timeout=5).close()
    assert local_address_toward("127.0.0.1") == "127.0.0.1"
    if local_address_toward("10.255.255.255"):  # a machine with a default route (this one's hostname
        assert not transfer_host().startswith("127.")  # resolves to 127.0.0.1): never a loopback address
    assert transfer_host("trainer-7") == "trainer-7"
    monkeypatch.setenv(HOST_ENV, "10.1.2.3")
    assert transfer_host() == "10.1.2.3" and transfer_host("trainer-7") == "trainer-7"


@pytest.mark.parametrize("variant", ["qwen2_5_vl", "qwen3_vl_tied", "qwen3_vl_untied"])
def test_a_vl_model_is_served_in_vllms_layout_bit_for_bit(variant: str, redis_url, standin_vllm):
    """A VL trainer served in the ``"vllm"`` layout (fused, renamed) reaches a member whose engine holds
    exactly the tensors vLLM's model does (names taken from the vLLM stand-in), bit for bit, in
    bf16 on the wire; the untied Qwen3-VL's separate ``lm_head`` included."""
    from cosmos_primitives.sync import WeightClient, WeightServer
    from test_rollout_vllm_standin import _vllm_names, tiny_model
    from test_sync_broadcast import _module_with

    trainer = tiny_model(variant, seed=0)
    held = standin_vllm._VLLMModel(tiny_model(variant, seed=1)).by_name  # vLLM's tensors for this model
    engine_model = _module_with({n: tuple(t.shape) for n, t in held.items()}, torch.bfloat16)
    server = WeightServer(trainer, redis_url, f"{PREFIX}:{variant}", layout="vllm", transfer_dtype=torch.bfloat16,
                          bucket_bytes=1 << 20, timeout_s=30.0, heartbeat_s=0.2)
    client = WeightClient(engine_model, redis_url, f"{PREFIX}:{variant}", member_id="m", timeout_s=30.0)
    try:
        server.publish(1)
        assert client.fetch().verified
    finally:
        client.close()
        server.close()
    got = _state(engine_model.named_parameters())
    expected = _state((n, t.detach().to(torch.bfloat16)) for n, t in _vllm_names(trainer).items())
    assert got == expected
    assert ("language_model.lm_head.weight" in got) == (variant == "qwen3_vl_untied")
