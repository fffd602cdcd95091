"""Scalars of a run as TensorBoard event files (``[logging] logger = [..., "tensorboard"]``)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cosmos_primitives.config.secrets import redact_secrets
from cosmos_primitives.utils.extras import require

TENSORBOARD_SUBDIR = "tensorboard"


def tensorboard_dir(run_dir: str | Path, configured: str | None = None) -> Path:
    """Where the event files go: ``[logging] tensorboard_dir``, else ``$TENSORBOARD_DIR`` (verl's
    variable), else ``<run_dir>/tensorboard``."""
    chosen = configured or os.environ.get("TENSORBOARD_DIR")
    return Path(chosen) if chosen else Path(run_dir) / TENSORBOARD_SUBDIR


class TensorBoardSink:
    """Write numeric metrics with ``torch.utils.tensorboard.SummaryWriter``.

    A resumed run passes ``resumed_step``: the writer purges events after it (TensorBoard's
    ``purge_step``), so steps the interrupted run logged and the resumed run logs again show once,
    with the resumed run's values. The run's config (secrets redacted) is recorded as text.
    """

    def __init__(self, log_dir: str | Path, *, run_config: Mapping[str, Any] | None = None,
                 resumed_step: int | None = None) -> None:
        require("tensorboard", "logging to TensorBoard")
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        self._writer = SummaryWriter(log_dir=str(self.log_dir),
                                     purge_step=None if resumed_step is None else resumed_step + 1)
        if run_config and resumed_step is None:
            text = json.dumps(redact_secrets(dict(run_config)), indent=2, default=str)
            self._writer.add_text("config", f"```\n{text}\n```", global_step=0)

    def log(self, values: Mapping[str, float | int | str], step: int) -> None:
        """Add each numeric value of ``values`` as a scalar at ``step`` (strings are skipped)."""
        for key, value in values.items():
            if isinstance(value, (int, float)):
                self._writer.add_scalar(key, value, global_step=step)

    def flush(self) -> None:
        self._writer.flush()

    def finish(self) -> None:
        self._writer.close()
