"""Group-relative advantage estimators (REFERENCE.md section 2).

Each prompt's G completions form a group; ``group_ids [B]`` says which group each sample is in
(any integer labels; groups need not be contiguous nor equal in size). A group of one sample is
given mean 0 and std 1, so its advantage is its reward (REFERENCE.md section 2); FlowGRPO keeps
Flow-GRPO's rule instead, a lone sample's own statistics (``group_stats(..., lone_sample="own")``).
"""

from __future__ import annotations

from typing import Literal

import torch

from cosmos_primitives.algo.registry import get_advantage, register_advantage
from cosmos_primitives.config.grpo import GRPOConfig


def group_ids_from_size(batch_size: int, group_size: int, device: torch.device | str | None = None) -> torch.Tensor:
    """``[0]*G + [1]*G + ...``: the group of each sample when a prompt's G samples are contiguous.

    Returns: [batch_size] int64.
    """
    if group_size <= 0 or batch_size % group_size != 0:
        raise ValueError(
            f"batch of {batch_size} samples does not split into groups of {group_size} "
            "([grpo] num_samples_per_prompt); pass group_ids for uneven groups"
        )
    return torch.arange(batch_size, device=device) // group_size


def group_stats(
    rewards: torch.Tensor, group_ids: torch.Tensor, *, unbiased: bool = False,
    lone_sample: Literal["unit", "own"] = "unit",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sample's group mean and std of rewards.

    Args:
        rewards: [B] float.
        group_ids: [B] integer group labels.
        unbiased: divide the variance by ``n - 1`` (torch.std, verl, TRL) instead of ``n`` (numpy, cosmos-rl).
        lone_sample: a sample alone in its group gets mean 0, std 1 (``"unit"``: its z-score is its
            reward, the LLM GRPO rule) or its own mean and std (``"own"``: its reward and 0, so its
            z-score is 0, as Flow-GRPO's per-prompt tracker gives).

    Returns:
        (mean [B], std [B]) broadcast back to samples.
    """
    if lone_sample not in ("unit", "own"):
        raise ValueError(f"lone_sample must be 'unit' or 'own'; got {lone_sample!r}")
    if rewards.ndim != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards must be [B] and group_ids [B]; got rewards {tuple(rewards.shape)}, "
            f"group_ids {tuple(group_ids.shape)}"
        )
    if not rewards.is_floating_point():
        rewards = rewards.float()
    _, inverse = torch.unique(group_ids, return_inverse=True)
    count = torch.bincount(inverse).to(rewards.dtype)
    total = torch.zeros_like(count).index_add_(0, inverse, rewards)
    mean = (total / count)[inverse]
    squared = torch.zeros_like(count).index_add_(0, inverse, (rewards - mean) ** 2)
    divisor = (count - 1).clamp(min=1) if unbiased else count
    std = (squared / divisor).sqrt()[inverse]
    if lone_sample == "own":
        return mean, std
    alone = count[inverse] == 1
    mean = torch.where(alone, torch.zeros_like(mean), mean)
    std = torch.where(alone, torch.ones_like(std), std)
    return mean, std


@register_advantage("grpo")
def grpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, cfg: GRPOConfig | None = None) -> torch.Tensor:
    """Group z-score: ``A_i = (r_i - mean(r)) / (std(r) + eps)``.

    ``cfg.advantage_std`` picks the population std (default, as cosmos-rl) or the unbiased one;
    ``cfg.advantage_epsilon`` is eps (1e-6). Shapes: rewards [B] float, group_ids [B] -> [B].
    """
    cfg = cfg or GRPOConfig()
    mean, std = group_stats(rewards, group_ids, unbiased=cfg.advantage_std == "unbiased")
    return (rewards - mean) / (std + cfg.advantage_epsilon)


@register_advantage("drgrpo")
def drgrpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, cfg: GRPOConfig | None = None) -> torch.Tensor:
    """Dr.GRPO mean-only: ``A_i = r_i - mean(r)`` (cosmos-rl ``unbiased_advantage = true``). [B] -> [B]."""
    mean, _ = group_stats(rewards, group_ids)
    return rewards - mean


def compute_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor | None = None,
    *,
    cfg: GRPOConfig | None = None,
    group_size: int | None = None,
) -> torch.Tensor:
    """Advantages [B] from rewards [B] with the estimator ``cfg.advantage_estimator``.

    Give either ``group_ids`` [B] or ``group_size`` (contiguous groups; default
    ``cfg.num_samples_per_prompt``).
    """
    cfg = cfg or GRPOConfig()
    rewards = torch.as_tensor(rewards)
    if not rewards.is_floating_point():
        rewards = rewards.float()
    if group_ids is None:
        group_ids = group_ids_from_size(rewards.shape[0], group_size or cfg.num_samples_per_prompt, rewards.device)
    return get_advantage(cfg.advantage_estimator)(rewards, group_ids, cfg)
