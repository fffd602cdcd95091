"""``[train.train_policy]`` and its ``[...dataset]``: what is trained on which data."""

from __future__ import annotations

from typing import Literal

import msgspec

from cosmos_primitives.config.base import Section


class DatasetConfig(Section):
    """``[train.train_policy.dataset]``: a hub name or a local path, and how to read its media."""

    name: str = ""
    subset: str = ""
    revision: str = ""
    split: str = "train"
    media_dir: str = ""
    fps: float = 2.0
    max_pixels: int = 81920
    max_frames: int = 32
    bad_sample_budget: int = 100


class TrainPolicyConfig(Section):
    """``[train.train_policy]``: what is trained (``type``) and on which data.

    The GRPO knobs that older configs spell here (``epsilon_low``, ``kl_beta``, ``loss_type``,
    ``variant``, ...) are aliases of the fields of ``[grpo]``.
    """

    type: Literal["sft", "grpo"] = "sft"
    dataset: DatasetConfig = msgspec.field(default_factory=DatasetConfig)
    conversation_column_name: str = "conversations"
    mini_batch: int = 1



