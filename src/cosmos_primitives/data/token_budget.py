"""Token-budget micro-batches (dynamic batching): rows grouped so that each micro-batch's padded
size, ``rows x its longest row``, stays within a token budget (``[train.train_policy]
max_token_len_per_mini_batch``, cosmos-rl's key; verl's ``use_dynamic_bsz`` /
``ppo_max_token_len_per_gpu``).

A fixed row count pads every micro-batch to its longest row, so a batch whose lengths differ by 10x
(video prompts) spends most of its compute on padding and must size the row count for the longest
rows. Grouping rows of similar length under a token budget cuts both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def token_budget_micro_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Partition rows into micro-batches whose padded size fits ``max_tokens``.

    Rows are taken longest first (ties: lower index first) and packed next-fit: a micro-batch
    takes the next row while ``(rows + 1) x its first (longest) row <= max_tokens``. So rows of
    similar length share a micro-batch, each micro-batch is as full as the budget allows, and the
    result depends only on ``lengths`` and ``max_tokens`` (deterministic). A row longer than the
    budget alone gets a micro-batch of its own (it cannot be split; that micro-batch exceeds the
    budget).

    Args:
        lengths: ``[N]`` tokens of each row (prompt + completion, padding excluded).
        max_tokens: the budget of ``rows x longest row`` per micro-batch, >= 1.

    Returns:
        Micro-batches, longest rows first: lists of row indices (ascending within a micro-batch);
        every row in exactly one. ``[]`` for no rows.

    Raises:
        ValueError: ``max_tokens`` < 1 or a negative length.
    """
    if max_tokens < 1:
        raise ValueError(f"[train.train_policy] max_token_len_per_mini_batch must be >= 1, got {max_tokens}")
    if any(n < 0 for n in lengths):
        raise ValueError(f"token_budget_micro_batches: negative row length in {list(lengths)}")
    order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
    parts: list[list[int]] = []
    longest = 0
    for i in order:
        if parts and (len(parts[-1]) + 1) * longest <= max_tokens:
            parts[-1].append(i)
        else:
            parts.append([i])
            longest = max(1, int(lengths[i]))
    return [sorted(p) for p in parts]


def pad_micro_batch_count(parts: list[list[int]], group: Any = None) -> list[list[int]]:
    """``parts`` followed by empty micro-batches up to the most any rank of ``group`` has, so that
    every data-parallel rank runs the same number of forwards / backwards (and so the same FSDP
    collectives). The caller runs each empty micro-batch as a row that trains nothing.

    One all-reduce (MAX) of the count over ``group``; none without a process group.
    """
    count = len(parts)
    if group is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
        backend = torch.distributed.get_backend(group)
        device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        most = torch.tensor(count, dtype=torch.int64, device=device)
        torch.distributed.all_reduce(most, op=torch.distributed.ReduceOp.MAX, group=group)
        count = int(most)
    return [list(p) for p in parts] + [[] for _ in range(count - len(parts))]


def padded_tokens(lengths: Sequence[int], parts: Sequence[Sequence[int]]) -> int:
    """Tokens the forwards of ``parts`` process, each micro-batch padded to its longest row:
    ``sum(len(part) x max length in part)``."""
    return sum(len(p) * max((int(lengths[i]) for i in p), default=0) for p in parts)
