"""TensorBoard and MLflow beside the console, JSONL and W&B, chosen by ``[logging] logger``: what they
record (read back with TensorBoard's own reader and MLflow's client), on resume, and with secrets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import cosmos_primitives as cp
from cosmos_primitives.config.errors import ConfigError
from cosmos_primitives.config.logging import LoggingConfig
from cosmos_primitives.logging import MetricsTracker
from cosmos_primitives.logging.mlflow_sink import RUN_ID_FILE, mlflow_key, mlflow_tracking_uri
from cosmos_primitives.testing.demo_assets import ensure_demo_assets
from cosmos_primitives.testing.recipe_runs import finish, launch_recipe, only_run_dir

REPO = Path(__file__).resolve().parents[1]

SECRET = "hunter2-do-not-log"


def tensorboard_scalars(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of ``tag`` as TensorBoard shows it (its reader applies purges)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def mlflow_history(run_dir: Path, key: str) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    record = json.loads((run_dir / RUN_ID_FILE).read_text())
    client = MlflowClient(tracking_uri=record["tracking_uri"])
    return sorted((m.step, m.value) for m in client.get_metric_history(record["run_id"], key))


def run(run_dir: Path, steps: range, tag: float, **kwargs) -> None:
    config = LoggingConfig(logger=["tensorboard", "mlflow"], project_name="proj")
    run_config = {"redis": {"url": f"redis://:{SECRET}@127.0.0.1:6379"}, "train": {"lr": 1e-4}}
    with MetricsTracker(run_dir, config, run_config=run_config, rank=0, **kwargs) as tracker:
        for step in steps:
            tracker.log_metrics({"train/loss": tag + 1.0 / step, "note": "text is skipped", "rollout/kl(k3)": 0.5},
                               step)


def test_both_sinks_record_every_step_and_no_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    run(tmp_path, range(1, 5), 0.0)
    expected = [(s, pytest.approx(1.0 / s)) for s in range(1, 5)]
    assert tensorboard_scalars(tmp_path / "tensorboard", "train/loss") == expected
    assert (tmp_path / "mlruns").is_dir()  # the offline file store in the run folder
    assert mlflow_history(tmp_path, "train/loss") == expected
    assert mlflow_history(tmp_path, mlflow_key("rollout/kl(k3)")) == [(s, 0.5) for s in range(1, 5)]
    leaked = [p for p in tmp_path.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert not leaked
    configs = list(tmp_path.rglob("config.json"))
    assert len(configs) == 1 and json.loads(configs[0].read_text())["train"]["lr"] == 1e-4


def test_a_resumed_run_shows_each_step_once_in_tensorboard_and_goes_on_in_the_same_mlflow_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run(tmp_path, range(1, 6), 0.0)  # interrupted after step 5; its last checkpoint is step 3
    first_id = json.loads((tmp_path / RUN_ID_FILE).read_text())["run_id"]
    run(tmp_path, range(4, 8), 10.0, resumed_step=3)
    shown = tensorboard_scalars(tmp_path / "tensorboard", "train/loss")
    assert [s for s, _ in shown] == list(range(1, 8))
    assert [v for s, v in shown if s > 3] == pytest.approx([10.0 + 1.0 / s for s in range(4, 8)])
    assert json.loads((tmp_path / RUN_ID_FILE).read_text())["run_id"] == first_id
    assert {s for s, _ in mlflow_history(tmp_path, "train/loss")} == set(range(1, 8))


def test_configured_places_win_over_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "from_env").as_uri())
    assert mlflow_tracking_uri(tmp_path / "run") == (tmp_path / "from_env").as_uri()
    assert mlflow_tracking_uri(tmp_path / "run", "sqlite:///x.db") == "sqlite:///x.db"
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb_env"))
    config = LoggingConfig(logger=["tensorboard"], tensorboard_dir=str(tmp_path / "tb_conf"))
    with MetricsTracker(tmp_path / "run", config, rank=0) as tracker:
        tracker.log_metrics({"loss": 1.0}, 1)
    assert tensorboard_scalars(tmp_path / "tb_conf", "loss") == [(1, 1.0)]
    assert not (tmp_path / "tb_env").exists()


def test_other_ranks_write_nothing(tmp_path: Path) -> None:
    with MetricsTracker(tmp_path, LoggingConfig(logger=["tensorboard", "mlflow"]), rank=1) as tracker:
        tracker.log_metrics({"loss": 1.0}, 1)
    assert not list(tmp_path.iterdir())


def test_the_logger_list_is_read_from_the_config_and_a_wrong_name_lists_the_choices(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('config_style = "cosmos_primitives"\n[logging]\nlogger = ["console", "tensorboard", "mlflow"]\n')
    assert cp.load_config(path).logging.logger == ["console", "tensorboard", "mlflow"]
    path.write_text('config_style = "cosmos_primitives"\n[logging]\nlogger = ["console", "tensorbord"]\n')
    with pytest.raises(ConfigError) as err:
        cp.load_config(path)
    assert "logging.logger.1" in str(err.value) and "tensorbord" in str(err.value)
    assert "one of 'console', 'wandb', 'tensorboard', 'mlflow'" in str(err.value)


@pytest.mark.slow
def test_the_sft_recipe_writes_tensorboard_and_mlflow_when_its_config_asks(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # for reading the run's file store here
    config = REPO / "examples" / "configs" / "sft_tiny.toml"
    paths = [f"policy.model_name_or_path={tmp_path / 'model'}", f"train.train_policy.dataset.name={tmp_path / 'data'}"]
    ensure_demo_assets(cp.load_config(config, [p.replace("=", "=demo:", 1) for p in paths] + ["custom.demo_items=8"]))
    log = tmp_path / "run.log"
    overrides = [*paths, f"train.output_dir={tmp_path / 'runs'}", "train.max_steps=3",
                 "logging.logger=['console', 'tensorboard', 'mlflow']"]
    finish(launch_recipe("examples/sft.py", config, overrides, log, cwd=REPO), log)
    run_dir = only_run_dir(tmp_path / "runs")
    losses = [(r["step"], pytest.approx(r["loss"], rel=1e-6)) for r in cp.logging.read_metrics(run_dir) if "loss" in r]
    assert len(losses) == 3
    assert tensorboard_scalars(run_dir / "tensorboard", "loss") == losses
    assert mlflow_history(run_dir, "loss") == losses
