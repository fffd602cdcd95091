"""``[logging]``: where metrics go."""

from __future__ import annotations

from typing import Literal

import msgspec

from cosmos_primitives.config.base import AtLeastOne, Section


class LoggingConfig(Section):
    """``[logging]``. JSONL metrics are always written to the run directory."""

    logger: list[Literal["console", "wandb"]] = msgspec.field(default_factory=lambda: ["console"])
    project_name: str = "cosmos_primitives"
    experiment_name: str = ""
    log_freq: AtLeastOne = 1
