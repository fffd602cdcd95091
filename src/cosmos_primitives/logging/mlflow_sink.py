"""Metrics of a run in MLflow (``[logging] logger = [..., "mlflow"]``): a tracking server, a database,
or by default a file store in the run folder, which works offline."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cosmos_primitives.config.secrets import redact_secrets
from cosmos_primitives.utils.extras import require

MLFLOW_SUBDIR = "mlruns"
RUN_ID_FILE = "mlflow_run.json"  # in the run folder: a resumed run goes on in the same MLflow run
_BAD_KEY_CHARS = re.compile(r"[^\w\-. /:]")  # MLflow keys allow letters, digits, _ - . space / :


def mlflow_tracking_uri(run_dir: str | Path, configured: str | None = None) -> str:
    """``[logging] mlflow_tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else a file store
    ``<run_dir>/mlruns``."""
    return configured or os.environ.get("MLFLOW_TRACKING_URI") or (Path(run_dir).resolve() / MLFLOW_SUBDIR).as_uri()


def mlflow_key(name: str) -> str:
    """``name`` with the characters MLflow refuses in metric names replaced by ``_``."""
    return _BAD_KEY_CHARS.sub("_", name)


class MlflowSink:
    """Log numeric metrics to one MLflow run with ``MlflowClient.log_batch`` (one request per step).

    The experiment is ``[logging] project_name``; the run is named like the W&B run. Its id is kept in
    ``<run_dir>/mlflow_run.json``, so a resumed run logs into the same MLflow run (MLflow keeps every
    value: steps the interrupted run logged after its last checkpoint appear twice, the resumed run's
    values logged later). The config, secrets redacted, is stored as the artifact ``config.json``.
    """

    def __init__(self, run_dir: str | Path, *, tracking_uri: str, experiment: str, run_name: str,
                 run_config: Mapping[str, Any] | None = None) -> None:
        if tracking_uri.startswith("file:"):
            # MLflow 3 refuses its file store unless asked: chosen here on purpose (offline, in the run folder)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        require("mlflow", "logging to MLflow")
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=tracking_uri)
        record = Path(run_dir) / RUN_ID_FILE
        previous = json.loads(record.read_text()) if record.is_file() else {}
        if previous.get("tracking_uri") == tracking_uri:
            self.run_id = previous["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            return
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        tmp = record.with_name(record.name + ".tmp")
        tmp.write_text(json.dumps({"tracking_uri": tracking_uri, "run_id": self.run_id}))
        os.replace(tmp, record)
        if run_config:
            self.client.log_dict(self.run_id, redact_secrets(dict(run_config)), "config.json")

    def log(self, values: Mapping[str, float | int | str], step: int) -> None:
        """Log each numeric value of ``values`` at ``step`` (strings are skipped)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(mlflow_key(k), float(v), now, step) for k, v in values.items()
                   if isinstance(v, (int, float))]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def finish(self) -> None:
        self.client.set_terminated(self.run_id)
