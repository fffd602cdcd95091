"""``[validation]``: periodic evaluation during training."""

from __future__ import annotations

from typing import Any

import msgspec

from cosmos_primitives.config.base import AtLeastOne, Section
from cosmos_primitives.config.dataset import DatasetConfig


class ValidationConfig(Section):
    """``[validation]``: evaluate the policy on held-out data while it trains.

    SFT (``examples/sft.py``, cosmos-rl's SFT validation): every ``freq`` steps, after the last step
    and, with ``val_before_train``, before the first, the mean token loss (NLL in nats) over every
    trained token of the validation split, packed and masked as training packs and masks, is
    logged as ``val/avg_loss`` (cosmos-rl's key). The split is ``dataset`` when its ``name`` is
    set (read like the training dataset), else the held-out part of the training dataset
    (``[train.train_policy.dataset] test_size``).

    GRPO (``examples/grpo_vlm.py``, colocated mode): before the first step, every ``freq`` steps
    and after the last, each rank generates one completion per item of its share of ``dataset``
    (same columns as the training dataset's), or without its ``name`` of the items
    ``[train.train_policy.dataset] test_size`` holds out of the training prompts, at ``temperature`` (0 =
    greedy) and scores it with ``reward_function`` (empty, the default: the training rewards,
    ``[grpo] reward_function``, as cosmos-rl); the means over all items are logged as
    ``validation/<reward>`` (``single_choice`` alone = MCQ accuracy). Completions are at most
    ``max_response_length`` tokens (None: ``[rollout] max_response_length``), sampled with ``top_p``
    (None: ``[rollout.sampling_config] top_p``, cosmos-rl's fallback; it acts with ``temperature > 0``).
    ``[validation.dataset] test_size`` takes the first items of the validation prompts, as cosmos-rl's
    distillation launch scripts (``countdown_distill.py``, ``deepmath_distill.py``) read it: a fraction
    ``f`` of ``N`` prompts is ``int(f * N)`` of them (rounded down, to none for ``f * N < 1``), a count
    ``n`` is ``min(n, N)``. ``max_items`` caps the items used (None: all).
    :func:`validation_rewards` / :func:`validation_max_response_length` / :func:`validation_item_count`
    (and ``cp.data.SamplingParams.for_validation``) resolve these defaults.
    """

    enable: bool = False
    freq: AtLeastOne = 20
    val_before_train: bool = False
    dataset: DatasetConfig = msgspec.field(default_factory=DatasetConfig)
    reward_function: dict[str, float] = msgspec.field(default_factory=dict)
    temperature: float = 0.0
    top_p: float | None = None
    max_response_length: AtLeastOne | None = None
    max_items: AtLeastOne | None = None


def validation_rewards(config: Any) -> dict[str, float]:
    """``[validation] reward_function`` of a :class:`~cosmos_primitives.config.Config`, or the training
    rewards (``[grpo] reward_function``) when it is empty."""
    return dict(config.validation.reward_function or config.grpo.reward_function)


def validation_max_response_length(config: Any) -> int:
    """``[validation] max_response_length``, or ``[rollout] max_response_length`` when unset."""
    return config.validation.max_response_length or config.rollout.max_response_length


def validation_item_count(config: Any, available: int) -> int:
    """How many of the ``available`` validation prompts GRPO validation scores (the first ones):
    ``[validation.dataset] test_size`` (a fraction: ``int(test_size * available)``; a count: at most
    ``available``; None: all), then at most ``[validation] max_items``."""
    test_size = config.validation.dataset.test_size
    count = available
    if isinstance(test_size, float):
        count = int(available * test_size)
    elif isinstance(test_size, int):
        count = min(test_size, available)
    max_items = config.validation.max_items
    return count if max_items is None else min(max_items, count)
