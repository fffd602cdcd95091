"""Rewards: rule-based rewards, a registry of named rewards, and weighted sums over a batch.

::

    rewards = cp.rewards.RewardSet.from_config(cfg.grpo)            # {"single_choice": 1.0, "format": 1.0}
    batch = rewards(completions, references, rows)                  # RewardBatch
    batch.total_tensor(), batch.samples[0].values, batch.metrics    # [N] totals, per reward, batch means
    scores = cp.rewards.score_groups(groups, rewards, cfg.grpo, cfg.rollout.max_response_length)  # GRPO
"""

from __future__ import annotations

from cosmos_primitives.rewards.compose import REWARD_ARGUMENTS, RewardBatch, RewardError, RewardSet, SampleReward
from cosmos_primitives.rewards.math_rewards import (
    boxed_math_reward,
    direct_math_reward,
    gsm8k_reward,
    normalize_final_answer,
)
from cosmos_primitives.rewards.plugins import from_cosmos_rl, load_reward
from cosmos_primitives.rewards.registry import (
    UnknownRewardError,
    get_reward,
    register_reward,
    reward_metric_names,
    reward_names,
)
from cosmos_primitives.rewards.rule_based import (
    ANSWER_PATTERN,
    FORMAT_PATTERN,
    boxed_answer_reward,
    exact_match_reward,
    extract_answer,
    extract_boxed,
    format_reward,
    single_choice_reward,
)
from cosmos_primitives.utils.lazy_module import lazy_exports

__all__ = [  # the public surface (tests/test_public_surface.py); the rest by module path
    "RewardError", "RewardSet", "UnknownRewardError", "extract_answer", "format_reward", "from_cosmos_rl",
    "register_reward", "reward_metric_names", "score_groups", "single_choice_reward",
]

# GRPO scoring imports torch; it loads on first use so that the reward server process stays without it.
_LAZY = {"GroupScores": "group_scores", "score_groups": "group_scores"}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, eager=tuple(__all__))
