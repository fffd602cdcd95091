"""Metrics tracker (console, JSONL, W&B offline), progress bars and the plot command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cosmos_primitives.config import LoggingConfig
from cosmos_primitives.logging import MetricsTracker, progress, read_metrics


def test_jsonl_and_console(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    with MetricsTracker(tmp_path, LoggingConfig(logger=["console"]), total_steps=2, rank=0) as tracker:
        tracker.log_metrics({"loss": torch.tensor(0.5), "reward/mean": 0.25, "lr": 1e-5}, step=1)
        tracker.log_metrics({"loss": 0.4, "reward/mean": 0.5}, step=2)
    records = read_metrics(tmp_path)
    assert [(r["step"], r["loss"]) for r in records] == [(1, 0.5), (2, 0.4)]
    assert records[0]["reward/mean"] == 0.25
    err = capfd.readouterr().err
    assert "Step: 1/2, loss: 0.5000, reward/mean: 0.2500, lr: 1.000e-05" in err
    assert "[cosmos]" in err


def test_non_zero_rank_writes_nothing(tmp_path: Path) -> None:
    tracker = MetricsTracker(tmp_path / "run", LoggingConfig(), rank=1)
    tracker.log_metrics({"loss": 1.0}, step=1)
    tracker.finish()
    assert not (tmp_path / "run").exists()


def test_wandb_offline_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = LoggingConfig(logger=["wandb"], project_name="cp_test", experiment_name="unit/offline", group_name="ablation")
    run_dir = tmp_path / "20261127120000"  # <output_dir>/<timestamp>, as the recipes name it
    tracker = MetricsTracker(run_dir, cfg, run_config={"train": {"epoch": 1}}, rank=0)
    assert tracker._wandb_run is not None
    assert tracker._wandb_run.settings.mode == "offline"
    # cosmos-rl's naming: <experiment_name>/<timestamp>, the group kept
    assert tracker._wandb_run.project == "cp_test" and tracker._wandb_run.name == "unit/offline/20261127120000"
    assert tracker._wandb_run.group == "ablation"
    tracker.log_metrics({"loss": 1.5}, step=3)
    tracker.finish()
    runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
    assert read_metrics(run_dir)[0]["loss"] == 1.5


def test_wandb_run_names_as_cosmos_rl() -> None:
    from cosmos_primitives.logging import wandb_run_name

    assert wandb_run_name(LoggingConfig(experiment_name="sft"), "/out/20261127120000") == "sft/20261127120000"
    assert wandb_run_name(LoggingConfig(), "/out/20261127120000") == "/out/20261127120000"  # cosmos-rl: the path
    assert wandb_run_name(LoggingConfig(experiment_name="sft", wandb_run_name="exact"), "/out/1") == "exact"


def test_plot_command_writes_png(tmp_path: Path) -> None:
    with MetricsTracker(tmp_path, LoggingConfig(logger=[]), rank=0) as tracker:
        for step in range(1, 6):
            tracker.log_metrics({"loss": 1.0 / step, "reward/mean": step / 5, "lr": 1e-4}, step=step)
    out = subprocess.run([sys.executable, "-m", "cosmos_primitives.plot", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    png = tmp_path / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"Wrote {png}" in out.stdout


def test_plot_command_explains_missing_metrics(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "cosmos_primitives.plot", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "metrics.jsonl not found" in out.stderr
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "lr": 0.1}) + "\n")
    out = subprocess.run([sys.executable, "-m", "cosmos_primitives.plot", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "available: lr" in out.stderr


def test_progress_yields_everything_and_hides_off_rank0(monkeypatch: pytest.MonkeyPatch,
                                                        capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("COSMOS_NO_PROGRESS", raising=False)
    monkeypatch.setenv("RANK", "1")
    assert list(progress(range(5), total=5, desc="rank1")) == [0, 1, 2, 3, 4]
    assert "rank1" not in capfd.readouterr().err
    monkeypatch.setenv("RANK", "0")
    assert list(progress(range(3), total=3, desc="rank0bar")) == [0, 1, 2]
    assert "rank0bar" in capfd.readouterr().err


def test_terminal_gets_a_progress_bar_with_eta_instead_of_step_lines(tmp_path: Path,
                                                                    capfd: pytest.CaptureFixture[str]) -> None:
    import io

    terminal = io.StringIO()
    with MetricsTracker(tmp_path, LoggingConfig(), rank=0, total_steps=10, prefix="[SFT] ", terminal=terminal) as t:
        for step in (4, 5, 6):  # a resumed run: its first step is 4
            t.log_metrics({"loss": 0.5 / step}, step=step)
        t.log_text("Exported safetensors to x")
    bar = terminal.getvalue()
    assert "6/10" in bar and "loss: 0.0833" in bar and "<" in bar  # tqdm's "elapsed<remaining"
    assert "Exported safetensors to x" in bar  # messages printed above the bar
    assert "Step: 4/10" not in capfd.readouterr().err  # the bar replaces the per-step lines
    assert [r["step"] for r in read_metrics(tmp_path)] == [4, 5, 6]  # every step still in the file


def test_files_and_pipes_keep_the_step_lines(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    with MetricsTracker(tmp_path, LoggingConfig(), rank=0, total_steps=10, prefix="[SFT] ") as t:
        t.log_metrics({"loss": 0.25}, step=1)  # stderr is a pipe under pytest
    assert "[SFT] Step: 1/10, loss: 0.2500" in capfd.readouterr().err
