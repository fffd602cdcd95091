"""The sizes the trainer job and the rollout jobs agree on, computed and checked from the config."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # pragma: no cover
    from cosmos_primitives.config.root import Config


class QueuePlan(NamedTuple):
    """Sizes both roles agree on (computed identically on every rank from the config)."""

    records_per_step: int  # all trainer ranks together
    records_per_trainer: int  # per trainer rank and step
    prompts_per_rollout: int  # records one rollout rank puts per generate call


def plan_jobs(cfg: Config, num_trainers: int) -> QueuePlan:
    """The plan of independent trainer / rollout jobs, the trainer job having ``num_trainers`` ranks.

    ``records_per_step`` (default ``[grpo] rollout_batch_size`` per trainer rank) and ``prompts_per_rollout``
    (default ``rollout_batch_size``), without a queue-capacity check: rollout jobs come
    and go, and a rollout job that waits for room in the queue blocks nobody (the trainer serves its
    weights from a background thread, it never waits for a rollout job).

    Raises:
        ValueError: naming the key, when ``records_per_step`` does not split evenly over the trainer ranks.
    """
    return _sizes(cfg, num_trainers)


def _sizes(cfg: Config, num_trainers: int) -> QueuePlan:
    dis, grpo = cfg.disaggregated, cfg.grpo
    if grpo.rollouts_per_step is not None:
        raise ValueError(f"[grpo] rollouts_per_step = {grpo.rollouts_per_step} (a cosmos-rl train_batch_per_replica "
                         "smaller than a generation) is trained by the colocated recipe, examples/grpo_vlm.py; a "
                         "disaggregated trainer takes whole records (a prompt's group each): unset it and size "
                         "steps with [disaggregated] records_per_step")
    per_step = dis.records_per_step or grpo.rollout_batch_size * num_trainers
    if per_step % num_trainers:
        raise ValueError(f"[disaggregated] records_per_step = {per_step} must be a multiple of the "
                         f"{num_trainers} trainer ranks (each trains on the same number of records)")
    per_put = dis.prompts_per_rollout or grpo.rollout_batch_size
    return QueuePlan(per_step, per_step // num_trainers, per_put)
