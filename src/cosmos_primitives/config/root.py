"""The root of the config tree: one field per section."""

from __future__ import annotations

from typing import Any

import msgspec

from cosmos_primitives.config.base import Section
from cosmos_primitives.config.disaggregated import DisaggregatedConfig
from cosmos_primitives.config.distillation import DistillationConfig
from cosmos_primitives.config.evaluation import EvalConfig
from cosmos_primitives.config.grpo import GRPOConfig
from cosmos_primitives.config.logging import LoggingConfig
from cosmos_primitives.config.policy import PolicyConfig
from cosmos_primitives.config.redis import RedisConfig
from cosmos_primitives.config.remote_reward import RemoteRewardConfig
from cosmos_primitives.config.rollout import RolloutConfig
from cosmos_primitives.config.train import TrainConfig
from cosmos_primitives.config.validation import ValidationConfig
from cosmos_primitives.config.wfm import WFMConfig


class Config(Section):
    """The whole config. ``[custom]`` is a free-form table for users' own recipes; ``[unsupported]``
    lists settings the loader refused (see ``config/compat/cosmos_rl.py``)."""

    policy: PolicyConfig = msgspec.field(default_factory=PolicyConfig)
    train: TrainConfig = msgspec.field(default_factory=TrainConfig)
    rollout: RolloutConfig = msgspec.field(default_factory=RolloutConfig)
    grpo: GRPOConfig = msgspec.field(default_factory=GRPOConfig)
    validation: ValidationConfig = msgspec.field(default_factory=ValidationConfig)
    logging: LoggingConfig = msgspec.field(default_factory=LoggingConfig)
    wfm: WFMConfig = msgspec.field(default_factory=WFMConfig)
    redis: RedisConfig = msgspec.field(default_factory=RedisConfig)
    disaggregated: DisaggregatedConfig = msgspec.field(default_factory=DisaggregatedConfig)
    remote_reward: RemoteRewardConfig = msgspec.field(default_factory=RemoteRewardConfig)
    eval: EvalConfig = msgspec.field(default_factory=EvalConfig)
    distillation: DistillationConfig = msgspec.field(default_factory=DistillationConfig)
    custom: dict[str, Any] = msgspec.field(default_factory=dict)
    # settings of another system's config that cannot be honoured here (key -> what to do instead),
    # filled by the loader (cosmos-rl's refused keys); recipes stop on them (cp.config.check_runnable)
    unsupported: dict[str, str] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        # cosmos-rl: weights reach the rollouts every sync_weight_interval steps, so records are up to
        # that many steps stale; a tighter bound would drop them all
        if self.grpo.allowed_outdated_steps + 1 < self.train.sync_weight_interval:
            if self.grpo.on_policy:
                raise ValueError(f"grpo.on_policy = true needs train.sync_weight_interval = 1 "
                                 f"(got {self.train.sync_weight_interval})")
            self.grpo.allowed_outdated_steps = self.train.sync_weight_interval - 1
        self.train._validation = self.validation  # train.enable_validation reads it
        if self.distillation.enable and self.grpo.min_filter_prefix_tokens is not None:
            if self.distillation.reward_advantages == "add":
                raise ValueError("grpo.min_filter_prefix_tokens (train_policy.min_filter_prefix_tokens) compares "
                                 "rewards per row, which distillation.reward_advantages = \"add\" turns into "
                                 "per-token advantages: remove one of the two")
            # cosmos-rl bypasses the rewards when distilling: all 0, so no group has differently rewarded
            # completions whose shared prefix the filter would take out; the same no-op here
            self.grpo.min_filter_prefix_tokens = None
