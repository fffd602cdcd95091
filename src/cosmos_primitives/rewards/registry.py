"""Named reward functions, selected by ``[grpo] reward_function = {name = weight, ...}``.

A reward is any callable taking some of the keyword arguments ``completion`` (str), ``reference``
(str or None) and ``row`` (the dataset row, a mapping), sync or ``async``, returning a float or
``(float, {metric_name: float})``::

    @cp.rewards.register_reward("length_penalty")
    def length_penalty(completion: str) -> float:
        return -len(completion) / 1000

The registry is a :class:`cosmos_primitives.utils.registry.Registry`, like the algorithm ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cosmos_primitives.utils.registry import F, Registry, UnknownNameError


class UnknownRewardError(UnknownNameError):
    """A reward name nobody registered; the message lists the registered names."""


REWARDS = Registry(
    "reward", "[grpo] reward_function", decorator="cp.rewards.register_reward",
    hint=" or pass it in RewardSet(functions={...})", error=UnknownRewardError,
)


def register_reward(name: str, *, override: bool = False) -> Callable[[F], F]:
    """Decorator registering a reward callable under ``name`` (re-using a name needs ``override=True``)."""
    return REWARDS.register(name, override=override)


def get_reward(name: str) -> Callable[..., Any]:
    """The reward registered as ``name``; a ``"package.module:function"`` import path is imported
    (``cp.rewards.plugins``; cosmos-rl's reward signature is adapted)."""
    from cosmos_primitives.utils.imports import is_import_path

    if name not in REWARDS and is_import_path(name):
        from cosmos_primitives.rewards.plugins import load_reward

        return load_reward(name)
    return REWARDS.get(name)


def reward_names() -> list[str]:
    return REWARDS.names()
