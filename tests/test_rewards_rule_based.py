"""Rule-based rewards: format, single_choice (REFERENCE.md section 1), exact_match, boxed_answer."""

from __future__ import annotations

import pytest

import cosmos_primitives as cp
from cosmos_primitives.rewards import (
    boxed_answer_reward,
    exact_match_reward,
    extract_boxed,
    format_reward,
    single_choice_reward,
)


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<think>the sky is blue</think>\n\n<answer>A</answer>", 1.0),
        ("<think>\nmulti\nline\n</think>\n\n<answer>\n(B) red\n</answer>", 1.0),
        ("<think></think>\n\n<answer></answer>", 1.0),
        ("<think>x</think>\n\n<answer>a</answer> and </answer>", 1.0),  # the answer may hold anything
        ("<think>a <think> nested </think>\n\n<answer>A</answer>", 0.0),  # nested think tag
        ("<think>a </think> b</think>\n\n<answer>A</answer>", 0.0),  # a second closing tag inside
        ("<think>x</think>\n<answer>A</answer>", 0.0),  # one newline, not two
        ("<think>x</think> \n\n<answer>A</answer>", 0.0),
        ("<think>x</think>\n\n<answer>A</answer>\n", 1.0),  # one final newline: cosmos-rl's `$` allows it
        ("<think>x</think>\n\n<answer>A</answer>\n\n", 0.0),  # two do not
        (" <think>x</think>\n\n<answer>A</answer>", 0.0),  # leading space
        ("Sure! <think>x</think>\n\n<answer>A</answer>", 0.0),
        ("<answer>A</answer>", 0.0),
        ("<think>x</think>\n\n<answer>A", 0.0),
        ("", 0.0),
    ],
)
def test_format(completion: str, expected: float) -> None:
    assert format_reward(completion) == expected


@pytest.mark.parametrize(
    ("completion", "reference", "expected"),
    [
        ("<think>..</think>\n\n<answer>A</answer>", "A", 1.0),
        ("<think>..</think>\n\n<answer> a </answer>", "<answer>A</answer>", 1.0),  # stripped, case-insensitive
        ("<answer>B</answer> then <answer>A</answer>", "A", 0.0),  # the FIRST answer counts
        ("<answer>A</answer> then <answer>B</answer>", "A", 1.0),
        ("  c\n", "C", 1.0),  # no answer tag: the whole completion, stripped
        ("<answer>(A)</answer>", "A", 0.0),  # "(A)" is not "A"
        ("<answer>A</answer>", "The answer is <answer> a</answer>.", 1.0),  # truth from the reference's tag
        ("<answer>\nred\n</answer>", "Red", 1.0),
        ("<answer>A</answer>", "B", 0.0),
        ("<answer></answer>", "", 1.0),
    ],
)
def test_single_choice(completion: str, reference: str, expected: float) -> None:
    assert single_choice_reward(completion, reference) == expected


def test_format_and_single_choice_score_as_cosmos_rl_s_own_functions() -> None:
    """cosmos-rl 0.4.7's ``format_reward_fn`` / ``single_choice_reward_fn`` on completions x references
    (``scripts/fixtures_cosmos_rl_config.py``): trailing newlines, a None reference, case folding."""
    import json
    from pathlib import Path

    cases = json.loads((Path(__file__).parent / "data" / "cosmos_rl_effective_config.json").read_text())["rewards"]
    assert len(cases) > 100 and any(c["reference"] is None for c in cases)
    for case in cases:
        assert format_reward(case["completion"]) == case["format"], case
        assert single_choice_reward(case["completion"], case["reference"]) == case["single_choice"], case
    assert single_choice_reward("<answer>A</answer>", None) == 0.0  # a row without a reference: 0, not an error


def test_exact_match_normalises_case_and_whitespace_only() -> None:
    assert exact_match_reward("  The Red   cube\n", "the red cube") == 1.0
    assert exact_match_reward("the red cube.", "the red cube") == 0.0
    assert exact_match_reward("<answer>A</answer>", "A") == 0.0  # no extraction
    with pytest.raises(ValueError, match="reward 'exact_match' needs a reference"):
        exact_match_reward("x", None)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{42}", "42"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),  # nested braces
        (r"first \boxed{1} then \boxed{2}", "2"),  # the last one
        (r"\boxed {x^{2}}", "x^{2}"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # escaped braces are literal
        (r"\boxed{1} and an unclosed \boxed{2", "1"),
        ("no box here", None),
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


def test_boxed_answer() -> None:
    assert boxed_answer_reward(r"thus $\boxed{\frac{1}{2}}$.", r"\frac{1}{2}") == 1.0
    assert boxed_answer_reward(r"\boxed{ x + 1 }", r"The answer is \boxed{x+1}.") == 1.0
    assert boxed_answer_reward(r"\boxed{0.5}", r"\frac{1}{2}") == 0.0  # strings, no symbolic equivalence
    assert boxed_answer_reward("42", "42") == 0.0  # nothing boxed
    assert boxed_answer_reward(r"\boxed{42.}", "42") == 1.0


def test_registry_names_the_builtins_and_lists_them_on_a_typo() -> None:
    assert {"format", "single_choice", "exact_match", "boxed_answer"} <= set(cp.rewards.reward_names())
    assert cp.rewards.get_reward("format") is format_reward
    with pytest.raises(KeyError, match=r"unknown reward 'single_choise'.*registered: .*single_choice"):
        cp.rewards.get_reward("single_choise")
    with pytest.raises(ValueError, match="already registered"):
        cp.rewards.register_reward("format")(lambda completion: 0.0)
