"""On-policy distillation: a teacher scores the student's own rollouts per token, and the divergence
becomes a per-token advantage of the GRPO loss (cosmos-rl's ``[distillation]``, verl / NeMo-RL's OPD).

Shapes: B sequences, T completion positions, K top-k candidates per position. With the student's
sampled tokens ``y_t`` and ``s_t = log pi_student(y_t)``, ``q_t = log pi_teacher(y_t)``:

* reverse KL (``top_k = 0``), one sample per position: ``d_t = s_t - q_t``, whose expectation under
  the student is ``KL(student || teacher)`` at that position;
* generalised Jensen-Shannon over the top-k candidates (``top_k > 0``) with ``beta``:
  ``beta = 0`` is ``KL(teacher || student)``, ``beta = 1`` is ``KL(student || teacher)``, otherwise
  ``beta KL(teacher || m) + (1 - beta) KL(student || m)`` with ``m = beta teacher + (1 - beta) student``,
  each summed over the K candidates.

The advantage of token t is ``A + sum_{u >= t} gamma^(u - t) (-coef d_u)`` over the tokens of its own
sequence (``gamma = kl_discount_factor``, 0: the token's own term only), ``A`` the reward advantage
(0 when the run trains on the teacher alone).
"""

from __future__ import annotations

import math

import torch


def reverse_kl_per_token(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor) -> torch.Tensor:
    """Sampled reverse KL ``s - q`` per token: ``[B, T]`` and ``[B, T]`` -> ``[B, T]``."""
    if student_logprobs.shape != teacher_logprobs.shape:
        raise ValueError(f"student log-probs {tuple(student_logprobs.shape)} and teacher log-probs "
                         f"{tuple(teacher_logprobs.shape)} must have one shape")
    return student_logprobs - teacher_logprobs


def topk_jsd_per_token(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, beta: float) -> torch.Tensor:
    """Generalised Jensen-Shannon divergence over top-k candidates: ``[..., K]`` and ``[..., K]`` -> ``[...]``.

    Both are log-probabilities of the same K candidate tokens per position (the teacher's top-k),
    not renormalised over them, summed over K as cosmos-rl does.
    """
    if student_logprobs.shape != teacher_logprobs.shape:
        raise ValueError(f"student top-k log-probs {tuple(student_logprobs.shape)} and teacher top-k log-probs "
                         f"{tuple(teacher_logprobs.shape)} must have one shape")
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"jsd_beta = {beta} must lie in [0, 1]")

    def kl(p_log: torch.Tensor, q_log: torch.Tensor) -> torch.Tensor:  # KL(p || q), per candidate
        return p_log.exp() * (p_log - q_log)

    if beta == 0.0:
        per_candidate = kl(teacher_logprobs, student_logprobs)
    elif beta == 1.0:
        per_candidate = kl(student_logprobs, teacher_logprobs)
    else:
        mixture = torch.logaddexp(student_logprobs + math.log(1.0 - beta), teacher_logprobs + math.log(beta))
        per_candidate = beta * kl(teacher_logprobs, mixture) + (1.0 - beta) * kl(student_logprobs, mixture)
    return per_candidate.sum(-1)


def discounted_future_sum(values: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """``out_t = sum_{u >= t, u in the sequence} gamma^(u - t) values_u`` per row: ``[B, T]`` -> ``[B, T]``.

    Positions where ``mask`` is 0 neither add nor pass the sum on (a row's completion tokens are
    contiguous, so its sum stops at its last token); they come out 0.
    """
    mask = mask.to(values.dtype)
    if gamma == 0.0:
        return values * mask
    out = torch.zeros_like(values)
    running = torch.zeros_like(values[:, 0])
    for t in range(values.shape[1] - 1, -1, -1):
        running = (values[:, t] + gamma * running) * mask[:, t]
        out[:, t] = running
    return out


def distillation_advantages(divergence: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor | None = None, *,
                            kl_penalty_coef: float = 1.0, kl_discount_factor: float = 0.0,
                            ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token advantages from the teacher's divergence, added to the reward advantages.

    Args:
        divergence: ``[B, T]`` per-token divergence (:func:`reverse_kl_per_token` or
            :func:`topk_jsd_per_token`); detached here (it is the signal, not a loss).
        mask: ``[B, T]`` completion mask (the tokens the student sampled).
        advantages: ``[B]`` or ``[B, T]`` reward advantages; None: 0 (distillation alone).
        kl_penalty_coef: cosmos-rl's ``distillation.kl_penalty_coef``.
        kl_discount_factor: cosmos-rl's ``distillation.kl_discount_factor`` (``gamma``).

    Returns:
        ``([B, T]`` advantages, 0 off the mask; metrics ``teacher_kl`` (token mean of the divergence),
        ``teacher_kl_advantages`` (token mean of ``-coef d``) and ``teacher_kl_advantages_discounted``).
    """
    mask_f = mask.to(divergence.dtype)
    tokens = mask_f.sum().clamp(min=1.0)
    divergence = divergence.detach() * mask_f
    penalty = -kl_penalty_coef * divergence
    discounted = discounted_future_sum(penalty, mask, kl_discount_factor)
    base = torch.zeros_like(divergence) if advantages is None else (
        advantages.to(divergence.dtype).unsqueeze(1).expand_as(divergence) if advantages.ndim == 1
        else advantages.to(divergence.dtype))
    metrics = {"teacher_kl": divergence.sum() / tokens, "teacher_kl_advantages": penalty.sum() / tokens,
               "teacher_kl_advantages_discounted": discounted.sum() / tokens}
    return (base + discounted) * mask_f, metrics
