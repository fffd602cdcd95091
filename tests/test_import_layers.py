"""The import graph of cosmos_primitives flows one way (ARCHITECTURE.md, "Layers").

Every import of every module under ``src/cosmos_primitives`` is read with ``ast``: at module level,
under ``if TYPE_CHECKING:`` and inside functions alike, so a lazy import cannot hide an edge. A
string constant that is a whole dotted module path (``"cosmos_primitives.utils.extras"``, the
tables of the lazy ``__getattr__`` loaders, ``importlib.import_module("...")``) counts as an import.

The rules:

- An import never reaches a higher layer.
- Packages of one layer may import each other (``rollout`` -> ``policy``, ``checkpoint`` ->
  ``models``), but only without a cycle: within a layer the packages still stack in one order,
  so a loop such as ``policy`` -> ``sync`` -> ``policy`` fails even when each edge is lazy.
- A few edges the layers would allow are ruled out by the package table (:data:`NO_EDGE`):
  ``policy`` never imports ``rollout`` (the flow step math the update shares with the sampler is
  ``algo``'s), and neither ``checkpoint`` nor ``sync`` imports ``policy``.
- The modules of one package import each other freely.
- The package root ``cosmos_primitives/__init__.py`` is the front door: it loads sub-packages on
  first use and belongs to no layer.
- A command-line tool may live in a package for its command's name while it sits above that
  package (:data:`TOOL_MODULES`): ``python -m cosmos_primitives.rollout.check`` compares the rollout
  engines with the trainer's scoring in ``policy``, so it is a unit of its own in the ``eval``
  layer, and nothing below may import it.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections import defaultdict
from pathlib import Path

import cosmos_primitives

PACKAGE_DIR = Path(cosmos_primitives.__file__).resolve().parent

LAYERS: tuple[tuple[str, ...], ...] = (
    ("config", "utils", "migrate"),  # migrate: the CLI of config.compat.cosmos_rl
    ("algo", "data", "rewards", "parallel", "logging", "plot", "plan"),  # plot: the CLI of logging.plot
    ("models", "checkpoint"),
    ("policy", "rollout", "sync", "queue"),
    # rollout.check: the engines-vs-trainer self-check; data.precompute_text_embeddings: a CLI that
    # loads a text encoder with the policy's loader (TOOL_MODULES)
    ("eval", "rollout.check", "data.precompute_text_embeddings"),
    ("testing",),
    ("run",),  # the recipes' shared start-up and ending
)
TOOL_MODULES = {"rollout/check.py": "rollout.check",
                "data/precompute_text_embeddings.py": "data.precompute_text_embeddings"}
"""Modules that are units of their own (path under the package -> unit), placed in LAYERS."""
LAYER_OF = {unit: i for i, units in enumerate(LAYERS) for unit in units}
NO_EDGE = {
    ("policy", "rollout"): "FlowGRPO's step math is algo's (algo.flow_step, algo.flow_sde), a flow "
                           "transformer's call convention models' (models.flow_transformers)",
    ("sync", "policy"): "the LoRA fold the weight sources need is models.lora",
    ("checkpoint", "policy"): "the LoRA fold the export needs is models.lora",
}
"""Edges the layer rule would allow (same layer, or downward) that the package table rules out."""

MODULE_PATH = re.compile(r"cosmos_primitives(\.\w+)+")


def unit_of(path: Path) -> str | None:
    """The package (or root module) a source file belongs to; None for the package root."""
    relative = path.relative_to(PACKAGE_DIR)
    if relative.as_posix() in TOOL_MODULES:
        return TOOL_MODULES[relative.as_posix()]
    parts = relative.with_suffix("").parts
    return None if parts == ("__init__",) else parts[0]


def module_name(path: Path) -> str:
    parts = ("cosmos_primitives", *path.relative_to(PACKAGE_DIR).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, module: str, is_package: bool = False) -> list[tuple[str, int]]:
    """``(imported module, line)`` for every import in ``source`` (the text of ``module``), wherever
    it stands; ``from cosmos_primitives import x`` yields ``cosmos_primitives.x``."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            if base == "cosmos_primitives":  # the names are the packages
                found += [(f"{base}.{alias.name}", node.lineno) for alias in node.names]
            else:
                found.append((base, node.lineno))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_PATH.fullmatch(node.value):
            found.append((node.value, node.lineno))
    return found


def target_unit(imported: str) -> str | None:
    """The layered package ``imported`` lands in, None outside cosmos_primitives or for a name that
    is no package (``from cosmos_primitives import load_config`` resolves through its shortcut)."""
    parts = imported.split(".")
    if parts[0] != "cosmos_primitives" or len(parts) < 2:
        return None
    rest = ".".join(parts[1:])
    for unit in TOOL_MODULES.values():
        if rest == unit or rest.startswith(unit + "."):
            return unit
    if parts[1] in LAYER_OF:
        return parts[1]
    shortcut = getattr(cosmos_primitives, "_SHORTCUTS", {}).get(parts[1])
    return shortcut.split(".")[1] if shortcut else None


def package_edges() -> list[tuple[str, str, str]]:
    """``(from unit, to unit, "file:line")`` for every import between two different units."""
    edges = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        source_unit = unit_of(path)
        if source_unit is None:
            continue
        imports = imported_modules(path.read_text(), module_name(path), is_package=path.name == "__init__.py")
        for imported, line in imports:
            target = target_unit(imported)
            if target is not None and target != source_unit:
                edges.append((source_unit, target, f"{path.relative_to(PACKAGE_DIR)}:{line} imports {imported}"))
    return edges


def test_every_package_has_a_layer() -> None:
    units = {p.parent.name for p in PACKAGE_DIR.glob("*/__init__.py")}
    units |= {p.stem for p in PACKAGE_DIR.glob("*.py") if p.name != "__init__.py"}
    unplaced = sorted(units - set(LAYER_OF))
    assert not unplaced, f"give {unplaced} a layer in LAYERS (ARCHITECTURE.md, \"Layers\")"


def test_no_import_goes_up_a_layer() -> None:
    edges = package_edges()
    assert len(edges) > 50  # the walk really saw the package's imports
    upward = [f"{where} ({source} is in layer {LAYER_OF[source]}, {target} in layer {LAYER_OF[target]})"
              for source, target, where in edges if LAYER_OF[target] > LAYER_OF[source]]
    assert not upward, "imports that go up a layer:\n" + "\n".join(upward)


def test_no_edge_the_package_table_rules_out() -> None:
    found = [f"{where}: {NO_EDGE[(source, target)]}" for source, target, where in package_edges()
             if (source, target) in NO_EDGE]
    assert not found, "imports the package table (ARCHITECTURE.md) rules out:\n" + "\n".join(found)


def test_packages_of_one_layer_import_each_other_without_a_cycle() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    examples: dict[tuple[str, str], str] = {}
    for source, target, where in package_edges():
        if LAYER_OF[source] == LAYER_OF[target]:
            graph[source].add(target)
            examples.setdefault((source, target), where)

    def cycle_from(start: str) -> list[str] | None:
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph[node]):
                if nxt == start:
                    return [*path, start]
                if nxt not in path:
                    stack.append((nxt, [*path, nxt]))
        return None

    for unit in sorted(graph):
        loop = cycle_from(unit)
        assert loop is None, "packages of one layer import each other in a loop " + " -> ".join(loop) + ":\n" + \
            "\n".join(examples[(a, b)] for a, b in itertools.pairwise(loop))


def test_the_walk_sees_lazy_relative_and_string_imports() -> None:
    source = '''
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from cosmos_primitives.queue.record import RolloutRecord
def load():
    from cosmos_primitives.policy import build_policy
    import cosmos_primitives.sync.sources
    from ..rollout import base
    return importlib.import_module("cosmos_primitives.eval.runner")
from cosmos_primitives import testing
'''
    found = {target_unit(name) for name, _ in imported_modules(source, "cosmos_primitives.data.mcq")}
    assert found >= {"queue", "policy", "sync", "rollout", "eval", "testing"}
