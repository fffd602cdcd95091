"""``[validation]``: periodic evaluation during training."""

from __future__ import annotations

import msgspec

from cosmos_primitives.config.base import Section
from cosmos_primitives.config.dataset import DatasetConfig


class ValidationConfig(Section):
    """``[validation]``."""

    enable: bool = False
    freq: int = 20
    dataset: DatasetConfig = msgspec.field(default_factory=DatasetConfig)
    reward_function: dict[str, float] = msgspec.field(default_factory=lambda: {"single_choice": 1.0})
