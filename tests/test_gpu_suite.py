"""The GPU validation pack's dry run (tiny shapes on the CPU) passes every part, so the pack cannot
rot between the rare sessions that have a GPU; the JSON and the table hold every part's figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_suite_parts import PARTS  # noqa: E402


@pytest.mark.slow
def test_the_dry_run_passes_every_part_and_writes_the_report(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_suite.py"), "--dry-run", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=900)
    report = json.loads((tmp_path / "gpu_suite.json").read_text())
    failed = {name: part.get("log_tail", "")[-1500:]
              for name, part in report["parts"].items() if part["status"] != "ok"}
    assert not failed, f"parts failed in the dry run: {failed}"
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert list(report["parts"]) == list(PARTS)
    parts = report["parts"]
    assert parts["sft_mfu"]["figures"]["tokens_per_s"] > 0
    assert parts["logprob_head"]["figures"]["fused_time_ratio"] > 0
    assert parts["weight_sync_7b"]["figures"]["copy_first_verified"] is True
    assert parts["grpo_step_vl3b"]["figures"]["step_s"] > 0
    assert parts["flowgrpo_step_2b"]["figures"]["losses_finite"] is True
    assert parts["recipes_bf16"]["figures"]["sft_float32_losses_finite"] is True
    table = (tmp_path / "gpu_suite.md").read_text()
    assert all(f"| {name} | ok |" in table for name in PARTS)


def test_the_time_boxes_fit_in_nine_minutes() -> None:
    assert sum(box for _, box in PARTS.values()) <= 9 * 60
