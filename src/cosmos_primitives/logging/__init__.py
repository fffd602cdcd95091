"""Metrics to console, JSONL and W&B; progress bars; plots of a run; sample videos."""

from cosmos_primitives.logging.console import get_logger
from cosmos_primitives.logging.plot import plot_run
from cosmos_primitives.logging.progress_bar import progress
from cosmos_primitives.logging.samples import save_video_samples
from cosmos_primitives.logging.tracker import MetricsTracker, metric_series, read_metrics, wandb_run_name

__all__ = [  # the public surface (tests/test_public_surface.py); the rest by module path
    "MetricsTracker", "get_logger", "plot_run", "progress", "read_metrics", "save_video_samples",
]
