"""Sampling settings of each generation of an evaluation, as the guide's evaluation tool sets them.

The tool (cosmos-reason1 ``tools/eval/evaluate.py``, ``run_model``) generates every item once,
then samples the items whose answer came out empty again, up to ``max_retries`` times:

- first try, ``"reasoning"``: ``temperature``, ``top_p = 0.95``, ``max_response_length``,
  ``repetition_penalty`` of the config; ``"letter"``: greedy (``temperature = 0``, ``top_k = 1``),
  10 new tokens, whatever the config says;
- retry ``r`` (1, 2, ...): the first try's settings with ``max_response_length + 256 * r`` new tokens and
  temperature ``min(temperature + 0.05 * r, 0.9)`` (the config's ``max_response_length`` and
  ``temperature``, also for ``"letter"``, whose ``top_k = 1`` keeps it greedy);
- every call uses the config's ``seed``.

A retry's completion replaces the first one only when it gives an answer; an item still empty
after the last retry keeps its first completion (and is wrong). ``[eval] top_p`` / ``top_k`` are
this library's: they default to the tool's 0.95 / off.
"""

from __future__ import annotations

from cosmos_primitives.config.evaluation import EvalConfig
from cosmos_primitives.data.records import SamplingParams

LETTER_MAX_TOKENS = 10
RETRY_EXTRA_TOKENS = 256
RETRY_TEMPERATURE_STEP = 0.05
RETRY_MAX_TEMPERATURE = 0.9


def first_sampling_params(cfg: EvalConfig) -> SamplingParams:
    """One completion per prompt, first try."""
    if cfg.answer_type == "letter":
        return SamplingParams(num_samples_per_prompt=1, temperature=0.0, top_p=1.0, top_k=1,
                              max_response_length=LETTER_MAX_TOKENS, seed=cfg.seed)
    return SamplingParams(num_samples_per_prompt=1, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                          repetition_penalty=cfg.repetition_penalty, max_response_length=cfg.max_response_length,
                          seed=cfg.seed)


def retry_sampling_params(cfg: EvalConfig, retry: int) -> SamplingParams:
    """Settings of retry ``retry`` (1-based) of the items whose answer is still empty."""
    if retry < 1:
        raise ValueError(f"retries are numbered from 1, got {retry}")
    first = first_sampling_params(cfg)
    return SamplingParams(
        num_samples_per_prompt=1,
        temperature=min(cfg.temperature + RETRY_TEMPERATURE_STEP * retry, RETRY_MAX_TEMPERATURE),
        top_p=first.top_p,
        top_k=first.top_k,
        repetition_penalty=first.repetition_penalty,
        max_response_length=cfg.max_response_length + RETRY_EXTRA_TOKENS * retry,
        seed=cfg.seed,
    )
