"""docs/api.md lists the public API: every name in a module's ``__all__`` appears there."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import cosmos_primitives as cp

API_DOC = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def public_names() -> list[tuple[str, str]]:
    """``(module, name)`` for every name exported through ``__all__`` in the package."""
    modules = ["cosmos_primitives"] + [m.name for m in pkgutil.walk_packages(cp.__path__, "cosmos_primitives.")]
    pairs = []
    for module_name in modules:
        module = importlib.import_module(module_name)
        pairs += [(module_name, name) for name in getattr(module, "__all__", ())]
    return pairs


def test_every_exported_name_is_in_the_api_doc() -> None:
    doc = API_DOC.read_text()
    pairs = public_names()
    assert len(pairs) > 100  # the walk really found the package's exports
    missing = [f"{module}.{name}" for module, name in pairs if not re.search(rf"\b{re.escape(name)}\b", doc)]
    assert not missing, f"add these to docs/api.md (public through __all__): {missing}"
