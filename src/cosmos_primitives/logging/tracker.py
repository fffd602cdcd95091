"""One metrics tracker: console lines, ``metrics.jsonl`` in the run directory, W&B, TensorBoard and MLflow."""

from __future__ import annotations

import json
import math
import os
import sys
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from cosmos_primitives.config.logging import LoggingConfig
from cosmos_primitives.config.secrets import redact_secrets
from cosmos_primitives.logging.console import get_logger
from cosmos_primitives.logging.mlflow_sink import MlflowSink, mlflow_tracking_uri
from cosmos_primitives.logging.tensorboard_sink import TensorBoardSink, tensorboard_dir
from cosmos_primitives.utils.extras import require

METRICS_FILE = "metrics.jsonl"

_LIVE: weakref.WeakSet[MetricsTracker] = weakref.WeakSet()


def live_trackers() -> list[MetricsTracker]:
    """The trackers of this process not yet finished (what a Ctrl-C closes, ``cp.checkpoint.exit_on_interrupt``)."""
    return list(_LIVE)


def _scalar(value: Any) -> float | int | str:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, (bool, int)):
        return int(value)
    if isinstance(value, float):
        return value
    return str(value)


def _fmt(value: float | int | str) -> str:
    if isinstance(value, float):
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5) and math.isfinite(value):
            return f"{value:.3e}"
        return f"{value:.4f}"
    return str(value)


def wandb_run_name(config: LoggingConfig, run_dir: str | Path) -> str:
    """The W&B run's name, as cosmos-rl names it: ``[logging] wandb_run_name`` when set, else
    ``<experiment_name>/<timestamp>`` (the run folder's name), else the run folder's path."""
    run_dir = Path(run_dir)
    if config.wandb_run_name:
        return config.wandb_run_name
    return f"{config.experiment_name}/{run_dir.name}" if config.experiment_name else str(run_dir)


class MetricsTracker:
    """Log scalar metrics per step to the console, ``<run_dir>/metrics.jsonl``, W&B, TensorBoard and MLflow.

    Only rank 0 writes (other ranks' calls are no-ops). W&B runs offline (under
    ``<run_dir>/wandb``) when ``WANDB_API_KEY`` is not set; its project, group and name come from
    ``[logging]`` (:func:`wandb_run_name`).

    Args:
        run_dir: the run directory (``<output_dir>/<timestamp>``).
        config: ``[logging]``; ``logger`` selects any of ``"console"``, ``"wandb"``, ``"tensorboard"``
            (:class:`~cosmos_primitives.logging.tensorboard_sink.TensorBoardSink`) and ``"mlflow"``
            (:class:`~cosmos_primitives.logging.mlflow_sink.MlflowSink`).
        run_config: the whole config as a dict, recorded in W&B, TensorBoard and MLflow with secrets redacted
            (:func:`~cosmos_primitives.config.secrets.redact_secrets`).
        rank: this process's global rank.
        total_steps: printed as ``step N/total`` when known.
        terminal: the stream a progress bar goes to; None: ``sys.stderr`` when it is a terminal
            (and ``COSMOS_NO_PROGRESS`` is not ``1``).
        resumed_step: the step a resumed run goes on from (its checkpoint's). Rows of later steps,
            which the interrupted run logged before it stopped and the resumed run logs again, are
            dropped from ``metrics.jsonl`` (rewritten atomically), so each step appears once with the
            values of the run that carried on; the progress bar starts at this step and its rate
            counts the new steps only.

    On a terminal (rank 0, ``total_steps`` known, ``"console"`` logging) the per-step console lines
    give way to a progress bar with the step, the ETA and the last metrics; written to a file or a
    pipe, the lines stay (``metrics.jsonl`` has every step either way).
    """

    def __init__(self, run_dir: str | Path, config: LoggingConfig | None = None, *,
                 run_config: Mapping[str, Any] | None = None, rank: int | None = None,
                 total_steps: int | None = None, prefix: str = "", terminal: TextIO | None = None,
                 resumed_step: int | None = None) -> None:
        self.config = config or LoggingConfig()
        self.run_dir = Path(run_dir)
        self.rank = int(os.environ.get("RANK", "0")) if rank is None else rank
        self.total_steps = total_steps
        self.last_step: int | None = None  # the latest step logged
        if terminal is None and sys.stderr.isatty() and os.environ.get("COSMOS_NO_PROGRESS") != "1":
            terminal = sys.stderr
        self._bar = None
        if terminal is not None and self.rank == 0 and total_steps and "console" in self.config.logger:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total_steps, desc=prefix.strip() or None, file=terminal, dynamic_ncols=True,
                             unit="step", initial=min(resumed_step or 0, total_steps))
        self.prefix = prefix
        self.log = get_logger()
        self._jsonl = None
        self._wandb_run = None
        self._sinks: list[TensorBoardSink | MlflowSink] = []
        if self.rank != 0:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if resumed_step is not None:
            _drop_rows_after(self.run_dir / METRICS_FILE, resumed_step)
        self._jsonl = (self.run_dir / METRICS_FILE).open("a", buffering=1)
        if "wandb" in self.config.logger:
            self._wandb_run = self._start_wandb(run_config)
        if "tensorboard" in self.config.logger:
            self._sinks.append(TensorBoardSink(tensorboard_dir(self.run_dir, self.config.tensorboard_dir),
                                               run_config=run_config, resumed_step=resumed_step))
        if "mlflow" in self.config.logger:
            uri = mlflow_tracking_uri(self.run_dir, self.config.mlflow_tracking_uri)
            self._sinks.append(MlflowSink(self.run_dir, run_config=run_config, tracking_uri=uri,
                                          experiment=self.config.project_name,
                                          run_name=wandb_run_name(self.config, self.run_dir)))
        _LIVE.add(self)

    def _start_wandb(self, run_config: Mapping[str, Any] | None) -> Any:
        wandb = require("wandb", "logging to Weights & Biases")
        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        return wandb.init(
            project=self.config.project_name,
            group=self.config.group_name,
            name=wandb_run_name(self.config, self.run_dir),
            id=self.run_dir.name.replace("/", "_") if self.run_dir.name else None,
            dir=str(self.run_dir),
            config=redact_secrets(run_config or {}),  # W&B keeps what it gets: no passwords or tokens
            mode=mode,
            resume="allow",
            settings=wandb.Settings(silent=True, console="off"),
        )

    @property
    def active(self) -> bool:
        return self.rank == 0

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        """Record ``metrics`` (scalars or 0-d tensors) at ``step``."""
        if self.rank != 0:
            return
        values = {k: _scalar(v) for k, v in metrics.items()}
        self.last_step = step if self.last_step is None else max(self.last_step, step)
        record = {"step": step, "time": time.time(), **values}
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(record) + "\n")
        if self._bar is not None:
            if self._bar.n == 0 and step > 1:  # resumed without resumed_step: the ETA counts from here
                self._bar.n = self._bar.last_print_n = step - 1
                self._bar.start_t = self._bar.last_print_t = time.time()
            self._bar.update(max(step - self._bar.n, 0))
            self._bar.set_postfix_str(", ".join(f"{k}: {_fmt(v)}" for k, v in list(values.items())[:4]))
        elif "console" in self.config.logger and step % max(self.config.log_freq, 1) == 0:
            where = f"{step}/{self.total_steps}" if self.total_steps else str(step)
            body = ", ".join(f"{k}: {_fmt(v)}" for k, v in values.items())
            self.log.info(f"{self.prefix}Step: {where}, {body}")
        if self._wandb_run is not None:
            self._wandb_run.log(values, step=step)
        for sink in self._sinks:
            sink.log(values, step)

    def log_videos(self, key: str, paths: Sequence[str | Path], captions: Sequence[str], step: int) -> None:
        """Send mp4 files to W&B under ``key`` at ``step`` (offline runs keep them under
        ``<run_dir>/wandb/.../files/media/videos``); nothing without W&B."""
        if self._wandb_run is None:
            return
        wandb = require("wandb", "logging videos to Weights & Biases")
        self._wandb_run.log({key: [wandb.Video(str(p), caption=c, format="mp4") for p, c in zip(paths, captions)]},
                            step=step)

    def log_text(self, message: str) -> None:
        if self.rank == 0:
            if self._bar is not None:
                self._bar.write(message, file=self._bar.fp)
            else:
                self.log.info(message)

    def finish(self) -> None:
        """Flush and close the progress bar, the JSONL file, the W&B run and the TensorBoard / MLflow sinks."""
        _LIVE.discard(self)
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._wandb_run is not None:
            self._wandb_run.finish()
            self._wandb_run = None
        for sink in self._sinks:
            sink.finish()
        self._sinks = []

    def __enter__(self) -> MetricsTracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()


def _drop_rows_after(path: Path, step: int) -> None:
    """Rewrite ``path`` (atomically: a temporary file renamed over it) without the rows of steps after ``step``."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line).get("step", 0) <= step:
                kept.append(line)
        except (json.JSONDecodeError, AttributeError, TypeError):
            continue  # a torn last line of the interrupted run
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(f"{line}\n" for line in kept))
    os.replace(tmp, path)


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """Records of ``<run_dir>/metrics.jsonl`` in order (a torn last line is ignored)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: is {run_dir} a run directory written by MetricsTracker?")
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def metric_series(records: Sequence[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one numeric metric."""
    steps, values = [], []
    for r in records:
        if key in r and isinstance(r[key], (int, float)):
            steps.append(int(r["step"]))
            values.append(float(r[key]))
    return steps, values
