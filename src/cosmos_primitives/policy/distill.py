"""``[distillation]`` for a GRPO recipe: the frozen teacher it names, and each batch's per-token
advantages from the teacher's scores (``cosmos_primitives.algo.distillation`` holds the math)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
import torch

from cosmos_primitives.algo.distillation import distillation_advantages, reverse_kl_per_token
from cosmos_primitives.policy.build import build_policy
from cosmos_primitives.policy.teacher import teacher_logprobs

if TYPE_CHECKING:  # pragma: no cover
    from cosmos_primitives.config.distillation import DistillationConfig
    from cosmos_primitives.config.policy import PolicyConfig
    from cosmos_primitives.config.train import TrainConfig
    from cosmos_primitives.data.rollout_batch import RolloutBatch
    from cosmos_primitives.parallel import ParallelMesh


def load_teacher(dist: DistillationConfig, mesh: ParallelMesh | None, device: torch.device | str, *,
                 policy_cfg: PolicyConfig, train: TrainConfig) -> torch.nn.Module | None:
    """The teacher of ``[distillation]`` (``dist``): None unless ``enable``; else ``model_name_or_path``
    loaded with the policy's loader (``[policy]`` ``policy_cfg`` for the dtype and sharding, ``[train]``)
    as a frozen model (no adapters, no gradients), sharded as the policy over ``mesh`` (or whole on
    ``device`` without one)."""
    if not dist.enable:
        return None
    teacher_cfg = msgspec.structs.replace(policy_cfg, model_name_or_path=dist.model_name_or_path,
                                          model_revision=dist.model_revision, lora=None)
    return build_policy(teacher_cfg, mesh, device=device, train=train, frozen=True)


def distill_advantages(teacher: torch.nn.Module, batch: RolloutBatch, reward_advantages: torch.Tensor,
                       dist: DistillationConfig, *, temperature: float, chunk_size: int | None = None,
                       ) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token advantages of ``batch`` from the teacher's log-probs of the student's sampled tokens.

    The divergence is the sampled reverse KL ``d_t = log pi_student(y_t) - log pi_teacher(y_t)``, the
    student's log-prob being the engine's (``batch.rollout_logprobs``, the distribution the token was
    drawn from), the teacher scoring at the same ``temperature`` (the trainer-side one:
    ``GRPOUpdateSettings.temperature``), in chunks of ``chunk_size`` tokens. The advantage of token t
    is ``-kl_penalty_coef * sum_{u >= t} gamma^(u - t) d_u``, plus ``reward_advantages`` with
    ``[distillation] reward_advantages = "add"`` (``"bypass"``, as cosmos-rl: the rewards do not
    enter it).

    Args:
        teacher: :func:`load_teacher`'s model.
        batch: ``N`` rows, ``completion_mask`` ``[N, T]``.
        reward_advantages: ``[N]`` group advantages of the rewards.
        dist: ``[distillation]``.

    Returns:
        ``([N, T]`` float32 advantages on the batch's device, 0 off the mask; metrics ``teacher_kl``
        (token mean of ``d``), ``teacher_kl_advantages``, ``teacher_kl_advantages_discounted``).
    """
    scores = teacher_logprobs(teacher, batch, micro_batch=dist.mini_batch, temperature=temperature,
                              chunk_size=chunk_size)
    mask = batch.completion_mask
    divergence = reverse_kl_per_token(batch.rollout_logprobs.float() * mask.float(), scores)
    base = reward_advantages.to(mask.device) if dist.reward_advantages == "add" else None
    advantages, metrics = distillation_advantages(divergence, mask, base, kl_penalty_coef=dist.kl_penalty_coef,
                                                  kl_discount_factor=dist.kl_discount_factor)
    return advantages.float(), {k: float(v) for k, v in metrics.items()}
