"""Render loss / reward curves of a run's ``metrics.jsonl`` to PNG."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from cosmos_primitives.logging.tracker import metric_series, read_metrics
from cosmos_primitives.utils.extras import require

DEFAULT_PATTERN = r"(^|/)(loss|reward)([/_].*)?$|^(reward|loss)"


def plot_run(run_dir: str | Path, out: str | Path | None = None, keys: Sequence[str] | None = None) -> Path:
    """Plot metrics of ``run_dir`` into one PNG, one panel per metric.

    Args:
        keys: metric names; default: every metric whose name is or starts with loss / reward.
        out: PNG path; default ``<run_dir>/curves.png``.

    Raises:
        ValueError: no metric matched (the message lists the metrics that exist).
    """
    matplotlib = require("matplotlib", "plotting run curves")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(run_dir)
    available = sorted({k for r in records for k, v in r.items()
                        if k not in ("step", "time") and isinstance(v, (int, float))})
    chosen = list(keys) if keys else [k for k in available if re.search(DEFAULT_PATTERN, k)]
    chosen = [k for k in chosen if k in available]
    if not chosen:
        raise ValueError(f"no metric to plot in {run_dir}; available: {', '.join(available) or 'none'}")
    cols = min(3, len(chosen))
    rows = (len(chosen) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.2 * rows), squeeze=False)
    for ax, key in zip(axes.flat, chosen):
        steps, values = metric_series(records, key)
        ax.plot(steps, values, marker="." if len(steps) < 50 else None)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(chosen):]:
        ax.axis("off")
    fig.tight_layout()
    out = Path(out) if out else Path(run_dir) / "curves.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
