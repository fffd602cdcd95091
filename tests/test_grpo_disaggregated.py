"""Building blocks of disaggregated GRPO (the trainer and rollout jobs): queue records back into the
training batch, and the stop flag on a real redis-server."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import attrs
import pytest
import torch

from cosmos_primitives import testing as cpt
from cosmos_primitives.data.bad_samples import BadSampleError, BadSampleTracker
from cosmos_primitives.data.mcq import MCQPromptDataset
from cosmos_primitives.data.media import MediaSettings
from cosmos_primitives.data.prompt_inputs import encode_prompts
from cosmos_primitives.data.records import Completion, Prompt, RolloutGroup
from cosmos_primitives.data.rollout_batch import collate_rollouts
from cosmos_primitives.queue import (
    InMemoryRolloutQueue,
    RedisRolloutQueue,
    StalenessFilter,
    collate_records,
    decode_record,
    encode_record,
    fetch_records,
    group_from_record,
    record_advantages,
    record_from_group,
    record_rewards,
)
from cosmos_primitives.queue.run_control import RunControl

# --------------------------------------------------------------------------------- records -> batch

N_SAMPLES = 3


@pytest.fixture(scope="module")
def mcq_media(tmp_path_factory: pytest.TempPathFactory):
    """Three image MCQ prompts and one video prompt, media on disk, loaded as the rollout side loads them."""
    root = tmp_path_factory.mktemp("mcq_media")
    rows = [json.loads(line) for line in cpt.write_colour_mcq(root, 3, seed=0).read_text().splitlines()]
    cpt.write_mp4(root / "clip.mp4", num_frames=20, fps=8.0, size=(48, 64))  # sampled at 1.6 fps
    rows.append({"id": "video0", "question": "What happens?", "choices": ["nothing", "a flash"], "answer": "A",
                 "video": "clip.mp4"})
    settings = MediaSettings(fps=2.0, max_pixels=64 * 64, min_pixels=3136, max_frames=4)
    dataset = MCQPromptDataset(rows, media_dir=root, settings=settings)
    return root, settings, [dataset[i] for i in range(len(rows))]


def make_groups(prompts, processor, seed: int = 0) -> list[RolloutGroup]:
    """Groups of N_SAMPLES completions of different lengths, with float32-exact log-probs."""
    gen = torch.Generator().manual_seed(seed)
    groups = []
    for i, prompt in enumerate(prompts):
        enc = encode_prompts(processor, [prompt])
        prompt_ids = enc["input_ids"][0][enc["attention_mask"][0].bool()].tolist()
        completions = []
        for k in range(N_SAMPLES):
            length = 2 + (i + k) % 4
            ids = torch.randint(0, 1000, (length,), generator=gen).tolist()
            completions.append(Completion(text=f"c{i}{k}", token_ids=ids,
                                          logprobs=(-torch.rand(length, generator=gen)).tolist(),
                                          finish_reason="stop" if k % 2 else "length"))
        groups.append(RolloutGroup(prompt=prompt, prompt_token_ids=prompt_ids, completions=completions,
                                   weight_version=5 + i))
    return groups


def through_the_queue(groups: list[RolloutGroup]) -> list:
    """Records as the trainer receives them: made with record_from_group, msgpack-encoded and decoded."""
    records = []
    for i, group in enumerate(groups):
        rewards = [float(i + k) for k in range(N_SAMPLES)]
        advantages = [0.5 * k - i for k in range(N_SAMPLES)]
        records.append(decode_record(encode_record(record_from_group(group, rewards, advantages))))
    return records


def test_records_rebuild_the_batch_of_their_groups(mcq_media, tiny_vl_processor) -> None:
    _, settings, prompts = mcq_media
    groups = make_groups(prompts, tiny_vl_processor)
    records = through_the_queue(groups)
    assert all(len(r.media) == 1 and Path(r.media[0]).is_file() for r in records)  # references, not pixels

    expected = collate_rollouts(groups, tiny_vl_processor)
    batch = collate_records(records, tiny_vl_processor, settings)
    assert set(batch.inputs) == set(expected.inputs)
    assert {"pixel_values", "pixel_values_videos"} <= set(batch.inputs)
    for key, value in expected.inputs.items():
        assert torch.equal(batch.inputs[key], value), key
    for name in ("completion_mask", "rollout_logprobs", "group_index", "completion_lengths", "weight_versions"):
        assert torch.equal(getattr(batch, name), getattr(expected, name)), name
    assert batch.weight_versions.tolist() == [v for v in (5, 6, 7, 8) for _ in range(N_SAMPLES)]
    assert record_advantages(records).tolist() == [0.5 * k - i for i in range(4) for k in range(N_SAMPLES)]
    assert record_rewards(records).tolist() == [float(i + k) for i in range(4) for k in range(N_SAMPLES)]

    rebuilt = group_from_record(records[0], settings)
    assert rebuilt.prompt.reference == prompts[0].reference and rebuilt.prompt.prompt_id == prompts[0].prompt_id
    assert [c.finish_reason for c in rebuilt.completions] == [c.finish_reason for c in groups[0].completions]


def test_record_without_conversation_or_media_is_named(mcq_media, tiny_vl_processor, tmp_path) -> None:
    _, settings, prompts = mcq_media
    group = make_groups(prompts[:1], tiny_vl_processor)[0]
    bare = record_from_group(group, [0.0] * N_SAMPLES, [0.0] * N_SAMPLES)
    bare.conversation = []  # emptied after construction (decode and construction refuse it)
    with pytest.raises(ValueError, match=f"record {bare.record_id} .* carries no conversation"):
        group_from_record(bare, settings)

    # the image was deleted between generation and training
    image = next(p["image"] for m in prompts[0].conversation for p in m["content"] if p["type"] == "image")
    moved = shutil.copy(image, tmp_path / "gone.png")
    conversation = json.loads(json.dumps(prompts[0].conversation).replace(image, str(moved)))
    group = attrs.evolve(group, prompt=attrs.evolve(group.prompt, conversation=conversation))
    record = record_from_group(group, [0.0] * N_SAMPLES, [0.0] * N_SAMPLES)
    (tmp_path / "gone.png").unlink()
    with pytest.raises(BadSampleError, match=f"record {record.record_id}.*gone.png"):
        group_from_record(record, settings)


def test_prompt_tokens_that_do_not_re_encode_are_refused(mcq_media, tiny_vl_processor) -> None:
    _, settings, prompts = mcq_media
    record = through_the_queue(make_groups(prompts[:1], tiny_vl_processor))[0]
    record.prompt_token_ids = record.prompt_token_ids[1:]
    with pytest.raises(ValueError, match="re-encoding the prompt gave different token ids"):
        collate_records([record], tiny_vl_processor, settings)


def test_fetch_records_keeps_fresh_readable_records_and_acks_the_others(mcq_media, tiny_vl_processor,
                                                                        tmp_path) -> None:
    _, settings, prompts = mcq_media
    groups = make_groups(prompts, tiny_vl_processor)  # weight versions 5, 6, 7, 8
    image = next(p["image"] for m in prompts[1].conversation for p in m["content"] if p["type"] == "image")
    moved = shutil.copy(image, tmp_path / "gone.png")
    conversation = json.loads(json.dumps(prompts[1].conversation).replace(image, str(moved)))
    groups[1] = attrs.evolve(groups[1], prompt=attrs.evolve(groups[1].prompt, conversation=conversation))
    records = through_the_queue(groups)
    (tmp_path / "gone.png").unlink()
    queue = InMemoryRolloutQueue()
    queue.put_many(records)
    stale, bad = StalenessFilter(allowed_outdated_steps=2), BadSampleTracker(budget=5)
    kept, rebuilt = fetch_records(queue, stale, 2, trainer_step=8, settings=settings, bad=bad, timeout_s=5)
    # version 5 is 3 steps old (dropped), version 6 lost its image (bad): both consumed
    assert [r.weight_version for r in kept] == [7, 8] and [g.weight_version for g in rebuilt] == [7, 8]
    assert stale.metrics()["staleness/dropped"] == 1 and bad.count == 1
    assert queue.pending() == 2  # the kept records are acknowledged after the step
    with pytest.raises(TimeoutError, match=r"trainer step 8 \(\[disaggregated\] get_timeout_s\)"):
        fetch_records(queue, stale, 1, trainer_step=8, settings=settings, bad=bad, timeout_s=0.1)


def test_fetch_records_skips_records_the_trainer_trained_before(mcq_media, tiny_vl_processor, caplog) -> None:
    """Issue 30, prompt claims: the trainer's own account (``already_trained``) decides what it trained,
    whatever the queue's Redis state says: such records are acknowledged and never returned."""
    _, settings, prompts = mcq_media
    records = through_the_queue(make_groups(prompts, tiny_vl_processor))  # weight versions 5, 6, 7, 8
    queue = InMemoryRolloutQueue()
    queue.put_many(records)
    before = {records[1].record_id, records[2].record_id}
    with caplog.at_level("WARNING", logger="cosmos.queue"):
        kept, _ = fetch_records(queue, StalenessFilter(allowed_outdated_steps=2), 1, trainer_step=8,
                                settings=settings, bad=BadSampleTracker(budget=5), timeout_s=5,
                                already_trained=before.__contains__)
    assert [r.weight_version for r in kept] == [8]
    assert queue.pending() == 1  # versions 6 and 7 acknowledged as trained before, 5 dropped as stale
    assert caplog.text.count("delivered records whose prompts this trainer trained before") == 2


def test_fetch_records_dead_letters_records_that_would_stop_the_collate(mcq_media, tiny_vl_processor) -> None:
    _, settings, prompts = mcq_media
    groups = make_groups(prompts, tiny_vl_processor)  # weight versions 5, 6, 7, 8
    groups[1] = attrs.evolve(groups[1], completions=groups[1].completions[:-1])
    short = record_from_group(groups[1], [0.0] * (N_SAMPLES - 1), [0.0] * (N_SAMPLES - 1))
    records = [*through_the_queue(groups[:1]), short, *through_the_queue(groups[2:])]
    records[0].prompt_token_ids = records[0].prompt_token_ids[1:]  # another tokenizer on the rollout side
    queue = InMemoryRolloutQueue()
    queue.put_many(records)
    kept, rebuilt = fetch_records(queue, StalenessFilter(allowed_outdated_steps=4), 2, trainer_step=8,
                                  settings=settings, bad=BadSampleTracker(budget=0), timeout_s=5,
                                  processor=tiny_vl_processor, num_samples_per_prompt=N_SAMPLES)
    assert [r.weight_version for r in kept] == [7, 8]
    collate_rollouts(rebuilt, tiny_vl_processor)  # the batch the trainer would have died collating is fine
    reasons = {r.weight_version: why for r, why in queue.rejected}
    assert "re-encoding its prompt" in reasons[5] and f"this run samples {N_SAMPLES}" in reasons[6]
    assert queue.metrics()["queue/malformed"] == 2


def record(version: int):
    prompt = Prompt(conversation=[{"role": "user", "content": "q"}], prompt_id="p")
    group = RolloutGroup(prompt=prompt, prompt_token_ids=[1, 2], weight_version=version,
                         completions=[Completion(text="a", token_ids=[3], logprobs=[-0.1], finish_reason="stop")])
    return record_from_group(group, [1.0], [0.0])


# ------------------------------------------------------------------------------------ run control


def test_stop_flag_and_clearing_a_stream(redis_url: str) -> None:
    from cosmos_primitives.config.redis import RedisConfig

    with RedisRolloutQueue(RedisConfig(stream="cp:test:control"), url=redis_url) as queue, \
            RunControl(queue) as control:
        assert control.stop_requested() is None
        control.request_stop("trainer finished at step 3")
        assert control.stop_requested() == "trainer finished at step 3"
        assert control.clear_stop() and control.stop_requested() is None
        queue.put_many([record(0), record(1)])
        queue.publish_weight_version(4)
        control.request_stop("left by an earlier run")
        assert control.clear_stream() == 3  # the stream, the weight version and the stop flag
        assert queue.pending() == 0 and queue.weight_version() is None and control.stop_requested() is None
        queue.put(record(0))  # the queue works again after the reset (its group is recreated)
        assert [r.weight_version for r in queue.get(1, timeout=5)] == [0]
