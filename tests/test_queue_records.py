"""Rollout records (encoding, validation, conversion from a RolloutGroup), the staleness filter and
the rollout-worker throttle, on the in-memory queue (no Redis needed)."""

from __future__ import annotations

import threading

import msgspec
import numpy as np
import pytest

from cosmos_primitives.config import GRPOConfig
from cosmos_primitives.queue import (
    InMemoryRolloutQueue,
    MalformedRecordError,
    RolloutRecord,
    RolloutThrottle,
    StalenessFilter,
    check_record,
    decode_record,
    encode_record,
    expected_staleness,
    media_references,
    record_byte_limit,
    record_from_group,
)


def make_record(i: int, version: int = 0, n: int = 2, tokens: int = 3) -> RolloutRecord:
    return RolloutRecord(
        record_id=f"r{i:04d}",
        prompt_id=f"p{i}",
        group_id=f"p{i}:g",
        weight_version=version,
        prompt_token_ids=[1, 2, 3],
        completions=[f"answer {k}" for k in range(n)],
        completion_token_ids=[[10 + k] * tokens for k in range(n)],
        logprobs=[[-0.5] * tokens for _ in range(n)],
        finish_reasons=["stop"] * n,
        rewards=[float(k) for k in range(n)],
        advantages=[float(k) - (n - 1) / 2 for k in range(n)],
        media=["s3://bucket/clip.mp4"],
        conversation=[{"role": "user", "content": [{"type": "video", "video": "s3://bucket/clip.mp4"},
                                                   {"type": "text", "text": f"question {i}"}]}],
    )


# -- records ------------------------------------------------------------------------------------


def test_record_round_trips_through_msgpack() -> None:
    record = make_record(7, version=3)
    record.meta["reference"] = "B"
    data = encode_record(record)
    assert isinstance(data, bytes)
    back = decode_record(data, entry_id="1-0")
    assert back == record
    assert back.num_completions == 2 and back.num_tokens == 6


def test_record_rejects_inconsistent_lengths_on_construction() -> None:
    with pytest.raises(ValueError, match="completion 1 has 3 token ids but 2 log-probs"):
        RolloutRecord(record_id="r", prompt_id="p", weight_version=0, prompt_token_ids=[1], completions=["a", "b"],
                      completion_token_ids=[[1, 2, 3], [1, 2, 3]], logprobs=[[0.0] * 3, [0.0] * 2],
                      finish_reasons=["stop", "stop"], rewards=[0.0, 1.0], advantages=[0.0, 0.0])
    with pytest.raises(ValueError, match="rewards has 1 entries but there are 2 completions"):
        RolloutRecord(record_id="r", prompt_id="p", weight_version=0, prompt_token_ids=[1], completions=["a", "b"],
                      completion_token_ids=[[1], [2]], logprobs=[[0.0], [0.0]], finish_reasons=["stop"] * 2,
                      rewards=[0.0], advantages=[0.0, 0.0])
    with pytest.raises(ValueError, match=r"advantages\[0\] is nan"):
        RolloutRecord(record_id="r", prompt_id="p", weight_version=0, prompt_token_ids=[1], completions=["a"],
                      completion_token_ids=[[1]], logprobs=[[0.0]], finish_reasons=["stop"],
                      rewards=[0.0], advantages=[float("nan")])


def test_decode_names_entry_id_and_what_is_wrong() -> None:
    with pytest.raises(MalformedRecordError, match=r"queue entry 17-3: payload of 3 bytes is not msgpack") as info:
        decode_record(b"\xc1xx", entry_id="17-3")
    assert info.value.entry_id == "17-3"

    bad_type = msgspec.to_builtins(make_record(1))
    bad_type["weight_version"] = "three"
    with pytest.raises(MalformedRecordError, match=r"entry 9-0: .*\$\.weight_version"):
        decode_record(msgspec.msgpack.encode(bad_type), entry_id="9-0")

    short = msgspec.to_builtins(make_record(1))
    short["logprobs"][0] = short["logprobs"][0][:-1]
    with pytest.raises(MalformedRecordError, match=r"entry 9-1: .*completion 0 has 3 token ids but 2 log-probs"):
        decode_record(msgspec.msgpack.encode(short), entry_id="9-1")

    missing = msgspec.to_builtins(make_record(1))
    del missing["prompt_id"]
    with pytest.raises(MalformedRecordError, match="missing required field `prompt_id`"):
        decode_record(msgspec.msgpack.encode(missing), entry_id="9-2")


@pytest.mark.parametrize("where", ["prompt_token_ids", "completion_token_ids"])
def test_token_id_equal_to_vocab_size_is_refused_and_the_last_row_accepted(where) -> None:
    # an id of vocab_size indexes one row past the embedding: a device-side assert on a GPU
    vocab = 50

    def payload(top: int) -> bytes:
        fields = msgspec.to_builtins(make_record(1))
        if where == "prompt_token_ids":
            fields["prompt_token_ids"][-1] = top
        else:
            fields["completion_token_ids"][1][0] = top
        return msgspec.msgpack.encode(fields)

    kept = decode_record(payload(vocab - 1), entry_id="3-0", vocab_size=vocab)
    assert max(max(kept.prompt_token_ids), *map(max, kept.completion_token_ids)) == vocab - 1
    with pytest.raises(MalformedRecordError, match=f"token id {vocab}, outside the vocabulary of {vocab} tokens"):
        decode_record(payload(vocab), entry_id="3-1", vocab_size=vocab)
    record = make_record(1)
    record.completion_token_ids[0][0] = vocab
    with pytest.raises(ValueError, match=r"completion_token_ids\[0\] holds the token id 50"):
        check_record(record, vocab_size=vocab)
    check_record(make_record(1), vocab_size=12)  # its largest id is 11


@pytest.mark.parametrize("field, value", [("advantages", [1e300, 0.0]), ("rewards", [-1e39, 0.0]),
                                          ("logprobs", [[-1e300, -0.5, -0.5], [-0.5] * 3])])
def test_values_finite_in_float64_but_not_in_float32_are_refused(field: str, value) -> None:
    """Issue 30 item 4: 1e300 passed the float64 finiteness check and became inf in the trainer's float32."""
    payload = msgspec.msgpack.encode({**msgspec.structs.asdict(make_record(1)), field: value})
    with pytest.raises(MalformedRecordError, match=rf"{field}\[0\].*float32"):
        decode_record(payload, "7-0")
    largest = msgspec.msgpack.encode({**msgspec.structs.asdict(make_record(1)), "advantages": [3.4e38, -3.4e38]})
    assert decode_record(largest).advantages == [3.4e38, -3.4e38]  # still float32


def test_records_larger_than_the_trainer_takes_are_refused_before_or_after_decoding() -> None:
    """Issue 30 item 4: a 40 MB record was accepted; the bounds come from the trainer's sequence length."""
    assert record_byte_limit(4096, 8) == 64 * 4096 * 9 + (64 << 10)
    limit = record_byte_limit(64, 2)
    huge = make_record(2)
    huge.conversation = [{"role": "user", "content": [{"type": "video", "video": "s3://bucket/clip.mp4"},
                                                      {"type": "text", "text": "x" * (40 << 20)}]}]
    payload = encode_record(huge)
    assert len(payload) > 40 << 20
    decode_record(payload)  # no bound given: as before
    with pytest.raises(MalformedRecordError, match=rf"payload of {len(payload)} bytes exceeds the trainer's bound "
                       rf"of {limit} bytes"):
        decode_record(payload, "9-0", max_bytes=limit)
    long = encode_record(make_record(3, tokens=62))  # prompt 3 + 62 tokens > 64
    assert len(long) < limit
    with pytest.raises(MalformedRecordError, match=r"prompt \(3 tokens\) and completion 0 \(62 tokens\) exceed the "
                       r"trainer's 64-token sequences"):
        decode_record(long, "9-1", max_tokens=64, max_bytes=limit)
    assert decode_record(encode_record(make_record(4, tokens=61)), max_tokens=64, max_bytes=limit).num_tokens == 122


def test_record_from_rollout_group_carries_references_not_media() -> None:
    import torch

    from cosmos_primitives.data.records import Completion, Prompt, RolloutGroup

    conversation = [
        {"role": "user", "content": [{"type": "video", "video": "clips/a.mp4"},
                                     {"type": "image", "image": "https://host/x.png"},
                                     {"type": "text", "text": "Which colour?"}]},
    ]
    prompt = Prompt(conversation=conversation, prompt_id="q12", videos=[np.zeros((2, 4, 4, 3), np.uint8)],
                    reference="red")
    group = RolloutGroup(
        prompt=prompt, prompt_token_ids=[5, 6, 7],
        completions=[Completion("red", [11, 12], [-0.1, -0.2], "stop"),
                     Completion("blue", [13], [-0.7], "length")],
        weight_version=4,
    )
    record = record_from_group(group, rewards=torch.tensor([1.0, 0.0]), advantages=np.array([0.7, -0.7]))
    assert record.media == ["clips/a.mp4", "https://host/x.png"]
    assert record.weight_version == 4 and record.prompt_id == "q12" and record.group_id.startswith("q12:")
    assert record.completion_token_ids == [[11, 12], [13]] and record.logprobs == [[-0.1, -0.2], [-0.7]]
    assert record.finish_reasons == ["stop", "length"] and record.rewards == [1.0, 0.0]
    assert record.advantages == pytest.approx([0.7, -0.7])
    assert record.meta == {"reference": "red"} and record.conversation == conversation
    assert decode_record(encode_record(record)) == record
    assert record_from_group(group, [1, 0], [0, 0]).record_id != record.record_id

    with pytest.raises(ValueError, match="rewards has 3 entries but the group has 2 completions"):
        record_from_group(group, [1, 0, 0], [0, 0])

    inline = Prompt(conversation=[{"role": "user", "content": [{"type": "image", "image": np.zeros((2, 2, 3))}]}])
    inline_group = RolloutGroup(prompt=inline, prompt_token_ids=[1], completions=group.completions, weight_version=0)
    with pytest.raises(ValueError, match=r"message 0 part 0 \(image\) holds a ndarray"):
        record_from_group(inline_group, [1, 0], [0, 0])
    with pytest.raises(ValueError, match="never media bytes"):
        record_from_group(inline_group, [1, 0], [0, 0], media=["a.png"])


def test_media_references_accepts_openai_style_urls() -> None:
    conv = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file:///a.png"}}]},
            {"role": "assistant", "content": "plain text"}]
    assert media_references(conv) == ["file:///a.png"]


# -- staleness ------------------------------------------------------------------------------------


def test_staleness_filter_drops_counts_and_reports() -> None:
    filt = StalenessFilter(allowed_outdated_steps=4)
    records = [make_record(i, version=v) for i, v in enumerate([10, 9, 6, 5, 11])]
    kept, dropped = filt.split(records, trainer_step=10)
    assert [r.weight_version for r in kept] == [10, 9, 6]
    assert [r.weight_version for r in dropped] == [5, 11]
    m = filt.metrics()
    # staleness values: 0, 1, 4, 5, -1
    assert m["staleness/p50"] == 1.0 and m["staleness/max"] == 5.0
    assert m["staleness/kept"] == 3 and m["staleness/dropped"] == 1 and m["staleness/dropped_ahead"] == 1
    assert m["staleness/dropped_total"] == 2

    fresh = make_record(9, version=2)
    assert filt.filter([fresh], trainer_step=3) == [fresh]
    m2 = filt.metrics()  # a new window: only the last record
    assert m2["staleness/p50"] == 1.0 and m2["staleness/dropped"] == 0 and m2["staleness/dropped_total"] == 2
    assert "staleness/p50" not in filt.metrics()


def test_on_policy_keeps_only_current_version() -> None:
    filt = StalenessFilter.from_config(GRPOConfig(allowed_outdated_steps=4, on_policy=True))
    assert filt.max_staleness == 0
    kept = filt.filter([make_record(i, version=v) for i, v in enumerate([3, 2, 3])], trainer_step=3)
    assert [r.record_id for r in kept] == ["r0000", "r0002"]
    assert filt.dropped_total == 1
    with pytest.raises(ValueError, match="allowed_outdated_steps"):
        StalenessFilter(allowed_outdated_steps=-1)


# -- throttle ------------------------------------------------------------------------------------


def test_expected_staleness_formula() -> None:
    # trainer at 5, 6 records queued at 2 per step -> a new record is reached at step 8
    assert expected_staleness(5, 6, 2, generating_version=5) == 3
    assert expected_staleness(5, 1, 2, generating_version=4) == 1


def test_throttle_blocks_a_worker_ahead_and_releases_it_when_the_trainer_consumes() -> None:
    queue = InMemoryRolloutQueue(max_pending=100)
    throttle = RolloutThrottle(queue, allowed_outdated_steps=1, records_per_step=2)
    queue.publish_weight_version(1)
    assert throttle.wait(1, timeout=0) == 1
    queue.put_many([make_record(i, version=1) for i in range(4)])  # two steps of records queued
    assert throttle.ahead_by(1) == 1
    with pytest.raises(TimeoutError, match=r"4 records queued .* would be 2 steps stale"):
        throttle.wait(1, timeout=0.05)

    result: list[int] = []
    waiter = threading.Thread(target=lambda: result.append(throttle.wait(1, timeout=10)))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive(), "the worker must wait while it is ahead"
    batch = queue.get(2, timeout=1)  # the trainer takes one step's records...
    queue.ack(batch)
    waiter.join(5)
    assert not waiter.is_alive() and result == [1]
    assert throttle.metrics()["throttle/waits"] == 2

    # weights older than the bound: waiting cannot help; wait() returns at once with the newer version
    queue.publish_weight_version(3)
    assert throttle.needs_new_weights(1) and throttle.wait(1, timeout=0) == 3


def _worker(queue: InMemoryRolloutQueue, throttle: RolloutThrottle | None, batches: int, per_step: int) -> None:
    version = 0
    for b in range(batches):
        if throttle is not None:
            version = throttle.wait(version, timeout=20)  # fetch the trainer's latest weights
        queue.put_many([make_record(b * per_step + k, version=version) for k in range(per_step)])


def test_throttled_worker_never_produces_records_the_trainer_must_drop() -> None:
    steps, per_step = 8, 2
    outcomes = {}
    for throttled in (True, False):
        queue = InMemoryRolloutQueue(max_pending=100)
        queue.publish_weight_version(0)
        throttle = RolloutThrottle(queue, allowed_outdated_steps=1, records_per_step=per_step, poll_s=0.005)
        worker = threading.Thread(target=_worker, args=(queue, throttle if throttled else None, steps, per_step))
        worker.start()
        filt = StalenessFilter(allowed_outdated_steps=1)
        seen = []
        for step in range(steps):
            records = queue.get(per_step, timeout=20)
            assert len(records) == per_step
            filt.split(records, trainer_step=step)
            seen += [step - r.weight_version for r in records]
            queue.publish_weight_version(step + 1)  # publish before acknowledging (see cp.queue.throttle)
            queue.ack(records)
        worker.join(20)
        outcomes[throttled] = (filt.dropped_total, max(seen))
    assert outcomes[True][0] == 0 and outcomes[True][1] <= 1
    # the unthrottled worker produced everything with version 0 up front: steps 2.. are too stale
    assert outcomes[False][0] > 0


def test_repetition_is_a_finish_reason_records_take() -> None:
    """Issue 29: vLLM's "repetition" completions are trained on (the engine drops "abort" / "error")."""
    record = make_record(0)
    record.finish_reasons = ["repetition", "stop"]
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(record), type=RolloutRecord).finish_reasons[0] == "repetition"
    record.finish_reasons = ["abort", "stop"]
    with pytest.raises(msgspec.ValidationError, match="'abort'"):
        msgspec.msgpack.decode(msgspec.msgpack.encode(record), type=RolloutRecord)
