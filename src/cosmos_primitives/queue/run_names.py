"""The name of a disaggregated run and the Redis prefix all of its keys live under."""

from __future__ import annotations

RUN_STREAM_PREFIX = "cosmos:"


def run_stream(run_name: str) -> str:
    """The rollout stream of run ``run_name`` (``cosmos:<run_name>``), which is also the prefix of every
    other key of the run (``<stream>:weight_version``, ``<stream>:claims:*``, ``<stream>:jobs``, ...).

    ``--run NAME`` on the trainer job, the rollout jobs and ``python -m cosmos_primitives.queue.status``
    means this stream, so that jobs given the same run name meet.

    Raises:
        ValueError: an empty name, or one with whitespace.
    """
    if not isinstance(run_name, str) or not run_name:
        raise ValueError(f"run name {run_name!r} is empty; give every job of a run the same non-empty --run NAME")
    if any(ch.isspace() for ch in run_name):
        raise ValueError(f"run name {run_name!r} contains whitespace; use letters, digits, '-', '_' or '.'")
    return f"{RUN_STREAM_PREFIX}{run_name}"
