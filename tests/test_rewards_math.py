"""cosmos-rl's math rewards by cosmos-rl's names (boxed_math, direct_math, gsm8k), so a cosmos-rl config's
``reward_function`` scores as it did there; boxed_math needs math_verify and says so when it is missing."""

from __future__ import annotations

import logging
import sys
import threading

import pytest

import cosmos_primitives as cp
from cosmos_primitives.rewards import boxed_math_reward, direct_math_reward, gsm8k_reward, normalize_final_answer
from cosmos_primitives.utils.extras import MissingExtraError


@pytest.mark.parametrize(
    ("completion", "reference", "expected"),
    [
        ("so the sum is \\boxed{19}", "$19$", 1.0),
        ("\\boxed{0.5}", "$\\frac{1}{2}$", 1.0),  # symbolic equality, not string equality
        ("The answer is 19", "\\boxed{19}", 1.0),  # a plain expression is read from the completion
        ("\\boxed{20}", "$19$", 0.0),
        ("no number here", "$19$", 0.0),
        ("\\boxed{19}", "19", 0.0),  # a reference without LaTeX gives math_verify no gold: 0, as in cosmos-rl
        ("\\boxed{19}", None, 0.0),
    ],
)
def test_boxed_math_is_math_verify_equality(completion: str, reference: str | None, expected: float) -> None:
    assert boxed_math_reward(completion, reference) == expected


def test_boxed_math_scores_off_the_main_thread_too() -> None:
    """math_verify's timeouts use SIGALRM (main thread only); a helper thread must still score, not get 0."""
    scores: list[float] = []
    worker = threading.Thread(target=lambda: scores.append(boxed_math_reward("\\boxed{19}", "$19$")))
    worker.start()
    worker.join()
    assert scores == [1.0]


def test_boxed_math_off_the_main_thread_warns_once_and_keeps_the_main_threads_limit(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Off the main thread math_verify runs without a limit on purpose: one warning per process saying
    why, none of math_verify's own "Timeout is disabled" notices; the main thread keeps the limit."""
    import math_verify
    import math_verify.grader
    import math_verify.parser

    from cosmos_primitives.rewards import math_rewards

    # a fresh process: math_verify has not warned yet, nor has boxed_math
    monkeypatch.setattr(math_verify.parser, "TIMEOUT_WARNING_SHOWN", False, raising=False)
    monkeypatch.setattr(math_verify.grader, "TIMEOUT_WARNING_SHOWN", False, raising=False)
    math_rewards._warn_no_time_limit.cache_clear()
    limits: list[tuple[str, object]] = []
    parse, verify = math_verify.parse, math_verify.verify

    def spy_parse(*args, **kwargs):
        limits.append((threading.current_thread().name, kwargs["parsing_timeout"]))
        return parse(*args, **kwargs)

    def spy_verify(*args, **kwargs):
        limits.append((threading.current_thread().name, kwargs["timeout_seconds"]))
        return verify(*args, **kwargs)

    monkeypatch.setattr(math_verify, "parse", spy_parse)
    monkeypatch.setattr(math_verify, "verify", spy_verify)
    caplog.set_level(logging.WARNING)

    scores: list[float] = []
    worker = threading.Thread(target=lambda: scores.extend(boxed_math_reward("\\boxed{19}", "$19$") for _ in range(3)),
                              name="reward-worker")
    worker.start()
    worker.join()
    scores.append(boxed_math_reward("\\boxed{19}", "$19$"))

    assert scores == [1.0] * 4
    assert not [r for r in caplog.records if "Timeout is disabled" in r.getMessage()]
    notices = [r for r in caplog.records if "no time limit" in r.getMessage()]
    assert len(notices) == 1 and "reward-worker" in notices[0].getMessage()
    assert {limit for name, limit in limits if name == "reward-worker"} == {None}
    assert {limit for name, limit in limits if name == threading.main_thread().name} == {5}


def test_boxed_math_without_math_verify_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "math_verify", None)  # import fails as if not installed
    with pytest.raises(MissingExtraError, match=r"boxed_math reward.*pip install 'cosmos_primitives\[math\]'"):
        boxed_math_reward("\\boxed{1}", "$1$")


@pytest.mark.parametrize(
    ("completion", "reference", "expected"),
    [
        ("work...\nAnswer: $\\frac12$ dollars", "\\frac{1}{2}", 1.0),
        ("answer : 1,000 units", "1000", 1.0),
        ("Answer: 3\nthen Answer: 7", "7", 1.0),  # the last one counts
        ("Answer: 7", "8", -1.0),
        ("seven", "7", -1.0),  # no "Answer:" line
    ],
)
def test_direct_math_is_plus_or_minus_one(completion: str, reference: str, expected: float) -> None:
    assert direct_math_reward(completion, reference) == expected


def test_normalize_final_answer() -> None:
    assert normalize_final_answer("x = \\boxed{42}") == "42"
    assert normalize_final_answer("\\text{5 cm}") == "5"
    assert normalize_final_answer("\\sqrt2") == "\\sqrt{2}"


@pytest.mark.parametrize(
    ("completion", "reference", "expected"),
    [
        ("48 / 2 = 24\n#### 24", "Natalia sold 48/2 = 24 clips.\n#### 24", 1.0),
        ("#### 1,000", "#### 1000", 1.0),
        ("#### 25", "#### 24", 0.0),
        ("24", "#### 24", 0.0),  # GSM8K's layout is part of the reward
    ],
)
def test_gsm8k_reads_the_number_after_hashes(completion: str, reference: str, expected: float) -> None:
    assert gsm8k_reward(completion, reference) == expected


def test_cosmos_rl_reward_names_resolve_from_a_config() -> None:
    cfg = cp.config.config_from_dict({"grpo": {"reward_function": ["boxed_math", "gsm8k", "direct_math"]}})
    batch = cp.rewards.RewardSet.from_config(cfg.grpo)(["\\boxed{24}\n#### 24\nAnswer: 24"], ["$24$"])
    assert batch.samples[0].values == {"boxed_math": 1.0, "gsm8k": 0.0, "direct_math": -1.0}
