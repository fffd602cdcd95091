"""Run directories: ``<output_dir>/<timestamp>/`` as users of cosmos-rl know them."""

from __future__ import annotations

import re
import time
from pathlib import Path

_TIMESTAMP = re.compile(r"^\d{14}$")


def latest_run_dir(output_dir: str | Path) -> Path | None:
    """The newest ``<output_dir>/<YYYYmmddHHMMSS>`` folder, or None when there is none."""
    root = Path(output_dir)
    if not root.is_dir():
        return None
    runs = sorted(p for p in root.iterdir() if p.is_dir() and _TIMESTAMP.match(p.name))
    return runs[-1] if runs else None


def make_run_dir(output_dir: str | Path, *, reuse_latest: bool = False, timestamp: str | None = None) -> Path:
    """Create (or reuse) the run directory ``<output_dir>/<YYYYmmddHHMMSS>``.

    Args:
        output_dir: ``[train] output_dir``.
        reuse_latest: return the newest existing run directory when there is one (used on resume).
        timestamp: force the folder name; under ``torchrun`` rank 0 picks it and broadcasts it so
            that every rank writes into the same folder.
    """
    if reuse_latest:
        latest = latest_run_dir(output_dir)
        if latest is not None:
            return latest
    stamp = timestamp or time.strftime("%Y%m%d%H%M%S")
    path = Path(output_dir) / stamp
    path.mkdir(parents=True, exist_ok=True)
    return path
