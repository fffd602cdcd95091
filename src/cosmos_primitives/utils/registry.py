"""One name -> function registry, instantiated by every kind of pluggable function.

The algorithm registries (``cp.algo``: advantages, policy losses, KL estimators, aggregations) and
the reward registry (``cp.rewards``) are instances of :class:`Registry`; each says in its errors
which config key selects it and how to register a function of its kind.
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
    """Functions of one kind, by name. Lookups of unknown names list the registered ones.

    Args:
        kind: what the functions are, in messages (``"policy loss"``, ``"reward"``).
        config_key: the config key that selects one by name (``"[grpo] policy_loss"``).
        decorator: the public decorator registering one, in messages (``"cp.algo.register_policy_loss"``).
        hint: more advice appended to the unknown-name message.
        error: the ``UnknownNameError`` subclass raised for an unknown name.
    """

    def __init__(self, kind: str, config_key: str, *, decorator: str, hint: str = "",
                 error: type[KeyError] = UnknownNameError) -> None:
        self.kind = kind
        self.config_key = config_key
        self.decorator = decorator
        self.hint = hint
        self.error = error
        self._fns: dict[str, Callable[..., Any]] = {}

    def register(self, name: str, *, override: bool = False) -> Callable[[F], F]:
        """Decorator registering ``fn`` as ``name``; re-registering a taken name needs ``override=True``."""

        def decorate(fn: F) -> F:
            taken = self._fns.get(name)
            if taken is not None and not override and taken is not fn:
                owner = f"{getattr(taken, '__module__', '?')}.{getattr(taken, '__qualname__', repr(taken))}"
                raise ValueError(
                    f"{self.kind} '{name}' is already registered (by {owner}); pick another name or pass override=True"
                )
            self._fns[name] = fn
            return fn

        return decorate

    def get(self, name: str) -> Callable[..., Any]:
        try:
            return self._fns[name]
        except KeyError:
            raise self.error(
                f"unknown {self.kind} '{name}' (config key {self.config_key}); registered: "
                f"{', '.join(sorted(self._fns))}. Register your own with @{self.decorator}('{name}')" + self.hint
            ) from None

    def names(self) -> list[str]:
        return sorted(self._fns)

    def __contains__(self, name: object) -> bool:
        return name in self._fns
