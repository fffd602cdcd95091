"""``[validation]``: periodic evaluation during training."""

from __future__ import annotations

import msgspec

from cosmos_primitives.config.base import AtLeastOne, Section
from cosmos_primitives.config.dataset import DatasetConfig


class ValidationConfig(Section):
    """``[validation]``: score the policy on a held-out MCQ set while GRPO trains (colocated mode).

    Before the first step, every ``freq`` steps and after the last, each rank generates one
    completion per item of its share of ``dataset`` (same columns as the training dataset's) at
    ``temperature`` (0 = greedy) and scores it with ``reward_function``; the means over all items
    are logged as ``validation/<reward>`` (``single_choice`` alone = MCQ accuracy). ``max_items``
    caps the items used (None: all).
    """

    enable: bool = False
    freq: AtLeastOne = 20
    dataset: DatasetConfig = msgspec.field(default_factory=DatasetConfig)
    reward_function: dict[str, float] = msgspec.field(default_factory=lambda: {"single_choice": 1.0})
    temperature: float = 0.0
    max_items: AtLeastOne | None = None
