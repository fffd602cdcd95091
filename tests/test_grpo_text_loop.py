"""``examples/grpo_text_loop.py``: a user's own GRPO loop for a text model is a short script of
library calls that runs in one plain process on a model built in memory, with no process group,
no mesh and nothing read from or written to disk."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest
import torch.distributed as dist

LOOP = Path(__file__).resolve().parents[1] / "examples" / "grpo_text_loop.py"


def test_the_loop_trains_in_one_process_without_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    main = runpy.run_path(str(LOOP))["main"]
    history = main(steps=2, prompts_per_step=2)
    assert [h["step"] for h in history] == [1, 2]
    assert all(h["grad_norm"] > 0 and "clip_fraction" in h and h["reward"] < 0 for h in history), history
    assert not dist.is_initialized()
    assert list(tmp_path.iterdir()) == []
    assert len(LOOP.read_text().splitlines()) < 70  # short: a script of library calls, not a framework
