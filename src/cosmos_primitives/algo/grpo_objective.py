"""``grpo_loss``: the GRPO-family objective for one micro-batch, assembled from the registries by ``[grpo]``.

Order of the terms (each optional one only when configured)::

    per_token = policy_loss(logprobs, old_logprobs, advantages, mask)        # ppo_clip / gspo / aipo / ...
    per_token *= correction_weights(old_logprobs, rollout_logprobs, cfg)      # when rollout_logprobs given
    per_token *= off_policy_sequence_mask(...)                                # off_policy_masking_delta
    loss  = aggregate(per_token)                                              # loss_type
          + kl_beta * aggregate(kl_estimator(logprobs, ref_logprobs))
          - entropy_coeff * aggregate(entropy)
          + positive_nll_coef * aggregate(-logprobs on tokens of sequences with A > 0, 0 elsewhere)

With a token-wise policy loss (PPO-clip, AIPO), no off-policy sequence mask and a built-in (linear)
aggregation, every term of a token depends only on that token's log-prob and entropy once the old /
reference / rollout log-probs, the advantages and the aggregation weights are known:
:func:`grpo_token_loss` writes the loss as such a sum, which the fused LM head differentiates chunk
by chunk in its forward (three head GEMMs instead of four); :func:`grpo_loss` with ``weighted_sum``
then gives the same value and metrics from the head's (detached) log-probs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from cosmos_primitives.algo.aggregation import aggregation_weights
from cosmos_primitives.algo.entropy import entropy_bonus
from cosmos_primitives.algo.kl import kl_k1, kl_k2, kl_k3
from cosmos_primitives.algo.logprobs import ScoredPositions
from cosmos_primitives.algo.policy_losses import (
    aipo_loss,
    behaviour_weights,
    off_policy_sequence_mask,
    ppo_clip_loss,
    token_advantages,
)
from cosmos_primitives.algo.registry import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    ROLLOUT_CORRECTIONS,
    get_aggregation,
    get_kl_estimator,
    get_policy_loss,
)
from cosmos_primitives.algo.rollout_correction import rollout_correction
from cosmos_primitives.config.grpo import GRPOConfig

_VARIANT_LOSS = {"grpo": "ppo_clip", "dapo": "ppo_clip", "gspo": "gspo"}
# registered functions whose per-token output depends on that token's inputs only
_TOKENWISE_POLICY_LOSSES = (ppo_clip_loss, aipo_loss)
_TOKENWISE_KL_ESTIMATORS = (kl_k1, kl_k2, kl_k3)


def resolve_policy_loss(cfg: GRPOConfig) -> str:
    """The policy loss ``cfg`` selects: ``policy_loss``, else ``"aipo"`` if ``aipo_rho`` is set, else by variant."""
    if cfg.policy_loss is not None:
        return cfg.policy_loss
    if cfg.aipo_rho is not None:
        return "aipo"
    return _VARIANT_LOSS[cfg.variant]


def resolve_loss_type(cfg: GRPOConfig) -> str:
    """The aggregation: cosmos-rl's ``seq-mean-token-mean`` + ``unbiased_loss_max_tokens`` is Dr.GRPO's constant."""
    if cfg.loss_type == "seq-mean-token-mean" and cfg.unbiased_loss_max_tokens:
        return "seq-mean-token-sum-norm"
    return cfg.loss_type


def check_grpo_config(cfg: GRPOConfig) -> None:
    """Raise ``ValueError`` naming the ``[grpo]`` key when the knobs contradict each other or name nothing."""
    policy_loss = resolve_policy_loss(cfg)
    POLICY_LOSSES.get(policy_loss)
    if cfg.aipo_rho is not None and policy_loss != "aipo":
        raise ValueError(
            f"[grpo] aipo_rho = {cfg.aipo_rho} selects the AIPO loss but policy_loss = '{policy_loss}'; "
            "remove one of the two"
        )
    loss_type = resolve_loss_type(cfg)
    AGGREGATIONS.get(loss_type)
    if cfg.unbiased_loss_max_tokens and loss_type != "seq-mean-token-sum-norm":
        raise ValueError(
            f"[grpo] unbiased_loss_max_tokens = {cfg.unbiased_loss_max_tokens} only applies with loss_type "
            f"'seq-mean-token-mean' or 'seq-mean-token-sum-norm' (Dr.GRPO); loss_type is '{cfg.loss_type}'"
        )
    if cfg.kl_beta != 0.0:
        KL_ESTIMATORS.get(cfg.kl_estimator)
    if cfg.rollout_correction is not None:
        ROLLOUT_CORRECTIONS.get(cfg.rollout_correction)
    if cfg.dual_clip_c != 0 and cfg.dual_clip_c <= 1.0:
        raise ValueError(
            f"[grpo] dual_clip_c (lower_bound_ratio) must be > 1 (3 is usual) or 0 to disable; got {cfg.dual_clip_c}"
        )


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    cfg: GRPOConfig,
    ref_logprobs: torch.Tensor | None = None,
    rollout_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    dp_token_count: float | torch.Tensor | None = None,
    weighted_sum: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss to back-propagate for one micro-batch, and its metrics.

    Args:
        logprobs: [B, T] float32 log-probs of the completion tokens under the policy being trained (with grad).
        old_logprobs: [B, T] the same under the policy before this update (μ = 1 on-policy: ``logprobs.detach()``).
        advantages: [B] per sequence (``cp.algo.compute_advantages``) or [B, T].
        mask: [B, T], 1 on completion tokens.
        cfg: the ``[grpo]`` section.
        ref_logprobs: [B, T] frozen reference's log-probs; required when ``kl_beta != 0`` (the KL metric is
            reported whenever they are given).
        rollout_logprobs: [B, T] the rollout engine's log-probs; when given, the AReaL behaviour correction
            ``exp(old - rollout)`` (zeroed above ``behav_imp_weight_cap``) weights every token, and they are
            the behaviour policy of off-policy masking.
        entropy: [B, T] per-token entropy (with grad); required when ``entropy_coeff != 0``.
        dp_token_count: ``token-mean`` denominator under data parallelism
            (``cosmos_primitives.algo.aggregation.dp_mean_token_count``).
        weighted_sum: the ``weighted_sum`` of the fused head run with :func:`grpo_token_loss`'s
            per-token loss (same arguments); ``logprobs`` / ``entropy`` are then that head's detached
            outputs. The loss's value and the metrics are computed from them as without it, and the
            gradient is the head's (formed in its forward).

    Returns:
        ``(loss, metrics)``: a 0-d tensor, and detached 0-d tensors ``loss``, ``policy_loss``,
        ``clip_fraction`` (tokens whose gradient a clip removed, dual clip included),
        ``dual_clip_fraction``, ``ratio_mean`` / ``ratio_min`` / ``ratio_max`` (over masked tokens), and
        when computed ``kl``, ``entropy``, ``positive_nll``, ``behaviour_weight_mean``,
        ``behaviour_capped_fraction``, ``off_policy_masked_fraction`` (sequences).
    """
    if weighted_sum is not None:
        with torch.no_grad():
            value, metrics = grpo_loss(
                logprobs.detach(), old_logprobs, advantages, mask, cfg=cfg, ref_logprobs=ref_logprobs,
                rollout_logprobs=rollout_logprobs, entropy=None if entropy is None else entropy.detach(),
                dp_token_count=dp_token_count)
        # the value computed as without the fused head (the same number), the head's gradient
        return value + (weighted_sum - weighted_sum.detach()), metrics
    _check_loss_inputs(cfg, ref_logprobs, entropy)
    loss_type = resolve_loss_type(cfg)
    aggregate = get_aggregation(loss_type)
    agg_kwargs = {"token_count": dp_token_count, "max_tokens": cfg.unbiased_loss_max_tokens}
    on = mask.bool()
    n_tokens = on.sum().clamp(min=1)

    out = get_policy_loss(resolve_policy_loss(cfg))(logprobs, old_logprobs, advantages, mask, cfg)
    per_token = out.per_token_loss
    metrics: dict[str, torch.Tensor] = {}
    if rollout_logprobs is not None:
        weights = correction_weights(old_logprobs, rollout_logprobs, mask, cfg)
        per_token = per_token * weights
        metrics["behaviour_weight_mean"] = weights.sum() / n_tokens
        metrics["behaviour_capped_fraction"] = ((weights == 0) & on).sum() / n_tokens
    if cfg.off_policy_masking_delta is not None:
        behaviour = rollout_logprobs if rollout_logprobs is not None else old_logprobs
        keep = off_policy_sequence_mask(logprobs, behaviour, advantages, mask, cfg.off_policy_masking_delta)
        per_token = per_token * keep.unsqueeze(1)
        metrics["off_policy_masked_fraction"] = 1.0 - keep.mean()

    policy = aggregate(per_token, mask, **agg_kwargs)
    loss = policy
    if ref_logprobs is not None:
        # with kl_beta = 0 the KL is only reported: no autograd graph for it
        with torch.set_grad_enabled(cfg.kl_beta != 0.0 and torch.is_grad_enabled()):
            kl = aggregate(get_kl_estimator(cfg.kl_estimator)(logprobs, ref_logprobs), mask, **agg_kwargs)
        if cfg.kl_beta != 0.0:
            loss = loss + cfg.kl_beta * kl
        metrics["kl"] = kl
    if entropy is not None:
        if cfg.entropy_coeff != 0.0:
            loss = loss + entropy_bonus(entropy, mask, cfg.entropy_coeff, loss_type=loss_type, **agg_kwargs)
        metrics["entropy"] = torch.where(on, entropy, torch.zeros_like(entropy)).sum() / n_tokens
    if cfg.positive_nll_coef:
        positive = on & (token_advantages(advantages, logprobs) > 0)
        # normalised like the policy loss (same denominator), so the coefficient means the same in every loss_type
        nll = aggregate(torch.where(positive, -logprobs, torch.zeros_like(logprobs)), mask, **agg_kwargs)
        loss = loss + cfg.positive_nll_coef * nll
        metrics["positive_nll"] = nll

    ratio = out.ratio
    metrics.update(
        loss=loss,
        policy_loss=policy,
        clip_fraction=(out.clipped | out.dual_clipped).sum() / n_tokens,
        dual_clip_fraction=out.dual_clipped.sum() / n_tokens,
        ratio_mean=torch.where(on, ratio, torch.zeros_like(ratio)).sum() / n_tokens,
        ratio_min=torch.where(on, ratio, torch.full_like(ratio, float("inf"))).min(),
        ratio_max=torch.where(on, ratio, torch.full_like(ratio, float("-inf"))).max(),
    )
    return loss, {k: v.detach().float() for k, v in metrics.items()}


def correction_weights(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor,
                       cfg: GRPOConfig) -> torch.Tensor:
    """``[B, T]`` detached token weights of the behaviour correction: ``[grpo] rollout_correction`` /
    ``rollout_rejection`` (:func:`cp.algo.rollout_correction`) when set (``behav_imp_weight_cap`` is
    ``"mis"``), else the uncapped ``exp(old - rollout)``."""
    if cfg.rollout_correction is None and cfg.rollout_rejection is None:
        return behaviour_weights(old_logprobs, rollout_logprobs, mask, None)
    return rollout_correction(old_logprobs, rollout_logprobs, mask, cfg).weights


def _check_loss_inputs(cfg: GRPOConfig, ref_logprobs: torch.Tensor | None, entropy: torch.Tensor | None, *,
                       entropy_known: bool = True) -> None:
    check_grpo_config(cfg)
    if cfg.kl_beta != 0.0 and ref_logprobs is None:
        raise ValueError(f"[grpo] kl_beta = {cfg.kl_beta} needs ref_logprobs (the frozen reference's log-probs)")
    if entropy_known and cfg.entropy_coeff != 0.0 and entropy is None:
        raise ValueError(f"[grpo] entropy_coeff = {cfg.entropy_coeff} needs entropy ([B, T] per-token entropy)")


class GRPOTokenLoss:
    """:func:`grpo_loss` as a sum of per-token terms: a ``token_loss`` for the fused LM head
    (``cp.policy.token_logprobs(..., token_loss=...)``, ``cp.algo.token_loss_from_hidden``).

    Built by :func:`grpo_token_loss`, which gathers every per-token constant at the scored positions
    once; ``loss(logprobs [n], entropy [n] or None, rows) -> [n]`` then reads ``rows`` of them
    (a slice of the scored positions in order). Term of token i, with ``w_i`` the aggregation's
    weight (``sum_i w_i v_i`` = the aggregation of ``v``)::

        w_i * (policy_loss_i * behaviour_weight_i + kl_beta * kl_i - entropy_coeff * H_i
               + positive_nll_coef * [A_i > 0] * (-logp_i))
    """

    def __init__(self, cfg: GRPOConfig, policy_loss: Callable[..., Any], kl_estimator: Callable[..., Any] | None,
                 constants: dict[str, torch.Tensor | None]) -> None:
        self.cfg, self.policy_loss, self.kl_estimator = cfg, policy_loss, kl_estimator
        self.constants = constants
        self.needs_entropy = cfg.entropy_coeff != 0.0

    def __call__(self, logprobs: torch.Tensor, entropy: torch.Tensor | None, rows: slice) -> torch.Tensor:
        cfg = self.cfg
        c = {k: (None if v is None else v[rows][None]) for k, v in self.constants.items()}
        logp, mask = logprobs[None], c["mask"]
        # no old log-probs: on-policy, the old policy is this very forward (ratio 1, with gradient)
        old = logp.detach() if c["old"] is None else c["old"]
        per_token = self.policy_loss(logp, old, c["advantages"], mask, cfg).per_token_loss
        if c["behaviour"] is not None:
            per_token = per_token * c["behaviour"]
        elif c["rollout"] is not None:
            per_token = per_token * correction_weights(old, c["rollout"], mask, cfg)
        weights = c["weights"]
        loss = weights * per_token
        if self.kl_estimator is not None:
            loss = loss + cfg.kl_beta * (weights * self.kl_estimator(logp, c["ref"]))
        if self.needs_entropy:
            if entropy is None:
                raise ValueError(f"[grpo] entropy_coeff = {cfg.entropy_coeff} needs the entropy: run the head "
                                 "with with_entropy=True")
            loss = loss - cfg.entropy_coeff * (weights * entropy[None])
        if c["positive"] is not None:
            loss = loss + cfg.positive_nll_coef * (weights * torch.where(c["positive"], -logp, torch.zeros_like(logp)))
        return torch.where(mask.bool(), loss, torch.zeros_like(loss))[0]


def grpo_token_loss(
    old_logprobs: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    positions: ScoredPositions,
    *,
    cfg: GRPOConfig,
    ref_logprobs: torch.Tensor | None = None,
    rollout_logprobs: torch.Tensor | None = None,
    dp_token_count: float | torch.Tensor | None = None,
) -> GRPOTokenLoss | None:
    """:func:`grpo_loss` (same arguments) as per-token terms at ``positions``, for the fused LM head.

    Args:
        old_logprobs: [B, T], or None for the on-policy case where the old policy is the forward
            being trained (``grpo_loss`` then gets ``logprobs.detach()``).
        positions: the scored positions the head runs over
            (``cp.algo.scored_positions(input_ids, mask=mask)``, moved to the tensors' device).
        advantages, mask, cfg, ref_logprobs, rollout_logprobs, dp_token_count: as for ``grpo_loss``.

    Returns:
        A :class:`GRPOTokenLoss`, or None when the configured loss is not a sum of per-token terms:
        GSPO (one ratio per sequence), off-policy sequence masking (a sequence mean of log-probs),
        or a registered policy loss, KL estimator or aggregation other than the built-in token-wise
        ones. Gathering the constants makes no host sync.
    """
    _check_loss_inputs(cfg, ref_logprobs, None, entropy_known=False)
    policy_loss = get_policy_loss(resolve_policy_loss(cfg))
    if policy_loss not in _TOKENWISE_POLICY_LOSSES or cfg.off_policy_masking_delta is not None:
        return None
    if rollout_logprobs is not None and old_logprobs is None and cfg.rollout_rejection is not None:
        return None  # the rejection needs whole sequences of this forward's log-probs
    kl_estimator = None
    if ref_logprobs is not None and cfg.kl_beta != 0.0:
        kl_estimator = get_kl_estimator(cfg.kl_estimator)
        if kl_estimator not in _TOKENWISE_KL_ESTIMATORS:
            return None
    weights = aggregation_weights(resolve_loss_type(cfg), mask, token_count=dp_token_count,
                                  max_tokens=cfg.unbiased_loss_max_tokens, dtype=advantages.dtype)
    if weights is None:
        return None
    if mask.ndim != 2 or positions.shape != tuple(mask.shape):
        raise ValueError(f"mask {tuple(mask.shape)} must be the [B, T] of the positions {positions.shape}")
    index = positions.index.to(mask.device)

    def at_positions(values: torch.Tensor | None) -> torch.Tensor | None:
        return None if values is None else values.detach().reshape(-1).index_select(0, index)

    adv = token_advantages(advantages, mask.to(advantages.dtype))
    behaviour = None
    if rollout_logprobs is not None and old_logprobs is not None:
        behaviour = correction_weights(old_logprobs, rollout_logprobs, mask, cfg)
    positive = (mask.bool() & (adv > 0)) if cfg.positive_nll_coef else None
    constants = {
        "mask": mask, "advantages": adv, "old": old_logprobs, "weights": weights, "behaviour": behaviour,
        "rollout": rollout_logprobs if behaviour is None else None, "ref": ref_logprobs if kl_estimator else None,
        "positive": positive,
    }
    return GRPOTokenLoss(cfg, policy_loss, kl_estimator, {k: at_positions(v) for k, v in constants.items()})
