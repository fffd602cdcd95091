"""Extract the answer from a completion and decide whether it is right.

Correctness reuses the rule-based rewards (REFERENCE.md section 1): an MCQ item is right when
``single_choice`` gives 1.0 for the extracted answer against the answer letter (stripped,
case-insensitive equality; ``"(B)"`` is not ``"B"``), an open-ended item when ``exact_match`` does
(case-insensitive, runs of whitespace ignored).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from cosmos_primitives.eval.benchmark import BenchmarkItem
from cosmos_primitives.eval.prompts import AnswerType, check_answer_type
from cosmos_primitives.rewards.rule_based import (
    ANSWER_PATTERN,
    exact_match_reward,
    extract_answer,
    single_choice_reward,
)

# A letter at the start, alone or followed by ")", ".", ":" or "," ("B", "(B)", "B. red", "B) red").
_LEADING_LETTER = re.compile(r"\(?([A-Z])(?:\)|[.:,]|\s|$)")
_LONE_CAPITAL = re.compile(r"(?<![A-Za-z])([A-Z])(?![A-Za-z])")


def extract_letter(text: str, letters: Sequence[str]) -> str:
    """The option letter a direct ("letter") answer names, or the stripped text when none is found.

    Looks inside the first ``<answer>`` when there is one; then a letter at the very start
    (``"B"``, ``"(B)"``, ``"B. red"``); then the first stand-alone capital that is one of ``letters``
    (``"The answer is B"``). Lower-case letters are not read as options (``"a red car"``).
    """
    match = ANSWER_PATTERN.search(text)
    body = (match.group(1) if match else text).strip()
    valid = set(letters)
    leading = _LEADING_LETTER.match(body)
    if leading and leading.group(1) in valid:
        return leading.group(1)
    for lone in _LONE_CAPITAL.finditer(body):
        if lone.group(1) in valid:
            return lone.group(1)
    return body


def extract_prediction(completion: str, item: BenchmarkItem, answer_type: AnswerType = "reasoning") -> str:
    """The answer a completion gives.

    ``"reasoning"``: the text of the first ``<answer>..</answer>`` (else the whole completion),
    stripped, as ``single_choice`` reads it. ``"letter"``: for MCQ items :func:`extract_letter`,
    for open-ended items the stripped completion.
    """
    check_answer_type(answer_type)
    if answer_type == "reasoning":
        return extract_answer(completion)
    if item.is_mcq:
        return extract_letter(completion, item.letters)
    return completion.strip()


def is_correct(prediction: str, item: BenchmarkItem) -> bool:
    """Whether an extracted answer is right for ``item`` (see the module docstring)."""
    if item.is_mcq:
        return single_choice_reward(prediction, item.answer) == 1.0
    return exact_match_reward(prediction, item.answer) == 1.0
