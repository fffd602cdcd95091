"""``[grpo]``: GRPO-family knobs for language / vision-language policies (REFERENCE.md section 2).

The formulas these knobs drive live in :mod:`cosmos_primitives.algo`; ``grpo_loss`` reads this
section. Older configs spell most knobs under ``[train.train_policy]`` (see ``config/aliases.py``),
some under other names: ``unbiased_advantage = true`` is ``advantage_estimator = "drgrpo"``,
``lower_bound_ratio`` is ``dual_clip_c``, ``[rollout] n_generation`` is ``num_samples_per_prompt``,
``[grpo] kl_penalty`` is ``kl_beta``.

The mini-batch size of a GRPO update is ``[train.train_policy] mini_batch`` (the same key SFT uses),
so there is no second copy of it here.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from cosmos_primitives.config.base import AtLeastOne, NonNegative, NonNegativeInt, Positive, Section


def reward_function_as_dict(value: Any) -> Any:
    """``reward_function`` may be a list of names (each weight 1.0), a single name, or a table."""
    if isinstance(value, str):
        return {value: 1.0}
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return {v: 1.0 for v in value}
    return value


class OverlongRewardConfig(Section):
    """``[grpo.overlong_reward]``: DAPO overlong reward shaping (alias ``[train.train_policy.overlong_reward]``).

    A completion of ``len`` tokens gets ``min(-(len - (max_length - buffer_length)) / buffer_length
    * penalty_factor, 0)`` added to its reward: nothing up to ``max_length - buffer_length`` tokens,
    then linearly down to ``-penalty_factor`` at ``max_length``.
    """

    enable_overlong_penalty: bool = False
    buffer_length: int = 4096
    penalty_factor: float = 1.0
    # None: the rollout's ``[rollout] max_response_length``
    max_length: int | None = None


class GRPOConfig(Section):
    """``[grpo]``.

    Defaults (cosmos-rl's): PPO-clip with ``epsilon_low = epsilon_high = 0.2`` and dual-clip
    ``c = 3`` for negative advantages; group z-score advantages with the *population* std
    (``advantage_std = "population"``, numpy's default, as cosmos-rl; verl and TRL use the unbiased
    std, ``"unbiased"``); no KL (``kl_beta = 0``, estimator k3 when enabled); ``token-mean`` loss.

    Policy loss: ``policy_loss`` names a registered loss (``cp.algo.policy_loss_names()``). Left
    unset it follows the older knobs: ``aipo_rho`` set -> ``"aipo"``; ``variant = "gspo"`` ->
    ``"gspo"`` (use small eps, e.g. 3e-4 / 4e-4); otherwise ``"ppo_clip"``. ``variant = "dapo"`` is
    ``"ppo_clip"`` with dynamic sampling on (set ``epsilon_high = 0.28`` for DAPO's clip-higher).

    Step size: each generation takes ``rollout_batch_size`` prompts x ``num_samples_per_prompt``
    samples per rank; ``rollouts_per_step`` (None: all of them) splits them into optimizer steps of
    that many rollouts (it must divide the generation evenly), each its own update, LR step and
    weight sync, as cosmos-rl trains ``train_batch_per_replica`` rollouts per step from its queue
    however the groups fall (advantages are computed over whole groups first). Honoured by the
    colocated recipe (``examples/grpo_vlm.py``).

    ``on_policy = true`` forces ``allowed_outdated_steps = 0`` (cosmos-rl's meaning), and
    ``allowed_outdated_steps`` is raised to ``[train] sync_weight_interval - 1`` when below it
    (records are that stale between weight syncs; cosmos-rl does the same).
    """

    num_samples_per_prompt: AtLeastOne = 8
    rollout_batch_size: AtLeastOne = 8
    rollouts_per_step: AtLeastOne | None = None
    variant: Literal["grpo", "gspo", "dapo"] = "grpo"
    policy_loss: str | None = None

    # advantages
    advantage_estimator: str = "grpo"
    advantage_std: Literal["population", "unbiased"] = "population"
    advantage_epsilon: float = 1e-6

    # policy loss
    # a negative value drops that bound of the clip (cosmos-rl's meaning; its distillation files set -1)
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    # dual-clip bound for negative advantages: the per-token loss is capped at ``c * |A|``; 0 disables it
    dual_clip_c: float = 3.0
    aipo_rho: float | None = None
    # AReaL decoupled loss: tokens weighted by exp(logp_old - logp_rollout), zeroed above the cap (None: no cap)
    behav_imp_weight_cap: float | None = None
    # DeepSeek-V3.2 off-policy sequence masking threshold delta (None disables it)
    off_policy_masking_delta: float | None = None
    # rollout correction (cp.algo.rollout_correction): token weights from r = exp(logp_old - logp_rollout);
    # "tis": min(r, rollout_is_cap); "mis": r inside [rollout_is_lower, rollout_is_cap], else 0; None: off.
    # behav_imp_weight_cap = C is "mis" with bounds [0, C] (set here when rollout_correction is unset)
    rollout_correction: str | None = None
    rollout_is_cap: Positive = 2.0
    # MIS lower bound; None: 1 / rollout_is_cap
    rollout_is_lower: NonNegative | None = None
    # sequence rejection: "geometric" (exp of the mean log r) or "sequence" (exp of the sum) outside
    # [rollout_rejection_lower (None: 1 / upper), rollout_rejection_upper] drops the whole sequence; None: off
    rollout_rejection: Literal["geometric", "sequence"] | None = None
    rollout_rejection_upper: Positive = 2.0
    rollout_rejection_lower: NonNegative | None = None

    # regularisers
    kl_beta: NonNegative = 0.0
    kl_estimator: str = "k3"
    entropy_coeff: float = 0.0
    positive_nll_coef: float | None = None

    # aggregation
    loss_type: str = "token-mean"
    # Dr.GRPO constant normaliser; with ``loss_type = "seq-mean-token-mean"`` it selects the constant (cosmos-rl)
    unbiased_loss_max_tokens: int | None = None

    # DAPO
    # None: on iff ``variant = "dapo"``
    dynamic_sampling: bool | None = None
    overlong_reward: OverlongRewardConfig = msgspec.field(default_factory=OverlongRewardConfig)

    # shared-prefix filtering (cosmos-rl's min_filter_prefix_tokens): a prefix of at least this many tokens
    # that completions of one prompt share while earning different rewards is left out of the loss
    # (cp.algo.prefix_filter); None: off
    min_filter_prefix_tokens: AtLeastOne | None = None

    # trainer-side temperature: the trainer scores tokens under ``logits / temperature``; None: the
    # rollout's ``[rollout.sampling_config] temperature`` (cosmos-rl spells it train_policy.temperature)
    temperature: Positive | None = None

    # schedule
    mu_iterations: AtLeastOne = 1
    # the "old" policy of the PPO ratio: "rollout" = the engine's log-probs of the sampled tokens (the
    # behaviour policy: the clip bounds each update relative to the weights that generated the data,
    # however stale), "recompute" = the trainer's own log-probs at the start of the update (for an
    # engine whose numerics differ from the trainer's, e.g. vLLM in bf16; with mu_iterations = 1 and
    # stale records the ratio is then always 1 and nothing is clipped). The decoupled loss
    # (behav_imp_weight_cap / off_policy_masking_delta) always recomputes: the engine's log-probs go
    # to its behaviour weights.
    old_logprobs: Literal["rollout", "recompute"] = "rollout"
    allowed_outdated_steps: NonNegativeInt = 4
    on_policy: bool = False

    # rewards
    reward_function: dict[str, float] = msgspec.field(
        default_factory=lambda: {"single_choice": 1.0, "format": 1.0}
    )
    # score used when a reward function raises (counted in the metrics); None: the error propagates
    reward_fallback_score: float | None = None

    def __post_init__(self) -> None:
        if self.on_policy:
            self.allowed_outdated_steps = 0
        if self.behav_imp_weight_cap is not None:
            cap = self.behav_imp_weight_cap
            if self.rollout_correction is None:
                self.rollout_correction, self.rollout_is_cap, self.rollout_is_lower = "mis", cap, 0.0
            elif (self.rollout_correction, self.rollout_is_cap, self.rollout_is_lower) != ("mis", cap, 0.0):
                raise ValueError(
                    f"grpo.behav_imp_weight_cap = {cap} means rollout_correction = 'mis' with rollout_is_cap = {cap} "
                    f"and rollout_is_lower = 0, but rollout_correction = {self.rollout_correction!r}, rollout_is_cap "
                    f"= {self.rollout_is_cap}, rollout_is_lower = {self.rollout_is_lower}; remove one of the two")
        if self.rollout_is_lower is not None and self.rollout_is_lower > self.rollout_is_cap:
            raise ValueError(f"grpo.rollout_is_lower = {self.rollout_is_lower} is above grpo.rollout_is_cap = "
                             f"{self.rollout_is_cap}")
        if self.rollout_rejection_lower is not None and self.rollout_rejection_lower > self.rollout_rejection_upper:
            raise ValueError(f"grpo.rollout_rejection_lower = {self.rollout_rejection_lower} is above "
                             f"grpo.rollout_rejection_upper = {self.rollout_rejection_upper}")
        batch = self.rollout_batch_size * self.num_samples_per_prompt
        if self.rollouts_per_step is not None and batch % self.rollouts_per_step:
            raise ValueError(f"grpo.rollouts_per_step = {self.rollouts_per_step} does not divide the "
                             f"{batch} rollouts of a generation (rollout_batch_size {self.rollout_batch_size} x "
                             f"num_samples_per_prompt {self.num_samples_per_prompt}) evenly")
