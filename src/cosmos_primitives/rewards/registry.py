"""Named reward functions, selected by ``[grpo] reward_function = {name = weight, ...}``.

A reward is any callable taking some of the keyword arguments ``completion`` (str), ``reference``
(str or None) and ``row`` (the dataset row, a mapping), sync or ``async``, returning a float or
``(float, {metric_name: float})``::

    @cp.rewards.register_reward("length_penalty")
    def length_penalty(completion: str) -> float:
        return -len(completion) / 1000
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_REWARDS: dict[str, Callable[..., Any]] = {}


class UnknownRewardError(KeyError):
    """A reward name nobody registered; the message lists the registered names."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def register_reward(name: str, *, override: bool = False) -> Callable[[F], F]:
    """Decorator registering a reward callable under ``name`` (re-using a name needs ``override=True``)."""

    def decorate(fn: F) -> F:
        if name in _REWARDS and not override and _REWARDS[name] is not fn:
            raise ValueError(f"reward '{name}' is already registered; pick another name or pass override=True")
        _REWARDS[name] = fn
        return fn

    return decorate


def get_reward(name: str) -> Callable[..., Any]:
    """The reward registered as ``name``; a ``"package.module:function"`` import path is imported
    (``cp.rewards.plugins``; cosmos-rl's reward signature is adapted)."""
    from cosmos_primitives.utils.imports import is_import_path

    if name not in _REWARDS and is_import_path(name):
        from cosmos_primitives.rewards.plugins import load_reward

        return load_reward(name)
    try:
        return _REWARDS[name]
    except KeyError:
        raise UnknownRewardError(
            f"unknown reward '{name}' (config key [grpo] reward_function); registered: "
            f"{', '.join(sorted(_REWARDS))}. Register your own with @cp.rewards.register_reward('{name}') "
            "or pass it in RewardSet(functions={...})"
        ) from None


def reward_names() -> list[str]:
    return sorted(_REWARDS)
