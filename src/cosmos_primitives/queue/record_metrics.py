"""What a trainer logs about one step's records: rewards, weight versions, and which rollout jobs produced them.

A rollout job tags each record it puts with ``meta["producer"] = <job id>``; the trainer of
independent jobs (``examples/grpo_trainer_job.py``) summarises every step's records per producer
and logs it, so that a slow or stale job shows up in the trainer's log and metrics.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs
import torch

from cosmos_primitives.queue.record import RolloutRecord
from cosmos_primitives.rewards.registry import reward_metric_names

PRODUCER_KEY = "producer"
UNKNOWN_PRODUCER = "unknown"


@attrs.frozen
class ProducerShare:
    """One producer's records in one trainer step.

    Attributes:
        producer: the job id the records carry (``"unknown"`` for records without one).
        records: how many of the step's records it produced.
        min_version, max_version: the weight versions those records were sampled with.
        max_lag: ``trainer_step - min_version``: optimizer steps between the oldest weights it
            sampled with and the weights being trained.
    """

    producer: str
    records: int
    min_version: int
    max_version: int
    max_lag: int


def provenance(record: RolloutRecord) -> tuple[str, str, int]:
    """``(record_id, producer, weight_version)`` of ``record``: what the trainer keeps of it per step
    (small enough to gather from every trainer rank)."""
    return record.record_id, str(record.meta.get(PRODUCER_KEY, UNKNOWN_PRODUCER)), record.weight_version


def producer_shares(provenances: Iterable[tuple[str, str, int]], trainer_step: int) -> list[ProducerShare]:
    """Per-producer counts, versions and lag of a step's records (their :func:`provenance`), trained
    with the weights of ``trainer_step``; sorted by producer id."""
    versions: dict[str, list[int]] = {}
    for _, producer, version in provenances:
        versions.setdefault(producer, []).append(version)
    return [ProducerShare(p, len(v), min(v), max(v), trainer_step - min(v)) for p, v in sorted(versions.items())]


def format_shares(shares: Sequence[ProducerShare]) -> str:
    """One log fragment, e.g. ``rollout-a 3 (v4-5, lag <= 2), rollout-b 5 (v5, lag <= 1)``."""
    parts = []
    for s in shares:
        versions = f"v{s.min_version}" if s.min_version == s.max_version else f"v{s.min_version}-{s.max_version}"
        parts.append(f"{s.producer} {s.records} ({versions}, lag <= {s.max_lag})")
    return ", ".join(parts) if parts else "none"


def share_metrics(shares: Sequence[ProducerShare]) -> dict[str, float]:
    """Step metrics: how many producers fed the step and the largest lag among them."""
    return {"rollout/producers": float(len(shares)),
            "rollout/max_lag": float(max((s.max_lag for s in shares), default=0))}


def record_metrics(records: Sequence[RolloutRecord], reward_names: Sequence[str]) -> dict[str, float]:
    """Reward and weight-version metrics of one step's ``records`` (at least one).

    ``reward/mean`` / ``reward/std`` over every completion, ``reward/<name>`` (``<name>`` from
    ``cp.rewards.reward_metric_names``) the mean over records of the group means the rollout side put
    in ``meta`` (:func:`~cosmos_primitives.queue.records_from_scores`),
    ``rollout/weight_version`` the mean version the records were sampled with.
    """
    rewards = torch.tensor([x for r in records for x in r.rewards], dtype=torch.float64)
    return {
        "reward/mean": float(rewards.mean()), "reward/std": float(rewards.std(unbiased=False)),
        **{f"reward/{short}": sum(float(r.meta.get(f"reward/{name}", 0.0)) for r in records) / len(records)
           for name, short in reward_metric_names(reward_names).items()},
        "rollout/weight_version": sum(r.weight_version for r in records) / len(records),
    }
