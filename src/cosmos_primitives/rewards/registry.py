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

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from cosmos_primitives.utils.imports import is_import_path
from cosmos_primitives.utils.registry import F, Registry, UnknownNameError

NO_COPY_HINT = (
    ", or, with no script to edit, name it by import path: --reward my_mod:fn[=WEIGHT] on the GRPO recipes, "
    "or \"my_mod:fn\" = WEIGHT in [grpo] reward_function (my_mod importable: installed or on PYTHONPATH); "
    "in your own script, RewardSet(functions={...}) also takes it"
)


class UnknownRewardError(UnknownNameError):
    """A reward name nobody registered; the message lists the registered names."""


REWARDS = Registry(
    "reward", "[grpo] reward_function", decorator="cp.rewards.register_reward",
    hint=NO_COPY_HINT, error=UnknownRewardError,
)


def register_reward(name: str, *, override: bool = False) -> Callable[[F], F]:
    """Decorator registering a reward callable under ``name`` (re-using a name needs ``override=True``)."""
    return REWARDS.register(name, override=override)


def get_reward(name: str) -> Callable[..., Any]:
    """The reward registered as ``name``; a ``"package.module:function"`` import path is imported
    (``cp.rewards.plugins``; cosmos-rl's reward signature is adapted)."""
    if name not in REWARDS and is_import_path(name):
        from cosmos_primitives.rewards.plugins import load_reward

        return load_reward(name)
    return REWARDS.get(name)


def reward_names() -> list[str]:
    return REWARDS.names()


def reward_metric_names(names: Iterable[str]) -> dict[str, str]:
    """The name each reward of ``[grpo] reward_function`` is logged under (``reward/<that name>``):
    a registered name as it is; an import path ``"my_pkg.rewards:score"`` by its function's name
    (``score``), unless that name is another reward's in the same set, when the path is kept.

    Example: ``{"format": "format", "my_mod:fn": "fn"}``.
    """
    names = list(names)
    short = {name: name.rpartition(":")[2].rpartition(".")[2] if is_import_path(name) else name for name in names}
    counts = Counter(short.values())
    return {name: short[name] if counts[short[name]] == 1 else name for name in names}
