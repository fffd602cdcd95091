"""The resumable distributed sampler and the SFT loader's exact resume."""

from __future__ import annotations

import functools
import json

import pytest
import torch

from cosmos_primitives import testing as cpt
from cosmos_primitives.data.bad_samples import BadSampleTracker
from cosmos_primitives.data.hf_conversations import HFConversationDataset
from cosmos_primitives.data.packing import padding_stats
from cosmos_primitives.data.qwen_vl_encoding import IGNORE_INDEX, EncodedSample, encode_conversation
from cosmos_primitives.data.sampler import ResumableDistributedSampler
from cosmos_primitives.data.sft_loader import SFTBatchLoader, all_ranks_have_batch


def test_ranks_split_the_epoch_without_overlap() -> None:
    shards = [list(ResumableDistributedSampler(10, rank=r, world_size=3, seed=5)) for r in range(3)]
    assert [len(s) for s in shards] == [4, 4, 4]
    everything = sorted(i for s in shards for i in s)
    assert sorted(set(everything)) == list(range(10)) and len(everything) == 12  # 2 wrapped to even out
    dropped = [list(ResumableDistributedSampler(10, rank=r, world_size=3, seed=5, drop_last=True)) for r in range(3)]
    assert [len(s) for s in dropped] == [3, 3, 3] and len({i for s in dropped for i in s}) == 9


def test_epochs_reshuffle_deterministically() -> None:
    a, b = ResumableDistributedSampler(50, seed=1), ResumableDistributedSampler(50, seed=1)
    first = list(a)
    assert first == list(b) and sorted(first) == list(range(50))
    a.set_epoch(1)
    second = list(a)
    assert second != first and sorted(second) == list(range(50))
    assert list(ResumableDistributedSampler(50, seed=2)) != first
    assert list(ResumableDistributedSampler(50, shuffle=False)) == list(range(50))


@pytest.mark.parametrize("stop_after", [0, 1, 7, 16])
def test_restore_yields_exactly_the_remaining_indices(stop_after: int) -> None:
    sampler = ResumableDistributedSampler(33, rank=1, world_size=2, seed=3)
    sampler.set_epoch(4)
    full = sampler.epoch_indices()
    it = iter(sampler)
    seen = [next(it) for _ in range(stop_after)]
    state = json.loads(json.dumps(sampler.state_dict()))
    restored = ResumableDistributedSampler(33, rank=1, world_size=2, seed=3)
    restored.load_state_dict(state)
    assert restored.epoch == 4
    assert seen + list(restored) == full
    restored.set_epoch(5)
    assert list(restored) == ResumableDistributedSampler(33, rank=1, world_size=2, seed=3).epoch_indices(5)


def test_restore_refuses_a_different_world_size() -> None:
    state = ResumableDistributedSampler(20, rank=0, world_size=2).state_dict()
    with pytest.raises(ValueError, match="world_size=2"):
        ResumableDistributedSampler(20, rank=0, world_size=4).load_state_dict(state)


def _conversations(n: int) -> list[dict]:
    rows = []
    for i in range(n):
        words = " ".join(["word"] * (1 + (i * 7) % 23))
        rows.append({"conversations": [{"role": "user", "content": f"Question {i}: {words}?"},
                                       {"role": "assistant", "content": f"Answer {i}."}]})
    rows[5] = {"conversations": [{"role": "user", "content": "nobody answers"}]}  # a bad row
    return rows


def _text_loader(tokenizer, packing: bool = True) -> SFTBatchLoader:
    ds = HFConversationDataset(_conversations(30), name="toy")
    return SFTBatchLoader(ds, functools.partial(encode_conversation, tokenizer),
                          ResumableDistributedSampler(len(ds), seed=7), token_budget=96, pad_token_id=151643,
                          packing=packing, rows_per_batch=2, samples_per_batch=4, buffer_size=6,
                          bad_samples=BadSampleTracker(budget=5))


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("packing", [True, False])
def test_loader_resumes_exactly_across_an_epoch_boundary(qwen_tokenizer, packing: bool) -> None:
    reference = _text_loader(qwen_tokenizer, packing)
    expected = [b for _ in range(2) for b in reference]
    assert reference.epoch == 2 and reference.bad_samples.count == 2  # the bad row, once per epoch
    first = _text_loader(qwen_tokenizer, packing)
    it = iter(first)
    got = [next(it) for _ in range(4)]
    state = json.loads(json.dumps(first.state_dict()))
    resumed = _text_loader(qwen_tokenizer, packing)
    resumed.load_state_dict(state)
    for _ in range(resumed.epoch, 2):
        got.extend(resumed)
    assert len(got) == len(expected) and all(_same(a, b) for a, b in zip(got, expected))
    assert resumed.bad_samples.count == 2


def test_packed_loader_fills_rows_and_covers_every_good_sample_once(qwen_tokenizer) -> None:
    loader = _text_loader(qwen_tokenizer, packing=True)
    batches = list(loader)
    real = total = 0
    answers = []
    for batch in batches:
        assert "attention_mask" not in batch and batch["input_ids"].shape[1] <= 96
        r, t = padding_stats(batch, 151643)
        real, total = real + r, total + t
        text = qwen_tokenizer.decode(batch["labels"][batch["labels"] != IGNORE_INDEX])
        answers += [int(part.split(".")[0]) for part in text.split("Answer ")[1:]]
    assert sorted(answers) == [i for i in range(30) if i != 5]
    assert real / total > 0.8


def _fixed(length: int) -> EncodedSample:
    ids = torch.arange(length) + 1000
    return EncodedSample(input_ids=ids, labels=ids.clone(), position_ids=torch.arange(length), source=str(length))


def _uneven_ranks_stop_together() -> dict:
    rank = torch.distributed.get_rank()
    # rank 0's samples are short (many fit per row), rank 1's long: rank 0 runs out of rows first
    data = [_fixed(10 if i % 2 == 0 else 60) for i in range(12)]
    sampler = ResumableDistributedSampler(len(data), rank=rank, world_size=2, shuffle=False)
    loader = SFTBatchLoader(data, lambda s: s, sampler, token_budget=64, pad_token_id=0, buffer_size=4)
    steps = 0
    while all_ranks_have_batch((batch := loader.next_batch()) is not None):
        steps += 1
    return {"steps": steps, "own_batches_left": batch is not None}


def test_all_ranks_have_batch_ends_the_epoch_on_every_rank_together() -> None:
    results = cpt.run_distributed(_uneven_ranks_stop_together, 2)
    assert results[0]["steps"] == results[1]["steps"] == 1  # rank 0 packs its six 10-token samples in one row
    assert results[0]["own_batches_left"] is False and results[1]["own_batches_left"] is True


def test_oversized_samples_are_bad_samples() -> None:
    data = [_fixed(10), _fixed(100), _fixed(20)]
    tracker = BadSampleTracker(budget=3)
    loader = SFTBatchLoader(data, lambda s: s, ResumableDistributedSampler(3, shuffle=False), token_budget=64,
                            pad_token_id=0, bad_samples=tracker)
    (batch,) = list(loader)
    assert batch["input_ids"].shape == (1, 30)
    ((path, count, reason),) = tracker.worst()
    assert path == "100" and count == 1 and "exceed the packing budget of 64" in reason


def test_prompt_stream_runs_epoch_after_epoch_and_skips_bad_rows() -> None:
    from cosmos_primitives.data import BadSampleError, prompt_stream

    class Rows:
        def __getitem__(self, i: int) -> int:
            if i == 3:
                raise BadSampleError(f"row {i}", "unreadable")
            return i

    sampler = ResumableDistributedSampler(5, seed=0, shuffle=False)
    bad = BadSampleTracker(budget=10)
    stream = prompt_stream(Rows(), sampler, bad)
    assert [next(stream) for _ in range(9)] == [0, 1, 2, 4, 0, 1, 2, 4, 0]
    assert sampler.epoch == 2 and bad.count == 2
