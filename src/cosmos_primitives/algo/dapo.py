"""DAPO's two data-side tricks: dynamic sampling (drop groups with no reward signal) and overlong shaping."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from cosmos_primitives.config.grpo import GRPOConfig


@dataclass
class DynamicSamplingResult:
    """Which samples survive dynamic sampling, and what was dropped (to count it).

    Attributes:
        keep: [B] bool, True for samples of groups whose rewards differ.
        num_groups: groups in the batch.
        dropped_groups: labels (from ``group_ids``) of the dropped groups, in order of first appearance.
        dropped_group_rewards: the common reward of each dropped group (e.g. 1.0: all right, 0.0: all wrong).
        num_dropped_samples: samples in the dropped groups.
    """

    keep: torch.Tensor
    num_groups: int
    dropped_groups: list[int] = field(default_factory=list)
    dropped_group_rewards: list[float] = field(default_factory=list)
    num_dropped_samples: int = 0

    @property
    def num_dropped_groups(self) -> int:
        return len(self.dropped_groups)

    def metrics(self, prefix: str = "dynamic_sampling/") -> dict[str, float]:
        return {
            f"{prefix}dropped_groups": float(self.num_dropped_groups),
            f"{prefix}dropped_samples": float(self.num_dropped_samples),
            f"{prefix}kept_groups": float(self.num_groups - self.num_dropped_groups),
        }


def dynamic_sampling(rewards: torch.Tensor, group_ids: torch.Tensor, *, atol: float = 1e-6) -> DynamicSamplingResult:
    """Mark the groups whose rewards are all equal (within ``atol``) for dropping.

    Such groups have zero advantage everywhere and so no policy gradient, only a diluted token
    count. A group of a single sample has zero variance too and is dropped. The caller either
    trains on ``keep`` only or samples more prompts until the batch is full.

    Args:
        rewards: [B] float total rewards.
        group_ids: [B] integer group labels (e.g. ``cosmos_primitives.algo.advantages.group_ids_from_size(B, G)``).
    """
    if rewards.ndim != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards must be [B] and group_ids [B]; got {tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        )
    labels, first_index = [], {}
    for i, g in enumerate(group_ids.tolist()):
        if g not in first_index:
            first_index[g] = i
            labels.append(g)
    keep = torch.ones_like(rewards, dtype=torch.bool)
    result = DynamicSamplingResult(keep=keep, num_groups=len(labels))
    for g in labels:
        members = group_ids == g
        values = rewards[members]
        if float(values.max() - values.min()) <= atol:
            keep[members] = False
            result.dropped_groups.append(g)
            result.dropped_group_rewards.append(float(values[0]))
            result.num_dropped_samples += int(members.sum())
    return result


def overlong_penalty(
    lengths: torch.Tensor, *, max_length: int, buffer_length: int, penalty_factor: float = 1.0
) -> torch.Tensor:
    """DAPO soft overlong punishment ``min(-(len - (max_length - buffer_length)) / buffer_length * penalty_factor, 0)``.

    0 up to ``max_length - buffer_length`` tokens, then linear down to ``-penalty_factor`` at
    ``max_length`` (and further below for longer completions). ``lengths`` [B] completion token
    counts -> [B] float32 reward to add.
    """
    if buffer_length <= 0 or buffer_length > max_length:
        raise ValueError(
            f"overlong_reward.buffer_length must be in 1..max_length ({max_length}); got {buffer_length}"
        )
    lengths = torch.as_tensor(lengths, dtype=torch.float32)
    expected = max_length - buffer_length
    return torch.clamp(-(lengths - expected) / buffer_length * penalty_factor, max=0.0)


def apply_overlong_reward(
    rewards: torch.Tensor, lengths: torch.Tensor, cfg: GRPOConfig, max_response_length: int | None = None
) -> torch.Tensor:
    """``rewards + overlong_penalty(lengths)`` if ``[grpo.overlong_reward] enable_overlong_penalty``, else ``rewards``.

    The maximum length is ``overlong_reward.max_length`` or, when unset, ``max_response_length``
    (pass ``[rollout] max_response_length``). Shapes: [B], [B] -> [B].
    """
    over = cfg.overlong_reward
    if not over.enable_overlong_penalty:
        return rewards
    max_length = over.max_length if over.max_length is not None else max_response_length
    if max_length is None:
        raise ValueError(
            "overlong penalty is on but no maximum length is known: set [grpo.overlong_reward] max_length "
            "or pass max_response_length (the rollout's [rollout] max_response_length)"
        )
    penalty = overlong_penalty(
        lengths, max_length=max_length, buffer_length=over.buffer_length, penalty_factor=over.penalty_factor
    )
    return rewards + penalty.to(rewards.device, rewards.dtype)


def dynamic_sampling_enabled(cfg: GRPOConfig) -> bool:
    """``[grpo] dynamic_sampling``, or when unset, whether ``variant = "dapo"``."""
    return cfg.dynamic_sampling if cfg.dynamic_sampling is not None else cfg.variant == "dapo"
