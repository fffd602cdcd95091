"""FlowGRPO (arXiv 2505.05470): group advantages, the per-step clipped policy loss with a
closed-form KL to the reference, and which denoising steps to train (REFERENCE.md section 3).

Pure functions of tensors. The per-step log-probs come from
:func:`cosmos_primitives.algo.flow_step.recompute_step` (current policy) and the stored
trajectory (old policy); the KL from :func:`cosmos_primitives.algo.flow_sde.gaussian_mean_kl`.
"""

from __future__ import annotations

from typing import Literal

import attrs
import torch

from cosmos_primitives.algo.advantages import group_stats

ADVANTAGE_EPS = 1e-4


def flow_grpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor | None = None, *,
                         std_scope: Literal["group", "batch"] = "group", eps: float = ADVANTAGE_EPS,
                         unbiased: bool = False) -> torch.Tensor:
    """``A = (r - mean_group) / (std + eps)``, population std (numpy's, as Flow-GRPO) unless ``unbiased``:
    :func:`cp.algo.group_stats` with Flow-GRPO's rule for a sample alone in its group (its own
    reward is its mean, std 0: advantage 0; the LLM GRPO rule would give it its reward) and its
    epsilon (1e-4, REFERENCE.md section 3; the LLM estimator's is 1e-6).

    Args:
        rewards: ``[B]`` float.
        group_ids: ``[B]`` integer label of each sample's prompt group; ``None``: one group.
        std_scope: ``std`` of the sample's own group, or of the whole batch's rewards (Flow-GRPO's
            ``global_std``; steadier with small groups). The mean is always the group's.
        unbiased: the sample std (``n - 1`` in the denominator, torch's default, as cosmos-rl's
            world-model trainers take it); a group of one sample then has std 0.

    Returns: ``[B]`` float32 (not clamped; the loss clamps).
    """
    rewards = rewards.float()
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be [B]; got shape {tuple(rewards.shape)}")
    if std_scope not in ("group", "batch"):
        raise ValueError(f"std scope must be 'group' or 'batch' ([wfm] advantage_std_scope); got {std_scope!r}")
    if group_ids is None:
        group_ids = torch.zeros_like(rewards, dtype=torch.long)
    if group_ids.shape != rewards.shape:
        raise ValueError(f"group_ids {tuple(group_ids.shape)} must match rewards {tuple(rewards.shape)}")
    mean, std = group_stats(rewards, group_ids.to(rewards.device), unbiased=unbiased, lone_sample="own")
    if std_scope == "batch":
        std = (rewards.std(unbiased=unbiased) if rewards.numel() > 1 else torch.zeros(())).expand_as(rewards)
    return (rewards - mean) / (std + eps)


def select_train_steps(num_sde_steps: int, fraction: float = 1.0,
                       generator: torch.Generator | None = None) -> torch.Tensor:
    """Which of a rollout's stochastic steps one update trains on.

    ``max(1, round(fraction * num_sde_steps))`` positions drawn without replacement, ascending:
    ``[K']`` int64 positions into ``trajectory.sde_steps`` (``fraction = 1``: all of them, in order).
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"train step fraction must be in (0, 1] ([wfm] train_step_fraction); got {fraction}")
    if num_sde_steps <= 0:
        raise ValueError("the rollout has no stochastic step to train on; check [wfm.sampler] sde_window_size")
    count = max(1, round(fraction * num_sde_steps))
    if count == num_sde_steps:
        return torch.arange(num_sde_steps)
    return torch.randperm(num_sde_steps, generator=generator)[:count].sort().values


def listed_train_steps(train_steps: list[int], sde_steps: torch.Tensor,
                       generator: torch.Generator | None = None) -> torch.Tensor:
    """Positions into ``sde_steps`` (``[K]`` int64, the rollout's stochastic step indices) of the listed
    denoising steps ``train_steps`` (cosmos-rl's ``train_on``): each ``-1`` becomes a stochastic step not
    listed, drawn without replacement from ``generator``. Returns ``[len(train_steps)]`` int64, listed
    steps first in their order, then the drawn ones.

    Raises:
        ValueError: naming ``[wfm] train_steps``: a listed step that was not stochastic in this rollout,
            a step listed twice, or more ``-1`` than steps left to draw from.
    """
    stochastic = [int(i) for i in sde_steps.tolist()]
    fixed = [i for i in train_steps if i != -1]
    if len(set(fixed)) != len(fixed):
        raise ValueError(f"[wfm] train_steps lists a step twice: {train_steps}")
    unknown = [i for i in fixed if i not in stochastic]
    if unknown:
        raise ValueError(f"[wfm] train_steps {unknown} are not stochastic steps of the rollout (its stochastic "
                         f"steps: {stochastic}); list steps below [wfm] num_inference_steps inside the SDE window")
    rest = [i for i in stochastic if i not in fixed]
    draws = len(train_steps) - len(fixed)
    if draws > len(rest):
        raise ValueError(f"[wfm] train_steps asks for {draws} random steps (-1) but only {len(rest)} stochastic "
                         "steps are not listed")
    picked = [rest[int(j)] for j in torch.randperm(len(rest), generator=generator)[:draws]] if draws else []
    return torch.tensor([stochastic.index(i) for i in fixed + picked], dtype=torch.long)


@attrs.define
class FlowGRPOLoss:
    """Output of :func:`flow_grpo_loss` (scalars are 0-d tensors; ``loss`` is differentiable).

    ``loss = policy_loss + kl_beta * kl``; ``clip_fraction``: share of (sample, step) pairs whose
    ratio left ``[1 - eps, 1 + eps]``; ``approx_kl``: ``mean((logp - logp_old)^2) / 2`` between old
    and current policy (a drift diagnostic).
    """

    loss: torch.Tensor
    policy_loss: torch.Tensor
    kl: torch.Tensor
    clip_fraction: torch.Tensor
    approx_kl: torch.Tensor
    ratio_mean: torch.Tensor


def flow_grpo_loss(log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor, *,
                   clip_range: float, adv_clip_max: float = 5.0, kl: torch.Tensor | None = None,
                   kl_beta: float = 0.0) -> FlowGRPOLoss:
    """The FlowGRPO loss of one or several trained steps.

    Per (sample, step): ``ratio = exp(logp - logp_old)``, ``A = clamp(advantage, -adv_clip_max, adv_clip_max)``,
    ``l = max(-A * ratio, -A * clamp(ratio, 1 - clip_range, 1 + clip_range))``; the policy loss is
    the mean of ``l`` over samples and steps, the KL term the mean of ``kl`` likewise.

    Args:
        log_probs: ``[B]`` (one step) or ``[B, K]`` per-step log-probs under the current policy.
        old_log_probs: same shape, as recorded at rollout (no gradient).
        advantages: ``[B]``, one per sample (shared by its steps).
        kl: same shape as ``log_probs``, the closed-form KL to the reference per (sample, step), or None.
    """
    if old_log_probs.shape != log_probs.shape:
        raise ValueError(f"log_probs {tuple(log_probs.shape)} and old_log_probs {tuple(old_log_probs.shape)} differ")
    if advantages.shape != log_probs.shape[:1]:
        raise ValueError(f"advantages must be [B] = [{log_probs.shape[0]}]; got {tuple(advantages.shape)}")
    adv = advantages.float().clamp(-adv_clip_max, adv_clip_max)
    if log_probs.ndim == 2:
        adv = adv[:, None]
    log_ratio = log_probs.float() - old_log_probs.float().detach()
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    policy_loss = torch.maximum(unclipped, clipped).mean()
    kl_term = kl.float().mean() if kl is not None else torch.zeros((), device=log_probs.device)
    with torch.no_grad():
        clip_fraction = ((ratio - 1.0).abs() > clip_range).float().mean()
        approx_kl = 0.5 * (log_ratio**2).mean()
        ratio_mean = ratio.mean()
    return FlowGRPOLoss(loss=policy_loss + kl_beta * kl_term, policy_loss=policy_loss.detach(), kl=kl_term.detach(),
                        clip_fraction=clip_fraction, approx_kl=approx_kl, ratio_mean=ratio_mean)
