"""``[logging]``: where metrics go."""

from __future__ import annotations

from typing import Literal

import msgspec

from cosmos_primitives.config.base import AtLeastOne, Section


class LoggingConfig(Section):
    """``[logging]``. JSONL metrics are always written to the run directory.

    W&B (cosmos-rl's naming): the run is named ``<experiment_name>/<timestamp>`` (the run folder's
    name), or the run folder's path without ``experiment_name``; ``wandb_run_name`` names it exactly;
    ``group_name`` groups runs.

    TensorBoard: event files in ``tensorboard_dir``, else ``$TENSORBOARD_DIR``, else
    ``<run_dir>/tensorboard``. MLflow: experiment ``project_name``, run named as for W&B, tracked at
    ``mlflow_tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else a file store ``<run_dir>/mlruns``.
    """

    logger: list[Literal["console", "wandb", "tensorboard", "mlflow"]] = msgspec.field(
        default_factory=lambda: ["console"])
    project_name: str = "cosmos_primitives"
    experiment_name: str = ""
    group_name: str | None = None
    wandb_run_name: str | None = None
    log_freq: AtLeastOne = 1
    tensorboard_dir: str | None = None
    mlflow_tracking_uri: str | None = None
