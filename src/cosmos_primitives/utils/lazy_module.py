"""The lazy loader behind the sub-packages' public names.

A package lists ``name -> module`` and gets a module-level ``__getattr__`` that imports the module on
first use (so ``import cosmos_primitives.data`` does not import transformers or a video decoder) and a
``__dir__`` that lists the names::

    _EXPORTS = {"RolloutBatch": "rollout_batch", "CheckpointManager": "cosmos_primitives.checkpoint.manager"}
    __all__ = sorted(_EXPORTS)
    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

A module is named relative to the package or in full (``cosmos_primitives.x.y``).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str],
                 eager: tuple[str, ...] = ()) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``.

    Args:
        package: the package's ``__name__``.
        exports: public name -> the module that defines it.
        eager: names the package imports itself (listed by ``__dir__`` too).
    """

    def module_path(module: str) -> str:
        return module if module.startswith("cosmos_primitives.") else f"{package}.{module}"

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module_path(module)), name)
        setattr(sys.modules[package], name, value)  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted({*exports, *eager})

    return __getattr__, __dir__
