"""The sizes both roles of a disaggregated GRPO job agree on, computed and checked from the config."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from cosmos_primitives.queue.run_control import check_queue_capacity

if TYPE_CHECKING:  # pragma: no cover
    from cosmos_primitives.config.root import Config
    from cosmos_primitives.parallel.roles import RoleSplit


class QueuePlan(NamedTuple):
    """Sizes both roles agree on (computed identically on every rank from the config)."""

    records_per_step: int  # all trainer ranks together
    records_per_trainer: int  # per trainer rank and step
    prompts_per_rollout: int  # records one rollout rank puts per generate call


def plan_disaggregated(cfg: Config, roles: RoleSplit) -> QueuePlan:
    """The plan of ``[disaggregated]`` for ``roles``: ``records_per_step`` (default ``[grpo]
    rollout_batch_size`` per trainer rank) and ``prompts_per_rollout`` (default
    ``rollout_batch_size``).

    Raises:
        ValueError: naming the key, when ``records_per_step`` does not split evenly over the trainer
            ranks, ``[grpo] rollouts_per_step`` is set (the colocated recipe's),
            ``[redis] max_pending`` is too small for the staleness bound
            (:func:`~cosmos_primitives.queue.run_control.check_queue_capacity`), or an export upload is
            configured (a disaggregated run does not upload yet).
    """
    plan = _sizes(cfg, roles.num_trainers)
    check_queue_capacity(cfg.redis.max_pending, cfg.grpo.allowed_outdated_steps, plan.records_per_step,
                         roles.num_rollouts, plan.prompts_per_rollout, on_policy=cfg.grpo.on_policy)
    ckpt = cfg.train.ckpt
    if ckpt.upload_s3 or ckpt.upload_hf:
        raise ValueError("a disaggregated run does not upload exports yet: set [train.ckpt] upload_s3 = false and "
                         "upload_hf = false, and upload <run_dir>/safetensors/final yourself")
    return plan


def plan_jobs(cfg: Config, num_trainers: int) -> QueuePlan:
    """The plan of independent trainer / rollout jobs, the trainer job having ``num_trainers`` ranks.

    The same sizes as :func:`plan_disaggregated`, without the queue-capacity check: rollout jobs come
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
