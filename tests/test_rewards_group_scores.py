"""``cp.rewards.score_groups``: the rewards, overlong shaping, dynamic sampling and advantages of rollout groups."""

from __future__ import annotations

import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives.config import config_from_dict
from cosmos_primitives.data.records import Completion, Prompt, RolloutGroup
from cosmos_primitives.rewards import RewardSet, score_groups

GOOD = "<think>r</think>\n\n<answer>{}</answer>"


def group(reference: str, answers: list[str], lengths: list[int]) -> RolloutGroup:
    prompt = Prompt(conversation=[{"role": "user", "content": "?"}], prompt_id=reference, reference=reference,
                    row={"answer": reference})
    completions = [Completion(text=GOOD.format(a), token_ids=[7] * n, logprobs=[-1.0] * n, finish_reason="stop")
                   for a, n in zip(answers, lengths)]
    return RolloutGroup(prompt=prompt, prompt_token_ids=[1, 2], completions=completions, weight_version=0)


GROUPS = [group("A", ["A", "B"], [4, 6]), group("B", ["B", "B"], [5, 10])]


def test_rewards_and_group_advantages_in_group_order() -> None:
    grpo = cp.config.GRPOConfig(reward_function={"single_choice": 1.0}, num_samples_per_prompt=2)
    scores = score_groups(GROUPS, RewardSet.from_config(grpo), grpo, max_response_length=16)
    assert scores.rewards.tolist() == [1.0, 0.0, 1.0, 1.0]
    assert scores.lengths.tolist() == [4, 6, 5, 10]
    torch.testing.assert_close(scores.advantages, cp.algo.compute_advantages(scores.rewards, cfg=grpo))
    assert scores.batch.values("single_choice") == [1.0, 0.0, 1.0, 1.0]
    assert scores.keep.all() and scores.sampling_metrics == {}


def test_overlong_penalty_and_dynamic_sampling_follow_the_config() -> None:
    overlong = {"enable_overlong_penalty": True, "buffer_length": 8, "penalty_factor": 1.0}
    grpo = config_from_dict({"grpo": {"variant": "dapo", "num_samples_per_prompt": 2, "overlong_reward": overlong,
                                      "reward_function": {"single_choice": 1.0}}}).grpo
    scores = score_groups(GROUPS, RewardSet.from_config(grpo), grpo, max_response_length=16)
    # lengths past 16 - 8 = 8 lose (length - 8) / 8: only the completion of 10 tokens, by 0.25
    assert scores.rewards.tolist() == pytest.approx([1.0, 0.0, 1.0, 0.75])
    assert scores.keep.tolist() == [True, True, True, True]  # the shaping made group 2's rewards differ
    equal = score_groups(GROUPS[1:], RewardSet.from_config(grpo), grpo, max_response_length=64)
    assert equal.keep.tolist() == [False, False] and equal.sampling_metrics
