"""Prompt claims against a real redis-server: every epoch covered once by several claimants, expired
and released claims re-issued first (a late complete returns False), renewal (its rounds driven by
hand), max_epochs, a new object continuing the position, concurrent claimants in threads and
processes, clearing a run."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest
import redis

from cosmos_primitives.config import RedisConfig, run_stream
from cosmos_primitives.data import ResumableDistributedSampler
from cosmos_primitives.queue import Claim, JobRegistry, PromptClaims, RedisRolloutQueue
from cosmos_primitives.queue.run_control import RunControl

RUN = run_stream("claims-test")


def make_claims(url: str, **kw) -> PromptClaims:
    settings = {"dataset_size": 23, "range_size": 4, "seed": 7, **kw}
    return PromptClaims(url, RUN, **settings)


def test_run_stream_names_the_prefix_and_refuses_bad_names() -> None:
    assert run_stream("exp-1.a") == "cosmos:exp-1.a"
    for bad in ("", "two words", "tab\there", "a:b"):
        with pytest.raises(ValueError, match="run name"):
            run_stream(bad)


def test_several_claimants_cover_each_epoch_exactly_once_in_the_seeded_order(redis_url: str) -> None:
    jobs = [make_claims(redis_url, max_epochs=2) for _ in range(3)]
    claims: list[Claim] = []
    turn = 0
    while (claim := jobs[turn % 3].claim(f"job{turn % 3}")) is not None:
        assert jobs[turn % 3].complete(claim)
        claims.append(claim)
        turn += 1
    assert [c.range_id for c in claims] == list(range(12))  # 6 ranges per epoch (23 / 4, the last has 3)
    for epoch in (0, 1):
        in_epoch = [c for c in claims if c.epoch == epoch]
        order = [i for c in in_epoch for i in c.indices]
        assert order == ResumableDistributedSampler(23, seed=7).epoch_indices(epoch)  # the sampler's permutation
        assert sorted(order) == list(range(23))
    assert claims[0].indices != claims[6].indices  # reshuffled per epoch
    assert {c.job_id for c in claims} == {"job0", "job1", "job2"}
    position = jobs[0].position()
    assert (position["epoch"], position["next_range"], position["completed"], position["in_flight"]) == (2, 12, 12, 0)
    assert jobs[1].exhausted()


def test_an_expired_claim_is_reissued_before_new_ranges_and_its_late_complete_returns_false(redis_url: str) -> None:
    claims = make_claims(redis_url, claim_ttl_s=0.3)
    first = claims.claim("A")
    second = claims.claim("B")
    assert (first.range_id, second.range_id) == (0, 1)  # A's claim is live: B gets a new range
    time.sleep(0.45)
    again = claims.claim("C")
    assert (again.range_id, again.indices, again.job_id, again.reissued) == (0, first.indices, "C", True)
    assert claims.position()["expired"] == 1  # B's range waits for the next claimant
    assert claims.claim("D").range_id == 1
    assert not claims.holds(first) and claims.holds(again)  # A can tell before putting duplicates
    assert claims.complete(first) is False  # A was too late: C holds range 0 now
    assert claims.complete(again) is True
    assert not claims.holds(again)  # completed: nobody holds it
    position = claims.position()
    assert (position["late_completes"], position["reissued"], position["completed"]) == (1, 2, 1)
    assert position["next_range"] == 2


def test_an_expired_claim_that_nobody_took_can_still_be_completed(redis_url: str) -> None:
    claims = make_claims(redis_url, claim_ttl_s=0.2)
    claim = claims.claim("A")
    time.sleep(0.3)
    assert claims.complete(claim)  # its records are on the queue; nobody else produced them
    assert claims.claim("B").range_id == 1


def test_renew_keeps_the_claims_of_a_live_job(redis_url: str) -> None:
    """Every deadline is moved into the past by hand (the ttl went by; no race with the clock); a renewal
    gives the renewing job's claims the whole ttl again, so only the silent job's range is re-issued."""
    client = redis.Redis.from_url(redis_url)
    claims = make_claims(redis_url, claim_ttl_s=60)
    held = [claims.claim("A"), claims.claim("A")]
    other = claims.claim("B")
    for claim in (*held, other):
        _expired(client, claims, claim)
    assert claims.renew("A") == 2
    assert all(59_000 < _ms_left(client, claims, c) <= 60_000 for c in held)
    taken = [claims.claim("C"), claims.claim("C")]
    # B did not renew: its range went to C; A's two ranges were never re-issued
    assert [(c.range_id, c.reissued) for c in taken] == [(other.range_id, True), (3, False)]
    assert claims.complete(held[0]) and claims.complete(held[1])
    assert not claims.complete(other)
    client.close()


def test_release_hands_claims_back_at_once(redis_url: str) -> None:
    claims = make_claims(redis_url, claim_ttl_s=60)
    mine = [claims.claim("A"), claims.claim("A")]
    assert claims.release("A") == 2
    assert claims.release("A") == 0
    taken = [claims.claim("B"), claims.claim("B")]
    assert sorted(c.range_id for c in taken) == [0, 1] and all(c.reissued for c in taken)
    assert claims.claim("B").range_id == 2
    assert not claims.complete(mine[0])
    assert claims.position()["released"] == 2


def test_max_epochs_ends_claims_and_exhausted_waits_for_the_last_in_flight(redis_url: str) -> None:
    claims = make_claims(redis_url, dataset_size=4, range_size=2, max_epochs=1, claim_ttl_s=0.3)
    a, b = claims.claim("A"), claims.claim("B")
    assert claims.claim("C") is None
    assert not claims.exhausted()  # B's range is still in flight and may expire
    assert claims.complete(a)
    time.sleep(0.45)
    rescued = claims.claim("C")
    assert (rescued.range_id, rescued.indices) == (b.range_id, b.indices)
    assert claims.claim("C") is None and not claims.exhausted()
    assert claims.complete(rescued)
    assert claims.exhausted()


def test_a_new_object_continues_the_position_and_refuses_other_settings(redis_url: str) -> None:
    before = make_claims(redis_url)
    done = [before.claim("A") for _ in range(3)]
    assert before.complete(done[0]) and before.complete(done[1])
    before.close()
    after = make_claims(redis_url)  # a restarted job
    position = after.position()
    assert (position["next_range"], position["in_flight"], position["completed"]) == (3, 1, 2)
    assert after.claim("A2").range_id == 3  # done[2] is still held, not re-issued
    assert after.complete(done[2])
    with pytest.raises(ValueError, match=r"seed 7 there, 8 here.*same dataset"):
        make_claims(redis_url, seed=8)
    with pytest.raises(ValueError, match="dataset_size 23 there, 24 here"):
        make_claims(redis_url, dataset_size=24)


def test_record_ids_name_epoch_and_index_so_a_replayed_range_repeats_them(redis_url: str) -> None:
    claims = make_claims(redis_url, claim_ttl_s=0.2)
    first = claims.claim("A")
    time.sleep(0.3)
    replay = claims.claim("B")
    assert [claims.record_id(first, i) for i in first.indices] == [claims.record_id(replay, i) for i in replay.indices]
    assert claims.record_id(first, first.indices[0]) == f"e0-i{first.indices[0]}"
    missing = next(i for i in range(23) if i not in first.indices)
    with pytest.raises(ValueError, match=f"dataset index {missing} is not in claim 0"):
        claims.record_id(first, missing)


def test_bad_settings_are_refused_by_name(redis_url: str) -> None:
    with pytest.raises(ValueError, match=r"range_size = 0.*claim_ttl_s = 0"):
        make_claims(redis_url, range_size=0, claim_ttl_s=0)
    with pytest.raises(ValueError, match="job_id is empty"):
        make_claims(redis_url).claim("")


def test_concurrent_threads_never_get_the_same_range(redis_url: str) -> None:
    got: dict[int, list[int]] = {t: [] for t in range(8)}

    def run(t: int) -> None:
        claims = make_claims(redis_url, dataset_size=300, range_size=1, max_epochs=1)
        while (claim := claims.claim(f"t{t}")) is not None:
            got[t].append(claim.range_id)
            claims.complete(claim)
        claims.close()

    threads = [threading.Thread(target=run, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    counts = Counter(r for ids in got.values() for r in ids)
    assert sorted(counts) == list(range(300)) and set(counts.values()) == {1}
    assert sum(1 for ids in got.values() if ids) >= 2  # they really ran side by side


_CLAIMANT = """
import json, sys
from cosmos_primitives.queue.prompt_claims import PromptClaims
claims = PromptClaims(sys.argv[1], sys.argv[2], dataset_size=400, range_size=2, seed=3, max_epochs=1)
out = []
while (claim := claims.claim(sys.argv[3])) is not None:
    out.append([claim.range_id, list(claim.indices)])
    claims.complete(claim)
print(json.dumps(out))
"""


@pytest.mark.slow  # each process imports torch for the permutation (~20 s on a loaded machine)
def test_concurrent_processes_never_get_the_same_range(redis_url: str) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", _CLAIMANT, redis_url, RUN, f"p{i}"], stdout=subprocess.PIPE,
                              text=True) for i in range(3)]
    results = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    ranges = Counter(r for result in results for r, _ in result)
    assert sorted(ranges) == list(range(200)) and set(ranges.values()) == {1}
    indices = sorted(i for result in results for _, idx in result for i in idx)
    assert indices == list(range(400))


def test_clear_stream_forgets_claims_and_jobs_of_the_run(redis_url: str) -> None:
    claims = make_claims(redis_url)
    claims.claim("A")
    registry = JobRegistry(redis_url, RUN)
    registry.join("rollout", job_id="r1")
    other = PromptClaims(redis_url, run_stream("another"), dataset_size=5, range_size=1, seed=0)
    other.claim("X")
    with RedisRolloutQueue(RedisConfig(stream=RUN), url=redis_url) as queue, RunControl(queue) as control:
        from test_queue_redis import make_record

        queue.put(make_record(0))
        queue.ack(queue.get(1, timeout=2), step=1)  # trained ids with their step, which a resume reads
        assert control.clear_stream() >= 5  # meta, next, deadlines, owners, job key, job set
    client = redis.Redis.from_url(redis_url)
    assert client.keys(f"{RUN}*") == []
    assert other.position()["in_flight"] == 1  # another run's keys are left alone
    assert registry.live() == {}
    fresh = make_claims(redis_url, seed=99)  # a fresh run may change the settings
    assert fresh.claim("A").range_id == 0


def _ms_left(client: redis.Redis, claims: PromptClaims, claim: Claim) -> float:
    seconds, micros = client.time()
    return client.zscore(claims.keys["deadlines"], claim.range_id) - (seconds * 1000 + micros / 1000)


def _expired(client: redis.Redis, claims: PromptClaims, claim: Claim) -> None:
    """Move ``claim``'s deadline 1 ms into the past, as if its whole ttl went by without a renewal."""
    seconds, micros = client.time()
    client.zadd(claims.keys["deadlines"], {str(claim.range_id): seconds * 1000 + micros // 1000 - 1})


def _nearly_expired(client: redis.Redis, claims: PromptClaims, claim: Claim) -> None:
    """Move ``claim``'s deadline to 0.5 s from now, as if most of its ttl went by without a renewal."""
    seconds, micros = client.time()
    client.zadd(claims.keys["deadlines"], {str(claim.range_id): seconds * 1000 + micros // 1000 + 500})


def test_renewal_rounds_come_three_per_ttl_and_each_restarts_the_ttl(redis_url: str, monkeypatch) -> None:
    """The renewal thread's rounds driven by hand (no race with the clock): its interval is a third of
    the ttl, so two late rounds in a row still lose no claim; a round gives every claim of the job
    the whole ttl again; stopping and closing end the thread."""
    from cosmos_primitives.queue import prompt_claims

    started = []

    class Rounds:  # stands in for the thread; the test runs each round itself
        def __init__(self, what: str, interval_s: float, fn) -> None:
            self.interval_s, self.fn, self.stopped = interval_s, fn, False
            started.append(self)

        def stop(self) -> None:
            self.stopped = True

    monkeypatch.setattr(prompt_claims, "Periodic", Rounds)
    client = redis.Redis.from_url(redis_url)
    claims = make_claims(redis_url, claim_ttl_s=30)
    held = [claims.claim("A"), claims.claim("A")]
    other = claims.claim("B")
    claims.start_renewal("A")
    assert started[0].interval_s == claims.claim_ttl_s / 3
    for claim in (*held, other):
        _nearly_expired(client, claims, claim)
    started[0].fn()
    assert all(29_000 < _ms_left(client, claims, c) <= 30_000 for c in held)
    assert _ms_left(client, claims, other) <= 500  # another job's claim is not renewed
    claims.stop_renewal("A")
    assert started[0].stopped
    claims.start_renewal("A", interval_s=2.5)
    assert started[1].interval_s == 2.5 and not started[1].stopped
    claims.close()
    assert started[1].stopped
    client.close()


def test_the_renewal_thread_renews_until_stopped(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    claims = make_claims(redis_url, claim_ttl_s=30)
    held = claims.claim("A")
    _nearly_expired(client, claims, held)
    claims.start_renewal("A", interval_s=0.05)
    deadline = time.monotonic() + 10
    while _ms_left(client, claims, held) < 29_000:  # waits for a round, whenever it comes
        assert time.monotonic() < deadline, "the renewal thread never renewed the claim"
        time.sleep(0.02)
    claims.stop_renewal("A")
    _nearly_expired(client, claims, held)
    time.sleep(0.2)  # four rounds' time: a thread still running would have renewed it
    assert _ms_left(client, claims, held) <= 500
    claims.close()
    client.close()


def test_restore_puts_back_a_saved_position_only_where_redis_lost_it(redis_url: str) -> None:
    claims = make_claims(redis_url)
    for _ in range(4):
        claims.complete(claims.claim("A"))
    saved = claims.position()["next_range"]
    assert not claims.restore(1)  # the run has a position: Redis is newer than any checkpoint
    claims.clear()  # what a Redis restart without persistence leaves
    assert claims.restore(saved)
    assert claims.claim("A").range_id == saved == 4


def _produce(claims: PromptClaims, queue: RedisRolloutQueue, claim: Claim, version: int) -> list[str]:
    """What a rollout job does with a claim: one record per prompt, its id fixed by epoch and prompt."""
    from test_queue_redis import make_record

    records = []
    for index in claim.indices:
        record = make_record(index, version=version)
        record.record_id = claims.record_id(claim, index)
        records.append(record)
    queue.put_many(records)
    assert claims.complete(claim)
    return [r.record_id for r in records]


def test_range_of_inverts_record_id_over_the_epoch_permutation(redis_url: str) -> None:
    claims = make_claims(redis_url, dataset_size=10, range_size=3)
    for _ in range(8):  # into the second epoch
        claim = claims.claim("job")
        assert {claims.range_of(claims.record_id(claim, i)) for i in claim.indices} == {claim.range_id}
    assert claims.range_of("not-a-claim-id") is None and claims.range_of("e0-i10") is None
    claims.close()


def test_a_resume_from_an_older_checkpoint_trains_the_rolled_back_prompts_again(redis_url: str) -> None:
    """Issue 30 item 6: records trained after the checkpoint stayed in the trained set when the trainer
    resumed from it (their training was rolled back with the weights): their prompts were never trained
    again. roll_back_to takes their training back and hands their ranges out again; the trained prompts
    of a re-issued range are skipped as duplicates, so each prompt is trained once."""
    from cosmos_primitives.queue.rollback import roll_back_to

    cfg = RedisConfig(url=redis_url, stream=RUN, block_s=0.1, claim_idle_s=30.0)
    claims = make_claims(redis_url, dataset_size=8, range_size=2)
    trained: list[str] = []
    with RedisRolloutQueue(cfg, consumer="trainer-0") as trainer, RedisRolloutQueue(cfg) as rollout:
        for step in (1, 2, 3):  # one range a step; the checkpoint is at step 1
            _produce(claims, rollout, claims.claim("job-a"), version=step - 1)
            batch = trainer.get(2, timeout=2)
            trainer.ack(batch, step=step)
            trained += [r.record_id for r in batch]
        assert sorted(trainer.trained_after(1)) == sorted(trained[2:])
    # the trainer is killed and resumed from step 1: steps 2 and 3 are lost with their weights
    with RedisRolloutQueue(cfg, consumer="trainer-0") as resumed, RedisRolloutQueue(cfg) as rollout:
        assert sorted(roll_back_to(resumed, claims, 1)) == sorted(trained[2:])
        again = [claims.claim("job-b"), claims.claim("job-b")]
        assert sorted(c.range_id for c in again) == [1, 2] and all(c.reissued for c in again)
        for claim in again:
            _produce(claims, rollout, claim, version=1)
        new = _produce(claims, rollout, claims.claim("job-b"), version=1)  # then the next new range, 3
        retrained = [r.record_id for r in resumed.get(6, timeout=2)]
        assert sorted(retrained) == sorted(trained[2:] + new)
        assert resumed.get(1, timeout=0.3) == []  # nothing else is delivered
        assert set(retrained) | set(trained[:2]) == {f"e0-i{i}" for i in range(8)}
    claims.close()


def test_records_from_lost_weights_are_returned_and_their_prompts_generated_again(redis_url: str) -> None:
    """Issue 30 item 6: records sampled with weights newer than the resumed trainer's were acknowledged as
    "future" and dropped, their prompts lost. fetch_records hands them to regenerate instead."""
    from cosmos_primitives.data import BadSampleTracker, MediaSettings
    from cosmos_primitives.queue import StalenessFilter, fetch_records
    from cosmos_primitives.queue.rollback import regenerate

    cfg = RedisConfig(url=redis_url, stream=RUN, block_s=0.1, claim_idle_s=30.0)
    claims = make_claims(redis_url, dataset_size=8, range_size=2)
    with RedisRolloutQueue(cfg, consumer="trainer-0") as trainer, RedisRolloutQueue(cfg) as rollout:
        future = _produce(claims, rollout, claims.claim("job-a"), version=5)  # made by weights the trainer lost
        with pytest.raises(TimeoutError):  # nothing it may train at step 2 arrives
            fetch_records(trainer, StalenessFilter(2), 2, trainer_step=2, settings=MediaSettings(),
                          bad=BadSampleTracker(0), timeout_s=0.5,
                          on_dropped=lambda dropped: regenerate(trainer, claims, dropped))
        assert trainer.group_counters()["returned"] == 2 and trainer.pending() == 0
        claim = claims.claim("job-b")
        assert (claim.range_id, claim.reissued) == (0, True)
        assert _produce(claims, rollout, claim, version=2) == future  # the same prompts, the same ids
        again = trainer.get(2, timeout=2)
        assert sorted(r.record_id for r in again) == sorted(future) and {r.weight_version for r in again} == {2}
    claims.close()


def test_the_trainers_account_of_trained_prompts_survives_a_checkpoint_and_refuses_another_runs() -> None:
    """The trainer's own account (issue 30, prompt claims) lives in its checkpoint: a JSON round trip
    keeps which prompts were trained and the epoch it is on; an account of other settings or with
    damaged bits is refused, naming why."""
    from cosmos_primitives.queue.trained_prompts import TrainedPrompts

    account = TrainedPrompts(dataset_size=10, range_size=4, seed=7)
    account.mark([f"e0-i{i}" for i in range(10)] + ["e1-i3", "e1-i3", "rec-9", "e1-i99"])
    assert account.low == 1 and account.is_trained("e0-i5") and account.is_trained("e1-i3")
    assert not account.is_trained("e1-i4") and not account.is_trained("rec-9")
    resumed = TrainedPrompts(dataset_size=10, range_size=4, seed=7)
    resumed.load_state_dict(json.loads(json.dumps(account.state_dict())))
    assert resumed.low == 1 and resumed.is_trained("e1-i3") and not resumed.is_trained("e1-i4")
    assert resumed.untrained_ranges(1) == [3, 4, 5]
    resumed.mark([f"e1-i{i}" for i in range(10)])
    assert resumed.low == 2
    with pytest.raises(ValueError, match=r"dataset_size, range_size, seed \[10, 4, 7\].*\[11, 4, 7\]"):
        TrainedPrompts(dataset_size=11, range_size=4, seed=7).load_state_dict(account.state_dict())
    damaged = account.state_dict()
    damaged["epochs"]["1"] = "AAAA"
    with pytest.raises(ValueError, match="epoch 1 hold 3 bytes, not 2"):
        TrainedPrompts(dataset_size=10, range_size=4, seed=7).load_state_dict(damaged)


def test_the_trainers_audit_moves_a_position_behind_its_epoch_forward_unless_resumed_from_an_older_checkpoint(
        redis_url: str) -> None:
    """A claims position behind the epoch the trainer is on (an attacker reset it) is moved forward:
    the epochs before are all trained. A trainer resumed from a checkpoint without the account starts
    it at the next epoch and leaves the claims' partly handed-out epoch alone."""
    from cosmos_primitives.queue.trained_prompts import TrainedPrompts

    claims = make_claims(redis_url)  # 23 prompts in ranges of 4: 6 ranges an epoch
    for _ in range(3):
        claims.complete(claims.claim("job"))
    legacy = TrainedPrompts(dataset_size=23, range_size=4, seed=7, first_epoch=1, position_behind=True)
    assert legacy.audit(claims, grace_steps=1) == []
    assert claims.position()["next_range"] == 3  # ranges 3-5 of epoch 0 are still handed out
    account = TrainedPrompts(dataset_size=23, range_size=4, seed=7, first_epoch=1)
    assert account.audit(claims, grace_steps=1) == []
    assert claims.position()["next_range"] == 6
    claims.close()


def test_the_trainers_audit_reissues_a_lost_range_then_gives_it_up_naming_its_prompts(redis_url: str,
                                                                                        caplog) -> None:
    """A range handed out and completed whose records never reach the trainer (lost claims, or prompts
    the rollout side skips) is re-issued after ``grace_steps`` audits, at most ``max_reissues`` times;
    then its prompts are given up with an error naming them, so that the epoch can end."""
    import logging

    from cosmos_primitives.queue.trained_prompts import TrainedPrompts

    claims = make_claims(redis_url, dataset_size=8, range_size=4)  # 2 ranges an epoch
    first = claims.claim("job")
    claims.complete(first)  # its records never come
    account = TrainedPrompts(dataset_size=8, range_size=4, seed=7)
    other_rank = TrainedPrompts(dataset_size=8, range_size=4, seed=7)
    reissued = []
    with caplog.at_level(logging.WARNING, logger="cosmos.queue"):
        for _ in range(8):
            reissued += account.audit(claims, grace_steps=2, max_reissues=2)
            other_rank.give_up(account.last_given_up)  # what the trainer broadcasts from rank 0
            again = claims.claim("job")
            if again is not None and again.range_id == first.range_id:
                claims.complete(again)
    assert reissued == [first.range_id, first.range_id]
    assert account.abandoned == 4 and account.untrained_ranges(0) == [1]
    assert other_rank.state_dict() == account.state_dict()
    assert f"prompt range {first.range_id} of epoch 0 still has untrained prompts" in caplog.text
    assert all(f"e0-i{i}" in caplog.text for i in first.indices)
    claims.close()
