"""``[rollout.multi_turn_config]`` for a GRPO recipe: the environment it names, the rollouts of a
step (one model turn, or episodes of model turns and environment replies), and their scores."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import torch

from cosmos_primitives.algo.advantages import compute_advantages
from cosmos_primitives.data.plugins import load_plugin
from cosmos_primitives.rewards.group_scores import GroupScores, score_groups
from cosmos_primitives.rollout.multi_turn import QWEN_TOOL_REPLY, Environment, EnvReply, Episode, run_episodes
from cosmos_primitives.rollout.partial import generate_in_chunks

if TYPE_CHECKING:  # pragma: no cover
    from cosmos_primitives.config.grpo import GRPOConfig
    from cosmos_primitives.config.rollout import MultiTurnConfig
    from cosmos_primitives.data.records import Completion, Prompt, RolloutGroup, SamplingParams
    from cosmos_primitives.rewards.compose import RewardSet


def end_after_first_turn(episode: Episode) -> EnvReply:
    """The environment of a multi-turn run that names none: the episode ends after the model's first
    turn, as cosmos-rl's default data packer (no tool agent) ends it."""
    return EnvReply(done=True)


def load_environment(multi: MultiTurnConfig) -> Environment | None:
    """The environment of ``[rollout.multi_turn_config]`` (``multi``): None unless ``enable``; ``environment``
    (``"module:function"`` or ``"path/to/file.py:function"``, loaded like the dataset plug-ins)
    or, unset, :func:`end_after_first_turn`."""
    if not multi.enable:
        return None
    if not multi.environment:
        return end_after_first_turn
    env = load_plugin(multi.environment, what="rollout.multi_turn_config.environment")
    if not callable(env):
        raise TypeError(f"rollout.multi_turn_config.environment = {multi.environment!r} names a "
                        f"{type(env).__name__}, not a callable env(episode) -> EnvReply")
    return env


def generate_rollouts(engine: Any, processor: Any, prompts: Sequence[Prompt], params: SamplingParams,
                      env: Environment | None, *, multi: MultiTurnConfig,
                      max_response_length: int, chunk_tokens: int = 0,
                      between_chunks: Callable[[], None] | None = None) -> list[RolloutGroup]:
    """One step's rollouts: ``engine.generate`` without an environment; with one, ``params.num_samples_per_prompt``
    episodes per prompt of at most ``multi.max_assistant_turns`` model turns, ``max_response_length``
    (``[rollout]``) tokens each (model and environment tokens together), a turn at most
    ``multi.max_tokens_per_turn`` of them when set, the replies entering the chat as tool responses
    with ``enable_tools`` (:data:`QWEN_TOOL_REPLY`). ``chunk_tokens > 0`` (``[rollout]
    partial_rollout_chunk_tokens``, one model turn only): :func:`~cosmos_primitives.rollout.partial.generate_in_chunks`
    with ``between_chunks`` (e.g. the rollout job's fetch of newer weights)."""
    if env is not None and chunk_tokens:
        raise ValueError(f"[rollout] partial_rollout_chunk_tokens = {chunk_tokens} with [rollout.multi_turn_config] "
                         "enable = true: partial rollouts continue one model turn; set one of them off")
    if chunk_tokens:
        return generate_in_chunks(engine, prompts, params, chunk_tokens=chunk_tokens, between_chunks=between_chunks)
    if env is None:
        return engine.generate(prompts, params)
    if multi.max_tokens_per_turn:
        params = attrs.evolve(params, max_response_length=min(params.max_response_length, multi.max_tokens_per_turn))
    return run_episodes(engine, processor, prompts, params, env, max_turns=multi.max_assistant_turns,
                        max_tokens=max_response_length,
                        reply_template=QWEN_TOOL_REPLY if multi.enable_tools else "{text}")


def model_turns(completion: Completion) -> list[list[int]]:
    """The token ids of each model turn of ``completion`` (the runs of ``loss_mask`` 1; all of it
    when it has no mask)."""
    if completion.loss_mask is None:
        return [list(completion.token_ids)]
    turns: list[list[int]] = []
    previous = 0
    for token, trained in zip(completion.token_ids, completion.loss_mask):
        if trained and not previous:
            turns.append([])
        if trained:
            turns[-1].append(token)
        previous = trained
    return turns


def score_rollouts(groups: Sequence[RolloutGroup], rewards: RewardSet, grpo: GRPOConfig, processor: Any, *,
                   max_response_length: int, multi_turn: bool) -> tuple[GroupScores, dict[str, float]]:
    """:func:`~cosmos_primitives.rewards.score_groups` of one step's rollouts, and the episodes' metrics.

    Multi-turn (``multi_turn``): the reward functions score each episode's last model turn (cosmos-rl
    rewards the last assistant message), and the environment's turn rewards are added to the reward
    before the group advantages; metrics ``episode/turns`` (mean model turns per episode),
    ``episode/turns_max`` and ``episode/env_reward`` (mean summed turn reward). Else no metrics.
    """
    if not multi_turn:
        return score_groups(groups, rewards, grpo, max_response_length), {}
    tokenizer = getattr(processor, "tokenizer", processor)
    last_turns = [[attrs.evolve(c, text=tokenizer.decode((model_turns(c) or [[]])[-1], skip_special_tokens=True))
                   for c in g.completions] for g in groups]
    scored = score_groups([attrs.evolve(g, completions=cs) for g, cs in zip(groups, last_turns)], rewards,
                          grpo, max_response_length)
    env_rewards = torch.tensor([float(sum(c.turn_rewards)) for g in groups for c in g.completions])
    total = scored.rewards + env_rewards.to(scored.rewards)
    turns = torch.tensor([float(len(model_turns(c))) for g in groups for c in g.completions])
    metrics = {"episode/turns": float(turns.mean()), "episode/turns_max": float(turns.max()),
               "episode/env_reward": float(env_rewards.mean())}
    return scored._replace(rewards=total, advantages=compute_advantages(total, cfg=grpo)), metrics
