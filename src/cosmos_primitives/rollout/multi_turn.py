"""Multi-turn and tool-use rollouts: the model and an environment (a tool, a simulator, a grader; a
plain Python callable, async allowed) take turns, and one episode becomes one training row.

An episode of prompt ``p``: the engine samples a model turn from ``p``'s tokens, the environment reads
it and replies (text, a reward for that turn, whether the episode is over), the reply's tokens are
appended, and the next model turn is sampled from exactly the tokens so far (``Prompt.token_ids``,
so what the trainer scores is what the model saw; no re-rendering of the conversation). The episode's
:class:`~cosmos_primitives.data.Completion` holds every turn's tokens with ``loss_mask`` 1 on the
model's (with their log-probs) and 0 on the environment's (log-prob 0), and ``turn_rewards``.

An environment may return images (``EnvReply.images``, e.g. a later frame of the prompt's clip) to a
vision-language model (Qwen2.5-VL, Qwen3-VL): the reply's text holds one :data:`IMAGE_PLACEHOLDER`
per image, the processor expands each to the image's pads, and the next turns (and the training row)
see the prompt's media followed by the images returned so far. Pass the model's processor as
``tokenizer`` then.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs

from cosmos_primitives.data.records import Completion, Prompt, RolloutGroup, SamplingParams
from cosmos_primitives.rollout.base import RolloutEngine


@attrs.define
class EnvReply:
    """What the environment answers a model turn: ``text`` (appended to the episode as context,
    formatted with ``reply_template``), the turn's ``reward``, and ``done`` to end the episode.
    ``images``: ``[H, W, 3]`` uint8 arrays / PIL images the model sees next, one
    :data:`IMAGE_PLACEHOLDER` in ``text`` per image, in order (a vision-language model only)."""

    text: str = ""
    reward: float = 0.0
    done: bool = False
    images: list[Any] = attrs.field(factory=list)


@attrs.define
class Episode:
    """One episode so far, as the environment sees it: the ``prompt``, which of its ``n`` samples this
    is, the model's turns as text, the replies given, the completion's ``token_ids`` and the images
    the replies added to it so far."""

    prompt: Prompt
    sample: int
    prompt_token_ids: list[int] = attrs.field(factory=list)
    turns: list[str] = attrs.field(factory=list)
    replies: list[EnvReply] = attrs.field(factory=list)
    token_ids: list[int] = attrs.field(factory=list)
    logprobs: list[float] = attrs.field(factory=list)
    loss_mask: list[int] = attrs.field(factory=list)
    finish_reason: str = "stop"
    done: bool = False
    weight_version: int | None = None
    images: list[Any] = attrs.field(factory=list)


# what Qwen2.5 / Qwen3 chat templates render a tool message as, after the model's turn ended with <|im_end|>
QWEN_TOOL_REPLY = ("\n<|im_start|>user\n<tool_response>\n{text}\n</tool_response><|im_end|>\n"
                   "<|im_start|>assistant\n")

# one image in a reply's text, for Qwen2.5-VL / Qwen3-VL; the processor expands the pad to the image's
IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"

Environment = Callable[[Episode], "EnvReply | Awaitable[EnvReply]"]


def continue_generations(engine: RolloutEngine, prompts: Sequence[Prompt], budgets: Sequence[int],
                         params: SamplingParams, seed_offset: int) -> list[tuple[Completion, int]]:
    """One completion for each prompt (given as token ids: ``Prompt.token_ids``) of at most
    ``budgets[i]`` new tokens: one ``generate`` per distinct budget (usually one), sampled as
    ``params`` with ``n = 1`` and, when ``params.seed`` is set, seed ``params.seed + seed_offset``.

    Returns:
        ``(completion, weight_version)`` per prompt, in prompt order.
    """
    out: list[tuple[Completion, int] | None] = [None] * len(prompts)
    for limit in sorted(set(budgets)):
        picked = [i for i, b in enumerate(budgets) if b == limit]
        turn = attrs.evolve(params, num_samples_per_prompt=1, max_response_length=limit,
                            seed=None if params.seed is None else params.seed + seed_offset)
        for i, group in zip(picked, engine.generate([prompts[i] for i in picked], turn)):
            out[i] = (group.completions[0], group.weight_version)
    return out


def _replies(env: Environment, episodes: Sequence[Episode]) -> list[EnvReply]:
    """Call ``env`` on every episode; awaitables (async environments) run concurrently."""
    results: list[Any] = [env(e) for e in episodes]
    pending = [i for i, r in enumerate(results) if inspect.isawaitable(r)]
    if pending:
        async def gather() -> list[Any]:
            return await asyncio.gather(*(results[i] for i in pending))

        for i, value in zip(pending, asyncio.run(gather())):
            results[i] = value
    for e, r in zip(episodes, results):
        if not isinstance(r, EnvReply):
            raise TypeError(f"the environment returned {type(r).__name__} for prompt {e.prompt.prompt_id!r} "
                            f"(turn {len(e.turns)}); return an EnvReply(text=..., reward=..., done=...)")
    return results


def run_episodes(engine: RolloutEngine, tokenizer: Any, prompts: Sequence[Prompt], params: SamplingParams,
                 env: Environment, *, max_turns: int = 4, max_tokens: int | None = None,
                 reply_template: str = "{text}") -> list[RolloutGroup]:
    """``params.num_samples_per_prompt`` episodes per prompt, each of at most ``max_turns`` model turns.

    Args:
        engine: any rollout engine (``HFRolloutEngine``, ``VLLMRolloutEngine``): each turn is one
            ``generate`` call over the episodes still running, from their token ids.
        tokenizer: the model's tokenizer (encodes the replies; decodes the turns for the environment),
            or its processor (needed when the environment returns images).
        params: sampling of every turn; ``max_response_length`` is the budget of one model turn, ``seed``
            (when set) seeds turn ``t`` with ``seed + t``.
        env: ``env(episode) -> EnvReply`` (or an awaitable of one), called after every model turn.
        max_turns: model turns per episode at most; the episode ends after the last one.
        max_tokens: the completion's token budget, model and environment tokens together (None: no
            limit beyond the turns); a turn is cut to fit, and an episode that reaches it, or whose
            next reply would not fit, ends with ``finish_reason = "length"``.
        reply_template: how a reply's text becomes context, ``{text}`` replaced: as it is for a plain
            text model; :data:`QWEN_TOOL_REPLY` for a Qwen chat model (a tool response turn).

    Returns:
        One :class:`RolloutGroup` per prompt (``prompt_token_ids``: the first turn's prompt), its
        completions the episodes, with ``loss_mask``, ``turn_rewards`` and the oldest weight version
        any of its turns was sampled with.
    """
    if max_turns < 1:
        raise ValueError(f"max_turns = {max_turns} must be at least 1")
    first = engine.generate(prompts, params)
    episodes = [[Episode(prompt=g.prompt, sample=k, prompt_token_ids=list(g.prompt_token_ids))
                 for k in range(len(g.completions))] for g in first]
    turn = 0
    outputs: list[tuple[Episode, Completion, int]] = [
        (e, c, g.weight_version) for g, group in zip(first, episodes) for e, c in zip(group, g.completions)]
    while outputs:
        for episode, completion, version in outputs:
            _add_turn(episode, completion, version, tokenizer, max_tokens)
        turn += 1
        asking = [e for e, _, _ in outputs]  # a turn cut by the token budget is still scored
        for episode, reply in zip(asking, _replies(env, asking)):
            episode.replies.append(reply)
            _add_reply(episode, reply, tokenizer, reply_template, max_tokens, last=turn >= max_turns)
        running = [e for e in asking if not e.done]
        if not running:
            break
        budget = [params.max_response_length if max_tokens is None else min(params.max_response_length,
                                                                        max_tokens - len(e.token_ids))
                  for e in running]
        more = continue_generations(engine, [_continuation(e) for e in running], budget, params, turn)
        outputs = [(e, c, version) for e, (c, version) in zip(running, more)]
    return [RolloutGroup(prompt=g.prompt, prompt_token_ids=list(g.prompt_token_ids),
                         completions=[_completion(e, tokenizer) for e in group],
                         weight_version=min(e.weight_version for e in group))
            for g, group in zip(first, episodes)]


def _continuation(episode: Episode) -> Prompt:
    return attrs.evolve(episode.prompt, token_ids=episode.prompt_token_ids + episode.token_ids,
                        images=[*episode.prompt.images, *episode.images])


def _text_tokenizer(tokenizer: Any) -> Any:
    return getattr(tokenizer, "tokenizer", tokenizer)


def _reply_ids(episode: Episode, reply: EnvReply, processor: Any, text: str) -> list[int]:
    """The reply's token ids; its image placeholders expanded by the processor as for a prompt."""
    if not reply.images:
        return list(_text_tokenizer(processor)(text, add_special_tokens=False)["input_ids"])
    where = f"the environment's reply to prompt {episode.prompt.prompt_id!r} (turn {len(episode.turns)})"
    if not hasattr(processor, "image_processor"):
        raise ValueError(f"{where} holds images, but run_episodes was given {type(processor).__name__}, no processor "
                         "of images: pass the model's AutoProcessor as the tokenizer")
    if text.count(IMAGE_PLACEHOLDER) != len(reply.images):
        raise ValueError(f"{where} holds {len(reply.images)} images but its text {text.count(IMAGE_PLACEHOLDER)} "
                         f"placeholders; put one IMAGE_PLACEHOLDER ({IMAGE_PLACEHOLDER!r}) per image in EnvReply.text")
    return list(processor(text=[text], images=list(reply.images))["input_ids"][0])


def _add_turn(episode: Episode, completion: Completion, version: int, tokenizer: Any, max_tokens: int | None) -> None:
    episode.token_ids += completion.token_ids
    episode.logprobs += completion.logprobs
    episode.loss_mask += [1] * len(completion.token_ids)
    episode.turns.append(_text_tokenizer(tokenizer).decode(completion.token_ids, skip_special_tokens=True))
    episode.weight_version = version if episode.weight_version is None else min(episode.weight_version, version)
    if max_tokens is not None and len(episode.token_ids) >= max_tokens:
        episode.done, episode.finish_reason = True, "length"


def _add_reply(episode: Episode, reply: EnvReply, tokenizer: Any, template: str, max_tokens: int | None,
               last: bool) -> None:
    if episode.done or reply.done or last:
        episode.done = True
        return
    ids = _reply_ids(episode, reply, tokenizer, template.format(text=reply.text))
    if max_tokens is not None and len(episode.token_ids) + len(ids) >= max_tokens:
        episode.done, episode.finish_reason = True, "length"
        return
    episode.token_ids += ids
    episode.logprobs += [0.0] * len(ids)
    episode.loss_mask += [0] * len(ids)
    episode.images += reply.images


def _completion(episode: Episode, tokenizer: Any) -> Completion:
    return Completion(text=_text_tokenizer(tokenizer).decode(episode.token_ids, skip_special_tokens=False),
                      token_ids=list(episode.token_ids), logprobs=list(episode.logprobs),
                      finish_reason=episode.finish_reason, loss_mask=list(episode.loss_mask),
                      turn_rewards=[r.reward for r in episode.replies], images=list(episode.images))


def episode_rewards(groups: Sequence[RolloutGroup]) -> list[float]:
    """The reward of each episode, row order of ``collate_rollouts``: the sum of its ``turn_rewards``."""
    return [float(sum(c.turn_rewards)) for g in groups for c in g.completions]
