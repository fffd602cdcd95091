"""Shared-prefix filtering (cosmos-rl's ``min_filter_prefix_tokens``)."""

from __future__ import annotations

import torch

from cosmos_primitives.algo import mask_shared_prefixes, shared_prefix_lengths


def test_prefix_shared_by_differently_rewarded_completions_is_left_out() -> None:
    seqs = [[5, 6, 7, 1, 9], [5, 6, 7, 2, 9], [8, 8, 8]]
    assert shared_prefix_lengths(seqs, [1.0, 0.0, 0.0], min_tokens=1) == [3, 3, 0]
    assert shared_prefix_lengths(seqs, [1.0, 0.0, 0.0], min_tokens=4) == [0, 0, 0]  # shorter than asked
    assert shared_prefix_lengths(seqs, [1.0, 1.0, 0.0], min_tokens=1) == [0, 0, 0]  # same reward: no bias
    assert shared_prefix_lengths(seqs, [0.5, 0.5, 0.5], min_tokens=1) == [0, 0, 0]  # nothing to learn anyway


def test_only_maximal_prefixes_count_and_whole_completions_keep_their_tokens() -> None:
    # 0 and 1 share 4 tokens (maximal); 2 shares only [3, 3] with them, a prefix that is not maximal
    # because two of its members extend it by the same token
    seqs = [[3, 3, 4, 4, 1], [3, 3, 4, 4, 2], [3, 3, 5]]
    assert shared_prefix_lengths(seqs, [1.0, 0.0, 0.5], min_tokens=1) == [4, 4, 0]
    # a completion that is the shared prefix plus its end token keeps everything; with another last token it does not
    assert shared_prefix_lengths([[4, 4, 0], [4, 4, 7, 7]], [1.0, 0.0], min_tokens=1, end_token_ids=[0]) == [0, 2]
    assert shared_prefix_lengths([[4, 4, 0], [4, 4, 7, 7]], [1.0, 0.0], min_tokens=1) == [2, 2]


def test_mask_zeroes_the_first_completion_tokens_of_each_row() -> None:
    # two groups of two rows; prompt of 2 tokens, completions right after, padded with 0
    input_ids = torch.tensor([[1, 2, 5, 6, 7, 0], [1, 2, 5, 6, 9, 3], [1, 2, 5, 6, 7, 0], [1, 2, 5, 6, 8, 0]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 0], [0, 0, 1, 1, 1, 0]],
                        dtype=torch.float32)
    groups = torch.tensor([0, 0, 1, 1])
    rewards = torch.tensor([1.0, -1.0, 0.3, 0.3])  # group 1: equal rewards, untouched
    out = mask_shared_prefixes(mask, input_ids, groups, rewards, min_tokens=2)
    assert out[0].tolist() == [0, 0, 0, 0, 1, 0] and out[1].tolist() == [0, 0, 0, 0, 1, 1]
    assert torch.equal(out[2:], mask[2:]) and torch.equal(mask[0], torch.tensor([0, 0, 1, 1, 1, 0.0]))
