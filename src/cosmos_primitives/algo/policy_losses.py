"""Per-token policy-gradient losses and the off-policy corrections applied on top of them.

Shapes throughout: ``logprobs`` / ``old_logprobs`` / ``rollout_logprobs`` [B, T] float32 natural-log
probabilities of the sampled tokens (any value where ``mask == 0``); ``mask`` [B, T], 1 on completion
tokens; ``advantages`` [B] (one per sequence) or [B, T]. ``logprobs`` carries the gradient; the
others are treated as constants.

A registered policy loss returns a :class:`PolicyLossOutput` whose ``per_token_loss`` is 0 where
``mask == 0``; aggregation over tokens is a separate step (``cp.algo.aggregation``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cosmos_primitives.algo.registry import register_policy_loss
from cosmos_primitives.config.grpo import GRPOConfig

LOG_RATIO_CLAMP = 20.0
# GSPO's sequence log-ratio upper bound, as cosmos-rl: exp(10) ~ 2.2e4 keeps -s*A finite for A < 0.
GSPO_LOG_RATIO_MAX = 10.0


@dataclass
class PolicyLossOutput:
    """What a policy loss returns.

    Attributes:
        per_token_loss: [B, T], 0 where mask == 0; carries the gradient.
        ratio: [B, T] detached importance ratio used per token (GSPO: the sequence ratio on each token).
        clipped: [B, T] bool, tokens whose gradient a clip removed (ratio clip, AIPO cap); False off-mask.
        dual_clipped: [B, T] bool, tokens capped by the dual clip; False off-mask and for losses without it.
    """

    per_token_loss: torch.Tensor
    ratio: torch.Tensor
    clipped: torch.Tensor
    dual_clipped: torch.Tensor


def _check_shapes(logprobs: torch.Tensor, mask: torch.Tensor, **others: torch.Tensor | None) -> None:
    if logprobs.ndim != 2:
        raise ValueError(f"logprobs must be [B, T]; got {tuple(logprobs.shape)}")
    if mask.shape != logprobs.shape:
        raise ValueError(f"mask {tuple(mask.shape)} must match logprobs {tuple(logprobs.shape)}")
    for name, tensor in others.items():
        if tensor is not None and tensor.shape != logprobs.shape:
            raise ValueError(f"{name} {tuple(tensor.shape)} must match logprobs {tuple(logprobs.shape)}")


def token_advantages(advantages: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor:
    """Advantages [B] (per sequence) or [B, T] -> [B, T] matching ``logprobs``."""
    if advantages.ndim == 1 and advantages.shape[0] == logprobs.shape[0]:
        return advantages.to(logprobs.dtype).unsqueeze(1).expand_as(logprobs)
    if advantages.shape == logprobs.shape:
        return advantages.to(logprobs.dtype)
    raise ValueError(
        f"advantages {tuple(advantages.shape)} must be [B] or [B, T] for logprobs {tuple(logprobs.shape)}"
    )


def sequence_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked mean over tokens of each sequence: [B, T] -> [B] (0 for a sequence with no tokens)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


def _clipped_surrogate(
    ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``-min(rho A, clamp(rho, 1-eps_low, 1+eps_high) A)`` and where the clamped term won.

    A negative ``eps_low`` / ``eps_high`` drops that bound (cosmos-rl's meaning: its distillation
    files set both to -1, so the ratio is not clipped at all)."""
    unclipped = ratio * adv
    low = 1.0 - eps_low if eps_low >= 0 else None
    high = 1.0 + eps_high if eps_high >= 0 else None
    if low is None and high is None:
        return -unclipped, torch.zeros_like(unclipped, dtype=torch.bool)
    clipped = torch.clamp(ratio, low, high) * adv
    return -torch.minimum(unclipped, clipped), clipped < unclipped


@register_policy_loss("ppo_clip")
def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: GRPOConfig | None = None,
) -> PolicyLossOutput:
    """PPO-clip with asymmetric eps and dual-clip for negative advantages (GRPO, DAPO clip-higher).

    ``d_t = logp - logp_old``, ``rho_t = exp(clamp(d_t, -20, 20))``,
    ``L_t = -min(rho_t A, clamp(rho_t, 1 - eps_low, 1 + eps_high) A)`` (a negative eps drops that
    bound, as cosmos-rl); where ``A < 0`` and ``cfg.dual_clip_c = c`` is not 0, ``L_t = min(-c A, L_t)``
    (at most ``c |A|``, no gradient there).
    """
    cfg = cfg or GRPOConfig()
    _check_shapes(logprobs, mask, old_logprobs=old_logprobs)
    adv = token_advantages(advantages, logprobs)
    on = mask.bool()
    ratio = torch.exp(torch.clamp(logprobs - old_logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    loss, clipped = _clipped_surrogate(ratio, adv, cfg.epsilon_low, cfg.epsilon_high)
    dual_clipped = torch.zeros_like(on)
    if cfg.dual_clip_c:
        cap = -cfg.dual_clip_c * adv
        dual_clipped = (adv < 0) & (cap < loss)
        loss = torch.where(dual_clipped, cap, loss)
    return PolicyLossOutput(
        per_token_loss=torch.where(on, loss, torch.zeros_like(loss)),
        ratio=ratio.detach(),
        clipped=clipped & on & ~dual_clipped,
        dual_clipped=dual_clipped & on,
    )


@register_policy_loss("gspo")
def gspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: GRPOConfig | None = None,
) -> PolicyLossOutput:
    """GSPO: one importance ratio per sequence, ``s_i = exp(mean_t d_t)``, clipped like PPO.

    The mean log-ratio is clamped to [-20, 10] (cosmos-rl's upper bound) and keeps its gradient, so
    ``dL/dlogp_t = -A s_i / |o_i|`` on unclipped sequences. Every token of sequence i carries the
    same loss; ``loss_type = "seq-mean-token-mean"`` gives the paper's ``1/G sum_i`` objective.
    No dual clip (as the paper and cosmos-rl). Typical eps: 3e-4 low, 4e-4 high.
    """
    cfg = cfg or GRPOConfig()
    _check_shapes(logprobs, mask, old_logprobs=old_logprobs)
    adv = token_advantages(advantages, logprobs)
    on = mask.bool()
    seq_log_ratio = sequence_mean(logprobs - old_logprobs, mask).clamp(-LOG_RATIO_CLAMP, GSPO_LOG_RATIO_MAX)
    ratio = torch.exp(seq_log_ratio).unsqueeze(1).expand_as(logprobs)
    loss, clipped = _clipped_surrogate(ratio, adv, cfg.epsilon_low, cfg.epsilon_high)
    return PolicyLossOutput(
        per_token_loss=torch.where(on, loss, torch.zeros_like(loss)),
        ratio=ratio.detach(),
        clipped=clipped & on,
        dual_clipped=torch.zeros_like(on),
    )


@register_policy_loss("aipo")
def aipo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: GRPOConfig | None = None,
) -> PolicyLossOutput:
    """AIPO (arXiv 2505.24034): one-sided capped ratio, ``L_t = -min(rho_t, rho_max) A``.

    ``rho_max = cfg.aipo_rho`` (suggested 2..10); capped tokens get no gradient.
    """
    if cfg is None or cfg.aipo_rho is None:
        raise ValueError("policy loss 'aipo' needs [grpo] aipo_rho (the ratio cap, e.g. 4.0)")
    _check_shapes(logprobs, mask, old_logprobs=old_logprobs)
    adv = token_advantages(advantages, logprobs)
    on = mask.bool()
    ratio = torch.exp(torch.clamp(logprobs - old_logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    loss = -torch.clamp(ratio, max=cfg.aipo_rho) * adv
    return PolicyLossOutput(
        per_token_loss=torch.where(on, loss, torch.zeros_like(loss)),
        ratio=ratio.detach(),
        clipped=(ratio > cfg.aipo_rho) & on,
        dual_clipped=torch.zeros_like(on),
    )


def behaviour_weights(
    old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor, cap: float | None = None
) -> torch.Tensor:
    """AReaL decoupled-loss token weights ``w_t = exp(logp_old - logp_rollout)``, 0 where ``w_t > cap``.

    ``old_logprobs`` are the trainer's proximal policy (recomputed before the update),
    ``rollout_logprobs`` those the rollout engine reported for the same tokens (the behaviour policy,
    possibly several weight versions older, or another numerics stack). Multiply any per-token
    policy loss by these weights. Shapes: [B, T] -> [B, T] detached, 0 where mask == 0.
    """
    _check_shapes(old_logprobs, mask, rollout_logprobs=rollout_logprobs)
    w = torch.exp(torch.clamp(old_logprobs - rollout_logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)).detach()
    keep = mask.bool()
    if cap is not None:
        keep = keep & (w <= cap)
    return torch.where(keep, w, torch.zeros_like(w))


def off_policy_sequence_mask(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    delta: float,
) -> torch.Tensor:
    """DeepSeek-V3.2 off-policy sequence masking: which sequences keep their policy loss.

    Sequence i is dropped (0) iff its advantage is negative AND the mean over its tokens of
    ``logp_behaviour - logp_theta`` (an estimate of KL(behaviour || current policy) on the sampled
    tokens) exceeds ``delta``: a bad sample the current policy has already moved away from teaches
    little and destabilises training. ``behaviour_logprobs`` are the rollout engine's log-probs when
    known, else the old policy's. Shapes: [B, T] (advantages [B] or [B, T]) -> [B] float 0/1, detached.
    """
    _check_shapes(logprobs, mask, behaviour_logprobs=behaviour_logprobs)
    seq_adv = advantages if advantages.ndim == 1 else sequence_mean(advantages, mask)
    divergence = sequence_mean(behaviour_logprobs - logprobs.detach(), mask)
    drop = (seq_adv < 0) & (divergence > delta)
    return (~drop).to(logprobs.dtype)
