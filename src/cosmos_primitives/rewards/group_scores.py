"""Scores of rollout groups for GRPO: rewards, overlong shaping, DAPO dynamic sampling and group advantages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import torch

from cosmos_primitives.algo.advantages import compute_advantages
from cosmos_primitives.algo.dapo import apply_overlong_reward, dynamic_sampling, dynamic_sampling_enabled
from cosmos_primitives.rewards.compose import RewardBatch, RewardSet

if TYPE_CHECKING:  # pragma: no cover
    from cosmos_primitives.config.grpo import GRPOConfig
    from cosmos_primitives.data.records import RolloutGroup


class GroupScores(NamedTuple):
    """Scores of a list of groups, one entry per completion in group order (``N`` = groups x n)."""

    rewards: torch.Tensor  # [N] float32, after overlong shaping
    advantages: torch.Tensor  # [N] float32, group-relative
    lengths: torch.Tensor  # [N] int64, generated tokens
    batch: RewardBatch  # per-reward values and batch metrics
    keep: torch.Tensor  # [N] bool: False for the groups DAPO dynamic sampling drops (equal rewards)
    sampling_metrics: dict[str, float]  # dynamic_sampling/* counts (empty when it is off)


def score_groups(groups: Sequence[RolloutGroup], rewards: RewardSet, grpo: GRPOConfig,
                 max_response_length: int) -> GroupScores:
    """Score every completion of ``groups`` with ``rewards`` (given its prompt's ``reference`` and
    dataset ``row``), add the ``[grpo.overlong_reward]`` penalty for ``max_response_length``
    (``[rollout] max_response_length``), mark equal-reward groups when dynamic sampling is on
    (``[grpo] dynamic_sampling`` or ``variant = "dapo"``), and compute the ``[grpo]`` group advantages."""
    completions = [c for g in groups for c in g.completions]
    scored = rewards([c.text for c in completions],
                     [g.prompt.reference for g in groups for _ in g.completions],
                     [g.prompt.row for g in groups for _ in g.completions])
    lengths = torch.tensor([len(c.token_ids) for c in completions])
    reward = apply_overlong_reward(scored.total_tensor(), lengths, grpo, max_response_length)
    keep, sampling_metrics = torch.ones(len(completions), dtype=torch.bool), {}
    if dynamic_sampling_enabled(grpo):
        sizes = torch.tensor([len(g.completions) for g in groups])
        dropped = dynamic_sampling(reward, torch.repeat_interleave(torch.arange(len(groups)), sizes))
        keep, sampling_metrics = dropped.keep, dropped.metrics()
    return GroupScores(reward, compute_advantages(reward, cfg=grpo), lengths, scored, keep, sampling_metrics)
