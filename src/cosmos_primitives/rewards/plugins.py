"""Reward functions named by import path, and cosmos-rl's reward signature.

``[grpo] reward_function = { "my_pkg.rewards:score" = 1.0 }`` (or ``--reward my_pkg.rewards:score`` on
the GRPO recipes) imports the callable. A cosmos-rl reward, ``fn(to_be_evaluated, reference, *args,
**kwargs) -> float`` (the first parameter named ``to_be_evaluated``), is called through
:func:`from_cosmos_rl` unchanged: the completion text and the reference answer, positionally.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from cosmos_primitives.utils.imports import import_object


def from_cosmos_rl(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A reward taking this library's ``completion`` / ``reference`` keywords that calls a cosmos-rl
    reward ``fn(to_be_evaluated, reference)``."""

    @functools.wraps(fn)
    def reward(completion: str, reference: str | None = None) -> Any:
        return fn(completion, reference)

    del reward.__wrapped__  # the call plan reads this wrapper's signature, not fn's
    return reward


def is_cosmos_rl_reward(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` has cosmos-rl's reward signature (first parameter ``to_be_evaluated``)."""
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return False
    return bool(params) and params[0] == "to_be_evaluated"


def load_reward(path: str) -> Callable[..., Any]:
    """The reward callable at import path ``path``, adapted when it has cosmos-rl's signature.

    Raises:
        ImportError: naming ``path`` and the config key (``[grpo] reward_function``).
    """
    fn = import_object(path, what="[grpo] reward_function")
    if not callable(fn):
        raise ImportError(f"[grpo] reward_function: {path!r} is a {type(fn).__name__}, not a callable")
    return from_cosmos_rl(fn) if is_cosmos_rl_reward(fn) else fn
