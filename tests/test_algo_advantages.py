"""Advantage estimators: group z-score (population / unbiased std) and Dr.GRPO, vs numpy and by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives.algo.advantages import group_ids_from_size
from cosmos_primitives.config import GRPOConfig, config_from_dict


def numpy_advantages(rewards: np.ndarray, groups: np.ndarray, *, ddof: int, divide: bool) -> np.ndarray:
    """A plain loop over groups: (r - mean) / (std + 1e-6); a group of one has mean 0, std 1."""
    out = np.zeros_like(rewards, dtype=np.float64)
    for g in np.unique(groups):
        idx = np.flatnonzero(groups == g)
        r = rewards[idx].astype(np.float64)
        mean, std = (0.0, 1.0) if len(r) == 1 else (r.mean(), r.std(ddof=ddof))
        out[idx] = (r - mean) / (std + 1e-6) if divide else r - mean
    return out


def test_hand_worked_group_of_four_and_group_of_one() -> None:
    # group 0: rewards 1, 0, 0, 1 -> mean 0.5; population std 0.5; unbiased std sqrt(1/3) = 0.57735
    # group 7: a single reward 2 -> mean 0, std 1 -> advantage 2
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0])
    groups = torch.tensor([0, 0, 0, 0, 7])
    pop = cp.algo.grpo_advantages(rewards, groups, GRPOConfig())
    denominators = torch.tensor([0.500001] * 4 + [1.000001])
    torch.testing.assert_close(pop, torch.tensor([0.5, -0.5, -0.5, 0.5, 2.0]) / denominators)
    unbiased = cp.algo.grpo_advantages(rewards, groups, GRPOConfig(advantage_std="unbiased"))
    torch.testing.assert_close(unbiased[:4], torch.tensor([0.866024, -0.866024, -0.866024, 0.866024]), atol=1e-5,
                               rtol=0)
    torch.testing.assert_close(unbiased[4], torch.tensor(2.0 / 1.000001))
    dr = cp.algo.drgrpo_advantages(rewards, groups)
    torch.testing.assert_close(dr, torch.tensor([0.5, -0.5, -0.5, 0.5, 2.0]))


def test_all_equal_group_has_zero_advantage() -> None:
    adv = cp.algo.compute_advantages([1, 1, 1, 0, 1, 0], group_size=3)  # python ints are fine
    torch.testing.assert_close(adv[:3], torch.zeros(3))
    assert adv[3] < 0 < adv[4]


@pytest.mark.parametrize(("std", "ddof"), [("population", 0), ("unbiased", 1)])
def test_grpo_matches_numpy_on_uneven_interleaved_groups(std: str, ddof: int) -> None:
    gen = np.random.default_rng(0)
    groups = gen.permutation(np.repeat([3, 11, 5, 8, 2], [4, 1, 6, 3, 2]))
    rewards = gen.normal(size=groups.shape).astype(np.float32)
    expected = numpy_advantages(rewards, groups, ddof=ddof, divide=True)
    got = cp.algo.grpo_advantages(torch.from_numpy(rewards), torch.from_numpy(groups), GRPOConfig(advantage_std=std))
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_drgrpo_matches_numpy_and_is_selected_by_cosmos_rl_alias() -> None:
    gen = np.random.default_rng(1)
    rewards = gen.uniform(size=12).astype(np.float32)
    groups = np.arange(12) // 4
    cfg = config_from_dict({"train": {"train_policy": {"unbiased_advantage": True}}}).grpo
    assert cfg.advantage_estimator == "drgrpo"
    got = cp.algo.compute_advantages(torch.from_numpy(rewards), cfg=cfg, group_size=4)
    np.testing.assert_allclose(got.numpy(), numpy_advantages(rewards, groups, ddof=0, divide=False), atol=1e-6)
    off = config_from_dict({"train": {"train_policy": {"unbiased_advantage": False}}}).grpo
    assert off.advantage_estimator == "grpo"


def test_contiguous_groups_and_their_errors() -> None:
    assert group_ids_from_size(6, 3).tolist() == [0, 0, 0, 1, 1, 1]
    with pytest.raises(ValueError, match="does not split into groups of 4"):
        group_ids_from_size(6, 4)
    with pytest.raises(ValueError, match="rewards must be"):
        cp.algo.grpo_advantages(torch.zeros(4, 2), torch.zeros(4, dtype=torch.long))


def test_custom_estimator_registers_and_unknown_name_lists_registered() -> None:
    @cp.algo.register_advantage("test_rank", override=True)
    def rank_advantage(rewards: torch.Tensor, group_ids: torch.Tensor, cfg: GRPOConfig | None = None) -> torch.Tensor:
        return rewards.argsort().argsort().float()

    adv = cp.algo.compute_advantages(torch.tensor([0.3, 0.1, 0.2]), cfg=GRPOConfig(advantage_estimator="test_rank"),
                                     group_size=3)
    assert adv.tolist() == [2.0, 0.0, 1.0]
    with pytest.raises(KeyError, match=r"unknown advantage 'nope'.*registered: .*drgrpo, grpo"):
        cp.algo.get_advantage("nope")
    with pytest.raises(ValueError, match="already registered"):
        cp.algo.register_advantage("grpo")(rank_advantage)
