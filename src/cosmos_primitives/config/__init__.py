"""Typed configuration: one msgspec Struct per section, TOML loading, aliases and overrides.

Design choice: every section's struct lives in this package (one file per section), so that
loading a config never imports torch-heavy components and the config stays at the bottom of the
import graph. Components take their section as an argument.
"""

from cosmos_primitives.config.aliases import ALIASES, register_alias
from cosmos_primitives.config.base import Section
from cosmos_primitives.config.checkpoint import CheckpointConfig
from cosmos_primitives.config.dataset import DatasetConfig, TrainPolicyConfig, sampler_settings
from cosmos_primitives.config.errors import ConfigError
from cosmos_primitives.config.evaluation import EvalConfig
from cosmos_primitives.config.grpo import GRPOConfig, OverlongRewardConfig
from cosmos_primitives.config.loader import config_from_dict, config_to_dict, dump_config, load_config
from cosmos_primitives.config.logging import LoggingConfig
from cosmos_primitives.config.paths import (
    DEMO_PREFIX,
    check_input_paths,
    check_runnable,
    parse_reward_flag,
    resolve_demo_paths,
    with_plugins,
)
from cosmos_primitives.config.policy import DIFFUSERS_LORA_TARGETS, LoraConfig, ParallelismConfig, PolicyConfig
from cosmos_primitives.config.recipe_cli import load_recipe_config
from cosmos_primitives.config.redis import RedisConfig, run_stream
from cosmos_primitives.config.remote_reward import RemoteRewardConfig, RemoteRewardTerm
from cosmos_primitives.config.rollout import RolloutConfig, SamplingConfig
from cosmos_primitives.config.root import Config
from cosmos_primitives.config.secrets import redact_secrets, redact_url
from cosmos_primitives.config.seed import resolve_seed
from cosmos_primitives.config.train import TrainConfig
from cosmos_primitives.config.validation import (
    ValidationConfig,
    validation_item_count,
    validation_max_response_length,
    validation_rewards,
)
from cosmos_primitives.config.wfm import WFMConfig, WFMDataConfig, WFMSamplerConfig

__all__ = [  # the public surface (tests/test_public_surface.py); the rest by module path
    "Config", "ConfigError", "EvalConfig", "ParallelismConfig", "check_runnable", "config_to_dict", "load_config",
    "load_recipe_config", "redact_url", "register_alias", "run_stream", "sampler_settings",
    "validation_item_count", "validation_max_response_length", "validation_rewards",
]
