"""Shared-prefix filtering (cosmos-rl's ``min_filter_prefix_tokens``, ``[grpo] min_filter_prefix_tokens``).

Completions of one prompt that start with the same tokens but earn different rewards give those
tokens opposite advantages: the common prefix is pushed up and down at once, a bias that depends on
how many completions share it. For a group whose rewards are not all equal, every *maximal* shared
prefix of at least ``min_tokens`` tokens (a prefix that two or more completions start with and that
no two of them extend by the same next token) whose completions' rewards differ is taken out of the
loss: its tokens are masked in each of those completions. A completion the prefix covers entirely
(an end-of-sequence token after it aside) keeps all its tokens, else it would train on nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _maximal_shared_prefixes(sequences: Sequence[Sequence[int]], min_tokens: int) -> list[tuple[int, list[int]]]:
    """``(prefix length, member indices)`` of each maximal prefix shared by two or more sequences."""
    found: list[tuple[int, list[int]]] = []
    # depth-first over the prefix tree, one level per token: members of a node start with its prefix
    stack: list[tuple[int, list[int]]] = [(0, list(range(len(sequences))))]
    while stack:
        depth, members = stack.pop()
        children: dict[int, list[int]] = {}
        for i in members:
            if len(sequences[i]) > depth:
                children.setdefault(int(sequences[i][depth]), []).append(i)
        shared_children = [group for group in children.values() if len(group) > 1]
        if not shared_children and depth >= min_tokens and len(members) > 1:
            found.append((depth, members))
        stack += [(depth + 1, group) for group in shared_children]
    return found


def shared_prefix_lengths(sequences: Sequence[Sequence[int]], rewards: Sequence[float], min_tokens: int,
                          end_token_ids: Sequence[int] = ()) -> list[int]:
    """How many leading tokens of each completion of one group to leave out of the loss.

    Args:
        sequences: the group's completions as token ids.
        rewards: their rewards (any per-group affine transform of them, e.g. advantages, gives the same result).
        min_tokens: shortest prefix filtered (>= 1).
        end_token_ids: end-of-sequence ids (a completion that is the prefix plus one of them keeps its tokens).

    Returns:
        One count per completion (0: all its tokens train).
    """
    ignored = [0] * len(sequences)
    if len(set(rewards)) < 2:
        return ignored
    for length, members in _maximal_shared_prefixes(sequences, min_tokens):
        if len({rewards[i] for i in members}) < 2:
            continue
        for i in members:
            rest = sequences[i][length:]
            if len(rest) > 1 or (len(rest) == 1 and int(rest[0]) not in end_token_ids):
                ignored[i] = length
    return ignored


def mask_shared_prefixes(completion_mask: torch.Tensor, input_ids: torch.Tensor, group_index: torch.Tensor,
                         rewards: torch.Tensor, min_tokens: int, end_token_ids: Sequence[int] = ()) -> torch.Tensor:
    """``completion_mask`` ``[N, T]`` with the shared prefixes of :func:`shared_prefix_lengths` zeroed.

    Args:
        completion_mask: ``[N, T]``, 1 on completion tokens (each row's completion is contiguous).
        input_ids: ``[N, T]``, the tokens.
        group_index: ``[N]``, the prompt (group) of each row.
        rewards: ``[N]``, rewards or advantages of the rows.
        min_tokens: shortest prefix filtered.
        end_token_ids: end-of-sequence ids (see :func:`shared_prefix_lengths`).
    """
    mask = completion_mask.clone()
    positions = [torch.nonzero(mask[row] > 0).flatten() for row in range(mask.shape[0])]
    tokens = [input_ids[row, positions[row]].tolist() for row in range(mask.shape[0])]
    values = rewards.tolist()
    for group in torch.unique(group_index).tolist():
        rows = torch.nonzero(group_index == group).flatten().tolist()
        counts = shared_prefix_lengths([tokens[r] for r in rows], [values[r] for r in rows], min_tokens,
                                       end_token_ids)
        for row, count in zip(rows, counts, strict=True):
            if count:
                mask[row, positions[row][:count]] = 0
    return mask
