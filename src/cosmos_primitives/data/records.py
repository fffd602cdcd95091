"""The rollout record types: prompts, sampling settings, completions and the groups an engine returns.

They sit in ``data`` (below ``rollout`` and ``queue``) because datasets produce :class:`Prompt`,
trainers collate :class:`RolloutGroup`, engines return them and the queue carries them.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import attrs

from cosmos_primitives.utils.renamed import renamed_keyword

if TYPE_CHECKING:  # pragma: no cover
    from cosmos_primitives.config.rollout import RolloutConfig
    from cosmos_primitives.config.validation import ValidationConfig


@attrs.define(init=False)
class SamplingParams:
    """How to sample. ``top_k = -1`` and ``top_p = 1.0`` disable those filters.

    ``num_samples_per_prompt`` completions per prompt (``[grpo] num_samples_per_prompt``), each of at
    most ``max_response_length`` new tokens (``[rollout] max_response_length``). The older keywords
    and attributes ``n`` and ``max_new_tokens`` still work, with a ``FutureWarning``.
    """

    num_samples_per_prompt: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    repetition_penalty: float = 1.0
    max_response_length: int = 256
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()

    def __init__(self, *args: Any, n: int | None = None, max_new_tokens: int | None = None, **kwargs: Any) -> None:
        for old, new, value in (("n", "num_samples_per_prompt", n),
                                ("max_new_tokens", "max_response_length", max_new_tokens)):
            if value is not None:
                kwargs[new] = renamed_keyword(kwargs.get(new), value, new=new, old=old, where="SamplingParams")
        self.__attrs_init__(*args, **kwargs)

    @property
    def n(self) -> int:
        """The older name of :attr:`num_samples_per_prompt` (``FutureWarning``)."""
        _warn_renamed_attribute("n", "num_samples_per_prompt")
        return self.num_samples_per_prompt

    @property
    def max_new_tokens(self) -> int:
        """The older name of :attr:`max_response_length` (``FutureWarning``)."""
        _warn_renamed_attribute("max_new_tokens", "max_response_length")
        return self.max_response_length

    @classmethod
    def from_config(cls, rollout: RolloutConfig, num_samples_per_prompt: int | None = None, seed: int | None = None,
                    *, n: int | None = None) -> SamplingParams:
        """``num_samples_per_prompt`` samples per prompt with ``[rollout.sampling_config]`` and ``[rollout]
        max_response_length`` (``n``: its older keyword, ``FutureWarning``)."""
        count = renamed_keyword(num_samples_per_prompt, n, new="num_samples_per_prompt", old="n",
                                where="SamplingParams.from_config")
        if count is None:
            raise TypeError("SamplingParams.from_config needs num_samples_per_prompt ([grpo] num_samples_per_prompt)")
        sampling = rollout.sampling_config
        return cls(num_samples_per_prompt=count, temperature=sampling.temperature, top_p=sampling.top_p,
                   top_k=sampling.top_k, repetition_penalty=sampling.repetition_penalty,
                   max_response_length=rollout.max_response_length, seed=seed)

    @classmethod
    def for_validation(cls, validation: ValidationConfig, rollout: RolloutConfig,
                       seed: int | None = None) -> SamplingParams:
        """GRPO validation's sampling (one completion per item): ``[validation]`` ``temperature``,
        ``top_p`` (None: ``[rollout.sampling_config] top_p``, cosmos-rl's fallback) and
        ``max_response_length`` (None: ``[rollout] max_response_length``); the recipes seed it with
        ``[train] seed``."""
        top_p = validation.top_p if validation.top_p is not None else rollout.sampling_config.top_p
        return cls(num_samples_per_prompt=1, temperature=validation.temperature, top_p=top_p,
                   max_response_length=validation.max_response_length or rollout.max_response_length, seed=seed)


def _warn_renamed_attribute(old: str, new: str) -> None:
    warnings.warn(f"SamplingParams.{old} is now SamplingParams.{new} (one name per quantity)", FutureWarning,
                  stacklevel=3)


@attrs.define
class Prompt:
    """One prompt: a chat conversation (Qwen2.5-VL content lists with image / video / text parts),
    or plain text.

    ``conversation`` as a list of messages goes through the processor's chat template; as a
    ``str`` it is the model's input text as it is (no chat template, no system prompt: it is
    tokenized exactly as ``tokenizer(text)``), as TRL and cosmos-rl's text models take a string
    prompt. Plain text holds no media placeholders, so it comes without images or videos.
    ``images`` / ``videos`` hold already-loaded visual inputs in the order their placeholders appear:
    images as ``[H, W, 3]`` uint8 arrays / PIL images, videos as ``[T, H, W, 3]`` uint8 arrays
    (with ``video_fps`` for each, and, when read from files, ``video_metadata``: the source fps and
    frame indices, :attr:`~cosmos_primitives.data.SampledVideo.metadata`). ``prompt_id`` identifies
    it within a run; ``row`` is the dataset row it came from (passed to reward functions).
    ``token_ids``, when set, is the model's input as token ids, used as they are instead of encoding
    ``conversation`` (a multi-turn episode's next turn goes on from exactly the tokens so far:
    :func:`cosmos_primitives.rollout.multi_turn.run_episodes`); with ``images`` / ``videos``, the ids
    hold their placeholders already expanded by the processor (one pad per merged patch), in order.
    """

    conversation: list[dict[str, Any]] | str
    prompt_id: str = ""
    images: list[Any] = attrs.field(factory=list)
    videos: list[Any] = attrs.field(factory=list)
    video_fps: list[float] = attrs.field(factory=list)
    video_metadata: list[dict[str, Any]] = attrs.field(factory=list)
    reference: str = ""
    row: dict[str, Any] = attrs.field(factory=dict)
    token_ids: list[int] | None = None


@attrs.define
class Completion:
    """One sampled completion.

    ``token_ids``: generated ids (no prompt), ``[L]``; ``logprobs``: float32 ``[L]``, each generated
    token's log-probability under the distribution it was sampled from (after temperature, top-k and
    top-p, renormalised: vLLM's ``processed_logprobs``; the HF engine reports the same);
    ``finish_reason``: ``"stop"`` (EOS / stop token) or ``"length"``; a vLLM engine also reports
    ``"repetition"`` (stopped by vLLM's repetition detection); it drops ``"abort"`` / ``"error"``
    completions (not samples of the policy).

    A multi-turn episode (:func:`cosmos_primitives.rollout.multi_turn.run_episodes`) is one
    completion holding every turn's tokens: ``loss_mask`` ``[L]`` is 1 on the model's tokens (trained)
    and 0 on the environment's (their ``logprobs`` are 0), and ``turn_rewards`` holds the reward the
    environment gave after each model turn. None / empty: a single model turn, every token trained.
    ``images``: the images the environment returned during the episode, in order (each one's expanded
    placeholder is among the environment's tokens); the row's media are the prompt's, then these.
    """

    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    loss_mask: list[int] | None = None
    turn_rewards: list[float] = attrs.field(factory=list)
    images: list[Any] = attrs.field(factory=list)


@attrs.define
class RolloutGroup:
    """The ``n`` completions of one prompt, with the policy weight version that produced them."""

    prompt: Prompt
    prompt_token_ids: list[int]
    completions: list[Completion]
    weight_version: int
