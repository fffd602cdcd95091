"""The rollout-engine interface: n samples per prompt, token ids, log-probs, weight version."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs
import torch


@attrs.define
class SamplingParams:
    """How to sample. ``top_k = -1`` and ``top_p = 1.0`` disable those filters."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    repetition_penalty: float = 1.0
    max_new_tokens: int = 256
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()


@attrs.define
class Prompt:
    """One prompt: a chat conversation (Qwen2.5-VL content lists with image / video / text parts).

    ``media`` holds already-loaded visual inputs in the order their placeholders appear:
    images as ``[H, W, 3]`` uint8 arrays / PIL images, videos as ``[T, H, W, 3]`` uint8 arrays
    (with ``video_fps`` for each). ``prompt_id`` identifies it within a run; ``row`` is the dataset
    row it came from (passed to reward functions).
    """

    conversation: list[dict[str, Any]]
    prompt_id: str = ""
    images: list[Any] = attrs.field(factory=list)
    videos: list[Any] = attrs.field(factory=list)
    video_fps: list[float] = attrs.field(factory=list)
    reference: str = ""
    row: dict[str, Any] = attrs.field(factory=dict)


@attrs.define
class Completion:
    """One sampled completion.

    ``token_ids``: generated ids (no prompt), ``[L]``; ``logprobs``: float32 ``[L]``, the sampling
    distribution's log-probability of each generated token (after temperature), as vLLM reports it;
    ``finish_reason``: ``"stop"`` (EOS / stop token) or ``"length"``.
    """

    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


@attrs.define
class RolloutGroup:
    """The ``n`` completions of one prompt, with the policy weight version that produced them."""

    prompt: Prompt
    prompt_token_ids: list[int]
    completions: list[Completion]
    weight_version: int


@runtime_checkable
class RolloutEngine(Protocol):
    """What trainers need from a generation engine."""

    weight_version: int

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[RolloutGroup]:
        """``params.n`` completions for each prompt, in prompt order."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load new weights (names in the engine model's own ``named_parameters`` namespace) and
        tag subsequent rollouts with ``version``."""
        ...
