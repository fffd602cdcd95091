"""Read the answer out of a completion and score it, as the guide's evaluation tool does.

The tool (cosmos-reason1 ``examples/benchmark/tools/eval/utils/output.py`` and ``evaluate.py``
``run_model``):

- ``answer_type = "reasoning"``: the answer is the first capital letter A-Z inside the first
  ``<answer>..</answer>`` (non-greedy, across lines); no such tag, or no capital in it, gives ``""``.
  ``<answer>(B)</answer>`` and ``<answer>B. red</answer>`` read ``"B"``; so does
  ``<answer>Because B</answer>``, which reads ``"B"`` from "Because".
- ``answer_type = "letter"``: the first capital letter anywhere in the completion (``"Answer: A"``
  reads ``"A"``, ``"The answer is C"`` reads ``"T"``).
- The reasoning is the stripped text of the first ``<think>..</think>`` (``""`` without one).
- Correct: the answer equals the item's answer letter ignoring case. An empty answer is wrong,
  and is what the tool samples again (``cp.eval.sampling``).

``tests/test_eval_reference_tool.py`` runs the tool's own parser on the outputs of
``tests/data/cosmos_reason1_eval_reference.json`` and checks these functions agree on every one.

Open-ended items (no choices), which the tool cannot score, are this library's addition: the
answer is the stripped text of the first ``<answer>`` (else the whole completion), right on a
case- and whitespace-insensitive exact match (the ``exact_match`` reward).
"""

from __future__ import annotations

import re

from cosmos_primitives.eval.benchmark import BenchmarkItem
from cosmos_primitives.eval.prompts import AnswerType, check_answer_type
from cosmos_primitives.rewards.rule_based import exact_match_reward, extract_answer

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
THINK_TAG = re.compile(r"<think>(.*?)</think>", re.DOTALL)
CAPITAL = re.compile(r"[A-Z]")


def extract_letter(text: str) -> str:
    """The first capital letter A-Z of ``text``, or ``""``."""
    match = CAPITAL.search(text)
    return match.group(0) if match else ""


def extract_reasoning(completion: str) -> str:
    """The stripped text of the first ``<think>..</think>``, or ``""``."""
    match = THINK_TAG.search(completion)
    return match.group(1).strip() if match else ""


def extract_prediction(completion: str, item: BenchmarkItem, answer_type: AnswerType = "reasoning") -> str:
    """The answer a completion gives (see the module docstring); ``""`` when it gives none."""
    check_answer_type(answer_type)
    if not item.is_mcq:
        return extract_answer(completion)
    if answer_type == "letter":
        return extract_letter(completion)
    tag = ANSWER_TAG.search(completion)
    return extract_letter(tag.group(1)) if tag else ""


def is_correct(prediction: str, item: BenchmarkItem) -> bool:
    """Whether an extracted answer is right for ``item``."""
    if item.is_mcq:
        return prediction.lower() == item.answer.lower()
    return bool(prediction) and exact_match_reward(prediction, item.answer) == 1.0
