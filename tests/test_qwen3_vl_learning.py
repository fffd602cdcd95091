"""Issue 27's learning check, the README's quickstart on a tiny Qwen3-VL (slow; CI runs it).

Its own module (it shares nothing with ``test_grpo_learning.py``'s quickstart run) so that a parallel
run (pytest-xdist, one module per worker at a time) trains it beside that one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from test_grpo_learning import learned, run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2700)]


def test_qwen3_vl_quickstart_learns(tmp_path: Path) -> None:
    """Issue 27's learning check: the quickstart's SFT then GRPO on a tiny Qwen3-VL (seed 0: 46.9 % after
    SFT -> 75.0 % after GRPO on 2026-11-27)."""
    log = run([sys.executable, "examples/quickstart.py", "--family", "qwen3_vl", "--output-dir", str(tmp_path)],
              tmp_path / "quickstart.log")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert "a random tiny Qwen3-VL" in log
    config = json.loads((Path(summary["grpo_model"]) / "config.json").read_text())
    assert config["model_type"] == "qwen3_vl"
    before, after = summary["after_sft"], summary["after_grpo"]
    assert before["format"] >= 0.9, before
    gain = f"Qwen3-VL: {before['accuracy']:.1%} -> {after['accuracy']:.1%}"
    assert learned(before["accuracy"], after["accuracy"]), gain
    assert after["format"] >= 0.9, after
