"""Name -> function registries for the GRPO family (advantages, policy losses, KL, aggregation).

A new algorithm is one decorated pure function of tensors::

    @cp.algo.register_policy_loss("my_loss")
    def my_loss(logprobs, old_logprobs, advantages, mask, cfg): ...

and a config then selects it by name (``[grpo] policy_loss = "my_loss"``). Each registry is a
:class:`cosmos_primitives.utils.registry.Registry`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cosmos_primitives.utils.registry import F, Registry
from cosmos_primitives.utils.registry import UnknownNameError as UnknownNameError  # re-exported by cp.algo

ADVANTAGES = Registry("advantage", "[grpo] advantage_estimator", decorator="cp.algo.register_advantage")
POLICY_LOSSES = Registry("policy loss", "[grpo] policy_loss", decorator="cp.algo.register_policy_loss")
KL_ESTIMATORS = Registry("kl estimator", "[grpo] kl_estimator", decorator="cp.algo.register_kl_estimator")
AGGREGATIONS = Registry("aggregation", "[grpo] loss_type", decorator="cp.algo.register_aggregation")
ROLLOUT_CORRECTIONS = Registry("rollout correction", "[grpo] rollout_correction",
                               decorator="cp.algo.register_rollout_correction")


def register_advantage(name: str, *, override: bool = False) -> Callable[[F], F]:
    """Register ``fn(rewards [B], group_ids [B] int64, cfg: GRPOConfig) -> advantages [B]``."""
    return ADVANTAGES.register(name, override=override)


def register_policy_loss(name: str, *, override: bool = False) -> Callable[[F], F]:
    """Register ``fn(logprobs, old_logprobs, advantages, mask, cfg) -> PolicyLossOutput`` (shapes in policy_losses)."""
    return POLICY_LOSSES.register(name, override=override)


def register_kl_estimator(name: str, *, override: bool = False) -> Callable[[F], F]:
    """Register ``fn(logprobs [B, T], ref_logprobs [B, T]) -> per-token KL [B, T]``."""
    return KL_ESTIMATORS.register(name, override=override)


def register_aggregation(name: str, *, override: bool = False) -> Callable[[F], F]:
    """Register ``fn(values [B, T], mask [B, T], *, token_count=None, max_tokens=None) -> scalar``."""
    return AGGREGATIONS.register(name, override=override)


def register_rollout_correction(name: str, *, override: bool = False) -> Callable[[F], F]:
    """Register ``fn(old_logprobs [B, T], rollout_logprobs [B, T], mask [B, T], cfg: GRPOConfig) ->
    (weights [B, T], truncated [B, T] bool, masked [B, T] bool)``
    (:mod:`~cosmos_primitives.algo.rollout_correction`)."""
    return ROLLOUT_CORRECTIONS.register(name, override=override)


def get_rollout_correction(name: str) -> Callable[..., Any]:
    return ROLLOUT_CORRECTIONS.get(name)


def rollout_correction_names() -> list[str]:
    return ROLLOUT_CORRECTIONS.names()


def get_advantage(name: str) -> Callable[..., Any]:
    return ADVANTAGES.get(name)


def get_policy_loss(name: str) -> Callable[..., Any]:
    return POLICY_LOSSES.get(name)


def get_kl_estimator(name: str) -> Callable[..., Any]:
    return KL_ESTIMATORS.get(name)


def get_aggregation(name: str) -> Callable[..., Any]:
    return AGGREGATIONS.get(name)


def advantage_names() -> list[str]:
    return ADVANTAGES.names()


def policy_loss_names() -> list[str]:
    return POLICY_LOSSES.names()


def kl_estimator_names() -> list[str]:
    return KL_ESTIMATORS.names()


def aggregation_names() -> list[str]:
    return AGGREGATIONS.names()
