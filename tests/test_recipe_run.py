"""cp.run: the start-up and ending the recipes share (one process, no torchrun)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import cosmos_primitives as cp
from cosmos_primitives.checkpoint import CheckpointManager

CONFIG = Path(__file__).resolve().parents[1] / "examples" / "configs" / "wfm_flowgrpo_tiny.toml"


def started(out: Path, *overrides: str) -> cp.run.RecipeRun:
    cfg = cp.load_config(CONFIG, [f"train.output_dir={out}", *overrides])
    return cp.run.start(cfg, str(CONFIG), prefix="[T] ")


def test_start_writes_the_config_and_a_resume_continues_the_run_that_saved(tmp_path: Path) -> None:
    first = started(tmp_path, "train.ckpt.save_mode=sync")
    assert first.run_dir.parent == tmp_path and first.resume_from is None
    assert (first.run_dir / "config.toml").is_file() and first.info.world_size == 1
    ckpt = CheckpointManager(first.cfg.train.ckpt, first.run_dir, model=nn.Linear(2, 1))
    ckpt.save(1)
    ckpt.close()
    (tmp_path / "29990101000000").mkdir()  # a later run that never saved

    resumed = started(tmp_path, "train.resume=true")
    assert resumed.run_dir == first.run_dir and resumed.resume_from == first.run_dir


class Closing:
    """Stands in for the checkpoint manager and the tracker: records the ending's calls in order."""

    def __init__(self, calls: list[str], failures: list[str] | None = None) -> None:
        self.calls, self.failures = calls, failures or []

    def export_final(self) -> None:
        self.calls.append("export_final")

    def close(self) -> list[str]:
        self.calls.append("close")
        return self.failures

    def finish(self) -> None:
        self.calls.append("tracker.finish")


class Stopped:
    """A preemption that stopped the run."""

    stopped = True

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def restore(self) -> None:
        self.calls.append("restore")

    def exit_if_stopped(self) -> None:
        raise SystemExit(cp.checkpoint.PREEMPTED_EXIT_CODE)


def test_finish_exports_closes_and_plots(tmp_path: Path) -> None:
    run = started(tmp_path)
    calls: list[str] = []
    (run.run_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "loss": 0.5}\n')
    run.finish(Closing(calls), Closing(calls), step=2, total_steps=2, plot=["loss"])
    assert calls == ["export_final", "close", "tracker.finish"]
    assert (run.run_dir / "curves.png").is_file() and not torch.distributed.is_initialized()


def test_finish_after_preemption_skips_the_export_and_exits_75(tmp_path: Path) -> None:
    run = started(tmp_path)
    calls: list[str] = []
    with pytest.raises(SystemExit) as stopped:
        run.finish(Closing(calls), None, Stopped(calls), step=1, total_steps=2)
    assert stopped.value.code == cp.checkpoint.PREEMPTED_EXIT_CODE == 75
    assert calls == ["restore", "close"]


def test_finish_names_failed_uploads(tmp_path: Path) -> None:
    run = started(tmp_path)
    with pytest.raises(SystemExit, match="1 upload"):
        run.finish(Closing([], failures=["s3: step_2"]), step=2, total_steps=2)
