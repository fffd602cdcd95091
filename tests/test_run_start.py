"""One call picks both the run folder and the checkpoint a run resumes from, so two runs in one
``output_dir`` never cross: a resume writes into the folder of the run whose checkpoint it loads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from cosmos_primitives.checkpoint import CheckpointManager, start_run
from cosmos_primitives.config import CheckpointConfig

CKPT = CheckpointConfig(enable_checkpoint=True, save_mode="sync", save_freq=1, export_safetensors=False)


def start(out: Path, resume: bool | str, stamp: str, value: float) -> tuple[Path, CheckpointManager, int]:
    """A recipe's start-up: run folder and resume point from one call, manager, resume; returns the step resumed."""
    run = start_run(out, resume, timestamp=stamp)
    run_dir = run.run_dir
    model = nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.fill_(value)
    ckpt = CheckpointManager(CKPT, run_dir, model=model)
    state = ckpt.resume(run.resume_from)
    return run_dir, ckpt, state.step if state else 0


def saves(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))


def test_resume_true_continues_the_newest_run_with_a_checkpoint_in_its_own_folder(tmp_path: Path) -> None:
    a_dir, a, _ = start(tmp_path, False, "20260101000000", 1.0)
    a.save(3)
    a.close()
    b_dir, b, step = start(tmp_path, False, "20260102000000", 2.0)  # run B: fresh, crashed before a save
    b.close()
    assert step == 0 and b_dir != a_dir

    run_dir, ckpt, step = start(tmp_path, True, "20260103000000", 0.0)
    # the only checkpoint is run A's: the resumed run must go on in A's folder, not B's
    assert step == 3
    assert run_dir == a_dir
    ckpt.save(4)
    ckpt.close()
    assert saves(a_dir) == ["step_3", "step_4"] and saves(b_dir) == []


def test_resume_true_picks_the_newest_runs_own_checkpoint(tmp_path: Path) -> None:
    a_dir, a, _ = start(tmp_path, False, "20260101000000", 1.0)
    a.save(5)
    a.close()
    b_dir, b, _ = start(tmp_path, False, "20260102000000", 2.0)
    b.save(2)
    b.close()

    run_dir, ckpt, step = start(tmp_path, True, "20260103000000", 0.0)
    assert (run_dir, step) == (b_dir, 2)
    assert float(ckpt.model.weight.flatten()[0]) == 2.0  # run B's weights, not A's (step 5 is A's)
    ckpt.save(3)
    ckpt.close()
    assert saves(b_dir) == ["step_2", "step_3"] and saves(a_dir) == ["step_5"]


def test_explicit_resume_path_writes_into_that_checkpoints_run(tmp_path: Path) -> None:
    a_dir, a, _ = start(tmp_path, False, "20260101000000", 1.0)
    a.save(4)
    a.close()
    b_dir, b, _ = start(tmp_path, False, "20260102000000", 2.0)
    b.save(1)
    b.close()

    path = str(a_dir / "checkpoints" / "step_4")
    run_dir, ckpt, step = start(tmp_path, path, "20260103000000", 0.0)
    assert (run_dir, step) == (a_dir, 4)
    assert float(ckpt.model.weight.flatten()[0]) == 1.0
    ckpt.save(5)
    ckpt.close()
    assert saves(a_dir) == ["step_4", "step_5"] and saves(b_dir) == ["step_1"]


def test_resume_true_without_any_checkpoint_starts_a_fresh_run(tmp_path: Path) -> None:
    run_dir, ckpt, step = start(tmp_path, True, "20260101000000", 0.0)
    ckpt.close()
    assert step == 0 and run_dir == tmp_path / "20260101000000"


def test_explicit_resume_path_without_a_checkpoint_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        start(tmp_path, str(tmp_path / "nowhere"), "20260101000000", 0.0)


def test_checkpoint_outside_a_run_folder_starts_a_new_run(tmp_path: Path) -> None:
    a_dir, a, _ = start(tmp_path / "elsewhere", False, "20260101000000", 1.0)
    a.save(2)
    a.close()
    loose = tmp_path / "handed_over" / "step_2"
    loose.parent.mkdir()
    (a_dir / "checkpoints" / "step_2").rename(loose)

    run_dir, ckpt, step = start(tmp_path / "out", str(loose), "20260105000000", 0.0)
    ckpt.save(3)
    ckpt.close()
    assert (run_dir, step) == (tmp_path / "out" / "20260105000000", 2) and saves(run_dir) == ["step_3"]
