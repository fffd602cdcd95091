"""cp.data.WFMPromptSource: a rank's world-model prompts in a resumable order (what examples/wfm_rl.py
checkpoints per rank), and its fixed evaluation prompts."""

from __future__ import annotations

import torch

from cosmos_primitives.config import WFMDataConfig
from cosmos_primitives.data import WFMPromptSource

DATA = WFMDataConfig(kind="mock", mock_num_samples=6, num_frames=1, height=8, width=8, max_tokens=4, text_dim=8)


def source(rank: int = 0, world_size: int = 1) -> WFMPromptSource:
    return WFMPromptSource(DATA, seed=3, rank=rank, world_size=world_size, per_step=2, bad_sample_budget=-1)


def captions(stream, n: int) -> list[str]:
    return [next(stream)["caption"] for _ in range(n)]


def test_a_restored_source_goes_on_where_the_saved_one_was_across_an_epoch() -> None:
    first = source()
    stream = first.stream()
    captions(stream, 4)
    state = first.state_dict()
    expected = captions(stream, 6)  # the rest of epoch 0 and into epoch 1
    assert first.epoch == 1

    resumed = source()
    resumed.load_state_dict(state)
    assert captions(resumed.stream(), 6) == expected
    fresh = captions(source().stream(), 10)
    assert fresh[4:] == expected  # and the same order as never stopping


def test_ranks_read_disjoint_prompts_and_steps_per_epoch_counts_this_ranks_share() -> None:
    a, b = source(0, 2), source(1, 2)
    seen_a, seen_b = captions(a.stream(), 3), captions(b.stream(), 3)
    assert not set(seen_a) & set(seen_b) and len(set(seen_a + seen_b)) == 6
    assert a.steps_per_epoch() == 2  # 3 prompts per rank, 2 per step


def test_eval_prompts_are_fixed_and_collated() -> None:
    batch, ids = source(1, 2).eval_prompts()
    again, same_ids = source(1, 2).eval_prompts()
    assert ids == same_ids == [2, 3]  # from index rank * per_step on
    assert batch["text"].shape == (2, 4, 8) and torch.equal(batch["text"], again["text"])
