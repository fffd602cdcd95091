"""Rule-based rewards on completion text (REFERENCE.md section 1): format, single_choice, exact_match, boxed_answer.

Each returns 1.0 or 0.0. ``format`` and ``single_choice`` are Cosmos-Reason's training rewards;
``single_choice`` alone is MCQ accuracy.
"""

from __future__ import annotations

import re

from cosmos_primitives.rewards.registry import register_reward

# The think body may not contain another <think> or </think>; the answer may contain anything.
FORMAT_PATTERN = re.compile(r"<think>((?:(?!</?think>).)*)</think>\n\n<answer>(.*)</answer>", re.DOTALL)
ANSWER_PATTERN = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_BOXED = re.compile(r"\\boxed\s*\{")


def extract_answer(text: str) -> str:
    """Text inside the first ``<answer>...</answer>``, else the whole text; stripped."""
    match = ANSWER_PATTERN.search(text)
    return (match.group(1) if match else text).strip()


def extract_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` (nested and escaped braces handled), or None."""
    found = None
    for match in _BOXED.finditer(text):
        depth, i = 1, match.end()
        while i < len(text) and depth:
            char = text[i]
            if char == "\\":
                i += 2
                continue
            depth += {"{": 1, "}": -1}.get(char, 0)
            i += 1
        if depth == 0:
            found = text[match.end() : i - 1]
    return found


def _require_reference(name: str, reference: str | None) -> str:
    if reference is None:
        raise ValueError(f"reward '{name}' needs a reference answer, got None (check the dataset's answer column)")
    return reference


@register_reward("format")
def format_reward(completion: str) -> float:
    """1.0 iff the whole completion is ``<think>...</think>\\n\\n<answer>...</answer>``, as cosmos-rl
    scores it (its pattern ends in ``$``, which also matches before one final newline).

    The think text may not contain ``<think>`` / ``</think>`` tags; nothing may precede ``<think>``
    or follow ``</answer>`` but one newline.
    """
    text = completion[:-1] if completion.endswith("\n") else completion
    return 1.0 if FORMAT_PATTERN.fullmatch(text) else 0.0


@register_reward("single_choice")
def single_choice_reward(completion: str, reference: str | None) -> float:
    """1.0 iff the student's answer equals the ground truth, ignoring case (``str.lower``), as
    cosmos-rl scores it.

    Ground truth: text inside ``<answer>..</answer>`` of the reference if present, else the whole
    reference, stripped. Student: the first ``<answer>..</answer>`` of the completion, else the whole
    completion, stripped. ``"(A)"`` and ``"A"`` differ. A None reference (a row without an answer)
    scores 0.0, as in cosmos-rl.
    """
    if reference is None:
        return 0.0
    return 1.0 if extract_answer(completion).lower() == extract_answer(reference).lower() else 0.0


def _normalise_text(text: str) -> str:
    return " ".join(text.split()).casefold()


@register_reward("exact_match")
def exact_match_reward(completion: str, reference: str | None) -> float:
    """1.0 iff the whole completion equals the whole reference, ignoring case and runs of whitespace.

    No answer extraction (use ``single_choice`` for ``<answer>`` tags).
    """
    return 1.0 if _normalise_text(completion) == _normalise_text(_require_reference("exact_match", reference)) else 0.0


def _normalise_math(text: str) -> str:
    return "".join(text.split()).strip("$").rstrip(".")


@register_reward("boxed_answer")
def boxed_answer_reward(completion: str, reference: str | None) -> float:
    """1.0 iff the last ``\\boxed{...}`` of the completion equals the reference's answer.

    The reference's answer is its own last ``\\boxed{...}`` when it has one, else the whole reference.
    Compared as strings with whitespace removed and outer ``$`` / a trailing ``.`` dropped; no symbolic
    equivalence (``1/2`` and ``0.5`` differ). 0.0 when the completion has no complete ``\\boxed{}``.
    """
    reference = _require_reference("boxed_answer", reference)
    answer = extract_boxed(completion)
    if answer is None:
        return 0.0
    truth = extract_boxed(reference)
    return 1.0 if _normalise_math(answer) == _normalise_math(truth if truth is not None else reference) else 0.0
