"""Name -> function registries for the GRPO family (advantages, policy losses, KL, aggregation).

A new algorithm is one decorated pure function of tensors::

    @cp.algo.register_policy_loss("my_loss")
    def my_loss(logprobs, old_logprobs, advantages, mask, cfg): ...

and a config then selects it by name (``[grpo] policy_loss = "my_loss"``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class UnknownNameError(KeyError):
    """A name that no function of that kind is registered under; the message lists the registered ones."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Registry:
    """Functions of one kind, by name. Lookups of unknown names list the registered ones."""

    def __init__(self, kind: str, config_key: str) -> None:
        self.kind = kind
        self.config_key = config_key
        self._fns: dict[str, Callable[..., Any]] = {}

    def register(self, name: str, *, override: bool = False) -> Callable[[F], F]:
        """Decorator registering ``fn`` as ``name``; re-registering a taken name needs ``override=True``."""

        def decorate(fn: F) -> F:
            if name in self._fns and not override and self._fns[name] is not fn:
                raise ValueError(
                    f"{self.kind} '{name}' is already registered (by {self._fns[name].__module__}."
                    f"{self._fns[name].__qualname__}); pick another name or pass override=True"
                )
            self._fns[name] = fn
            return fn

        return decorate

    def get(self, name: str) -> Callable[..., Any]:
        try:
            return self._fns[name]
        except KeyError:
            raise UnknownNameError(
                f"unknown {self.kind} '{name}' (config key {self.config_key}); registered: "
                f"{', '.join(sorted(self._fns))}. Register your own with @cp.algo.register_"
                f"{self.kind.replace(' ', '_')}('{name}')"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._fns)

    def __contains__(self, name: object) -> bool:
        return name in self._fns


ADVANTAGES = Registry("advantage", "[grpo] advantage_estimator")
POLICY_LOSSES = Registry("policy loss", "[grpo] policy_loss")
KL_ESTIMATORS = Registry("kl estimator", "[grpo] kl_estimator")
AGGREGATIONS = Registry("aggregation", "[grpo] loss_type")


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
