"""The public surface stays small enough to hold in mind (issue 33, item 5).

Counted as the issue counts it: the length of ``cosmos_primitives.__all__`` plus the length of the
``__all__`` of each direct sub-package. A name outside those lists is still importable by its module
path (``from cosmos_primitives.algo.kl import kl_k3``), which is how recipes reach the internals.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import types
from pathlib import Path

import cosmos_primitives as cp

MAX_EXPORTS = 200


def subpackages() -> list[types.ModuleType]:
    return [importlib.import_module(f"cosmos_primitives.{m.name}") for m in pkgutil.iter_modules(cp.__path__)
            if m.ispkg]


def test_public_exports_fit_the_budget() -> None:
    counts = {"cosmos_primitives": len(cp.__all__)}
    counts |= {package.__name__: len(getattr(package, "__all__", ())) for package in subpackages()}
    assert len(counts) > 10  # the walk really found the sub-packages
    total = sum(counts.values())
    assert total <= MAX_EXPORTS, (f"{total} public exports (budget {MAX_EXPORTS}); per package: {counts}. "
                                  "Drop names a recipe or a user's own loop does not need from __all__; "
                                  "they stay importable by module path.")


def test_every_public_name_resolves() -> None:
    missing = [f"{package.__name__}.{name}" for package in subpackages()
               for name in getattr(package, "__all__", ()) if not hasattr(package, name)]
    assert not missing, f"listed in __all__ but not importable: {missing}"


def test_no_module_is_shadowed_by_a_function() -> None:
    """A package attribute named like one of its modules must be that module (``cp.algo.rollout_correction``)."""
    shadowed = []
    for package in subpackages():
        for module in pkgutil.iter_modules(package.__path__):
            value = getattr(package, module.name, None)
            if value is not None and not isinstance(value, types.ModuleType):
                shadowed.append(f"{package.__name__}.{module.name} ({type(value).__name__})")
    assert not shadowed, (f"a package attribute hides a module of the same name: {shadowed}; "
                          "rename the module (git mv) to say its job, or keep the name out of the package")


def test_the_api_doc_surface_table_is_the_packages_all() -> None:
    """docs/api.md's surface table lists exactly each sub-package's ``__all__``."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text()
    rows = dict(re.findall(r"^\| `cp\.(\w+)` \| (.*) \|$", doc, flags=re.MULTILINE))
    documented = {package: set(re.findall(r"`(\w+)`", names)) for package, names in rows.items()
                  if package != "__version__"}
    actual = {package.__name__.rsplit(".", 1)[1]: set(getattr(package, "__all__", ())) for package in subpackages()}
    assert documented == actual, ("docs/api.md 'The public surface' table differs from __all__: "
                                  f"{ {p: sorted(documented.get(p, set()) ^ actual[p]) for p in actual} }")


def test_samples_per_prompt_has_one_python_name() -> None:
    """The trainer's record check takes the ``[grpo]`` key's name; the older keyword warns and still works."""
    import pytest

    from cosmos_primitives.queue.record_groups import check_trainable

    record = types.SimpleNamespace(num_completions=2)
    check_trainable(record, None, num_samples_per_prompt=2)
    with pytest.raises(ValueError, match=r"holds 2 completions; this run samples 3 per prompt"):
        check_trainable(record, None, num_samples_per_prompt=3)
    with pytest.warns(FutureWarning, match="num_samples_per_prompt"):
        check_trainable(record, None, num_completions=2)
    with pytest.raises(TypeError, match="differ"):
        check_trainable(record, None, num_samples_per_prompt=2, num_completions=3)
