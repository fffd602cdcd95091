"""``examples/grpo_tool_loop.py``: a tool-use GRPO loop learns to call the tool and use its answer."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

LOOP = Path(__file__).resolve().parents[1] / "examples" / "grpo_tool_loop.py"
MIN_GAIN = 0.2  # see the example's docstring for the measured figures


def _mean(history: list[dict[str, float]], key: str, part: slice) -> float:
    rows = history[part]
    return sum(h[key] for h in rows) / len(rows)


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="measured (seed 0): the policy stops calling the tool within 3 steps; "
                   "see the example's docstring")
@pytest.mark.timeout(1800)  # the limit leaves room for a machine shared with other jobs
def test_the_tool_loop_learns_to_call_the_tool_and_use_its_answer(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Seed 0, 20 steps: the mean episode reward of the last five steps beats the first five's by
    MIN_GAIN, and so does the rate of episodes that call the tool and then answer right. With the tool
    answering "unavailable" (run with ``tool_works=False``) the same loop cannot pass: the digit is
    drawn afresh per prompt, so without the tool's output an answer is right 1 time in 5."""
    monkeypatch.chdir(tmp_path)
    history = runpy.run_path(str(LOOP))["main"]()
    first, last = slice(None, 5), slice(-5, None)
    assert _mean(history, "reward", last) - _mean(history, "reward", first) >= MIN_GAIN, history
    assert _mean(history, "call_and_right_rate", last) > _mean(history, "call_and_right_rate", first) + 0.1, history
