"""Losses, advantage estimators and KL estimators: registries of small pure tensor functions.

A GRPO training step (shapes: B sequences, T completion positions)::

    rewards = cp.rewards.RewardSet.from_config(cfg.grpo)(completions, references, rows).total_tensor()
    advantages = cp.algo.compute_advantages(rewards, cfg=cfg.grpo)                     # [B]
    loss, metrics = cp.algo.grpo_loss(logprobs, old_logprobs, advantages, mask, cfg=cfg.grpo,
                                      ref_logprobs=ref_logprobs)                        # [B, T] inputs
    loss.backward()

Add an algorithm with ``@register_policy_loss("name")`` (or ``register_advantage``,
``register_kl_estimator``, ``register_aggregation``) and select it from ``[grpo]``.
"""

from cosmos_primitives.algo.advantages import compute_advantages, drgrpo_advantages, group_stats, grpo_advantages
from cosmos_primitives.algo.aggregation import (
    aggregation_weights,
    seq_mean_token_mean,
    seq_mean_token_sum,
    seq_mean_token_sum_norm,
    token_mean,
    token_sum,
)
from cosmos_primitives.algo.dapo import (
    DynamicSamplingResult,
    apply_overlong_reward,
    dynamic_sampling,
    dynamic_sampling_enabled,
    overlong_penalty,
)
from cosmos_primitives.algo.ddrl import DataLoss, ddrl_data_loss, neg_exp_advantages, noisy_latents
from cosmos_primitives.algo.diffusion_nft import DiffusionNFTOutput, diffusion_nft_loss, optimality_probability
from cosmos_primitives.algo.entropy import entropy_bonus
from cosmos_primitives.algo.flow_grpo import (
    FlowGRPOLoss,
    flow_grpo_advantages,
    flow_grpo_loss,
    listed_train_steps,
    select_train_steps,
)
from cosmos_primitives.algo.flow_sde import SDEParams, gaussian_log_prob, gaussian_mean_kl, ode_step, sde_step_stats
from cosmos_primitives.algo.flow_step import (
    FlowTrajectory,
    StepRecompute,
    VelocityFn,
    guided_velocity,
    recompute_step,
    replace_condition_frames,
    to_diffusers_guidance,
)
from cosmos_primitives.algo.fused_logprob_loss import (
    fused_token_loss,
    fused_weighted_logprob_sum,
    token_loss_from_hidden,
    weighted_logprobs_from_hidden,
)
from cosmos_primitives.algo.grpo_objective import GRPOTokenLoss, grpo_loss, grpo_token_loss
from cosmos_primitives.algo.kl import kl_k1, kl_k2, kl_k3
from cosmos_primitives.algo.logprobs import (
    ScoredPositions,
    TokenLogProbs,
    chunked_selective_log_softmax,
    naive_token_logprobs,
    prediction_mask,
    scored_positions,
    token_logprobs_from_hidden,
)
from cosmos_primitives.algo.policy_losses import (
    PolicyLossOutput,
    aipo_loss,
    behaviour_weights,
    gspo_loss,
    off_policy_sequence_mask,
    ppo_clip_loss,
    sequence_mean,
    token_advantages,
)
from cosmos_primitives.algo.prefix_filter import mask_shared_prefixes, shared_prefix_lengths
from cosmos_primitives.algo.registry import (
    UnknownNameError,
    advantage_names,
    aggregation_names,
    get_advantage,
    get_aggregation,
    get_kl_estimator,
    get_policy_loss,
    kl_estimator_names,
    policy_loss_names,
    register_advantage,
    register_aggregation,
    register_kl_estimator,
    register_policy_loss,
    register_rollout_correction,
    rollout_correction_names,
)
from cosmos_primitives.algo.rollout_correction import (
    RolloutCorrection,
    masked_importance_weights,
    rollout_mismatch_metrics,
    sequence_rejection,
    truncated_importance_weights,
)
from cosmos_primitives.algo.sampling_distribution import (
    filtered_token_logprobs_from_hidden,
    sampling_keep_mask,
    sampling_logprobs,
)
from cosmos_primitives.algo.sft_objective import sft_loss, sft_token_weights, trained_mask

__all__ = [  # the public surface (tests/test_public_surface.py); the rest by module path
    "SDEParams", "compute_advantages", "diffusion_nft_loss", "flow_grpo_advantages", "flow_grpo_loss",
    "group_stats", "grpo_loss", "neg_exp_advantages", "register_advantage", "register_aggregation",
    "register_kl_estimator", "register_policy_loss", "sft_loss", "sft_token_weights", "to_diffusers_guidance",
]
