"""Partial rollouts: generation in chunks of tokens, with a chance to take new weights between chunks;
an unfinished completion goes on under the new weights instead of being dropped as stale (slime's
``--partial-rollout``, verl's). Each token keeps the log-prob of the weights that sampled it, so the
trainer's rollout correction (``[grpo] rollout_correction``) sees the true behaviour policy per token.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from cosmos_primitives.data.records import Completion, Prompt, RolloutGroup, SamplingParams
from cosmos_primitives.rollout.base import RolloutEngine
from cosmos_primitives.rollout.multi_turn import continue_generations


@attrs.define
class _Pending:
    group: int
    prompt: Prompt
    prompt_token_ids: list[int]
    completion: Completion


def generate_in_chunks(engine: RolloutEngine, prompts: Sequence[Prompt], params: SamplingParams, *,
                       chunk_tokens: int, between_chunks: Callable[[], None] | None = None) -> list[RolloutGroup]:
    """``engine.generate(prompts, params)`` in chunks of at most ``chunk_tokens`` new tokens.

    After each chunk ``between_chunks()`` runs (e.g. the rollout job's check for a new weight
    version, which loads it into ``engine``); completions that hit the chunk's end without finishing
    go on from their exact token ids (``Prompt.token_ids``) under whatever weights the engine then
    holds, until they stop or reach ``params.max_response_length``.

    Args:
        engine: a text rollout engine (a continuation is given as token ids, which are text only).
        params: as for ``generate``; ``seed`` (when set) seeds chunk ``c`` with ``seed + c``.
        chunk_tokens: new tokens per chunk (>= 1).
        between_chunks: called between chunks while any completion is unfinished.

    Returns:
        The groups as ``generate`` returns them; each completion's ``logprobs`` are those of the
        weights that sampled each token, and each group's ``weight_version`` is the oldest version any
        of its tokens was sampled with (the staleness a trainer should count).
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens = {chunk_tokens} must be at least 1")
    total = params.max_response_length
    first = engine.generate(prompts, attrs.evolve(params, max_response_length=min(chunk_tokens, total)))
    versions = [g.weight_version for g in first]
    pending = [_Pending(i, g.prompt, list(g.prompt_token_ids), c) for i, g in enumerate(first) for c in g.completions]
    continued: list[_Pending] = []
    chunk = 0
    while True:
        pending = [p for p in pending
                   if p.completion.finish_reason == "length" and len(p.completion.token_ids) < total]
        if not pending:
            break
        if between_chunks is not None:
            between_chunks()
        chunk += 1
        if chunk == 1:  # every completion continued later is among these (the pending ones only shrink)
            continued = list(pending)
        budgets = [min(chunk_tokens, total - len(p.completion.token_ids)) for p in pending]
        prompts_now = [attrs.evolve(p.prompt, token_ids=p.prompt_token_ids + p.completion.token_ids) for p in pending]
        for p, (more, version) in zip(pending, continue_generations(engine, prompts_now, budgets, params, chunk)):
            p.completion.token_ids += more.token_ids
            p.completion.logprobs += more.logprobs
            p.completion.text += more.text
            p.completion.finish_reason = more.finish_reason
            versions[p.group] = min(versions[p.group], version)
    tokenizer = getattr(engine, "tokenizer", None)
    for p in continued if tokenizer is not None else ():  # decoded whole: a character may span two chunks
        ids = p.completion.token_ids[:-1] if p.completion.finish_reason == "stop" else p.completion.token_ids
        p.completion.text = tokenizer.decode(ids, skip_special_tokens=False)
    return [attrs.evolve(g, weight_version=v) for g, v in zip(first, versions)]


def take_newer_weights(client: Any, log: Any, *, attempts: int = 3) -> int:
    """Between two chunks of a partial rollout: load the newer weights ``client`` (a
    :class:`~cosmos_primitives.sync.WeightClient`) sees published into its engine, if any; returns the
    version held after. A failed fetch that left the held weights whole is warned about and the
    generation goes on under them; one that broke off part way (the engine may hold two versions,
    ``weight_version`` -1) is retried up to ``attempts`` times, then raised."""
    from cosmos_primitives.sync import WeightTransferError  # the sync package imports the engines

    for attempt in range(1, attempts + 1):
        try:
            if client.refresh() is not None:
                log.info(f"[rollout] {client.member_id}: took weight version {client.weight_version} between chunks; "
                         "the cut completions go on under it (partial rollout)")
            return client.weight_version
        except WeightTransferError as error:
            if client.weight_version >= 0:
                log.warning(f"[rollout] {client.member_id}: weight fetch between chunks failed ({error}); going on "
                            f"under version {client.weight_version}")
                return client.weight_version
            if attempt == attempts:
                raise
            log.warning(f"[rollout] {client.member_id}: weight fetch between chunks broke off ({error}); retrying")
            time.sleep(1.0)
    return client.weight_version
