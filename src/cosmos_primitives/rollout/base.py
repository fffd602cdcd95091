"""The rollout-engine interface: n samples per prompt, token ids, log-probs, weight version.

The record types it speaks in (:class:`Prompt`, :class:`SamplingParams`, :class:`RolloutGroup`)
live in :mod:`cosmos_primitives.data.records`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

import torch

from cosmos_primitives.data.records import Prompt, RolloutGroup, SamplingParams


@runtime_checkable
class RolloutEngine(Protocol):
    """What trainers need from a generation engine."""

    weight_version: int

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[RolloutGroup]:
        """``params.num_samples_per_prompt`` completions for each prompt, in prompt order."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load new weights (names in the engine model's own ``named_parameters`` namespace) and
        tag subsequent rollouts with ``version``."""
        ...
