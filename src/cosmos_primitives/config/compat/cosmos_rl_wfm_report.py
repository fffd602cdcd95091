"""The migration report of a cosmos-rl world-model file (``python -m cosmos_primitives.migrate FILE
[--json]``): what maps onto which key, what is ignored and why, what is refused and what to do, the
meanings translated, whether the file loads and whether ``examples/wfm_rl.py`` starts on it, and
what the run trains with (:func:`cosmos_primitives.config.compat.cosmos_rl_wfm.effective_values`)."""

from __future__ import annotations

import warnings
from typing import Any

from cosmos_primitives.config.compat.cosmos_rl_wfm import WorldModelReading, effective_values, rule_for, targets
from cosmos_primitives.config.errors import ConfigError
from cosmos_primitives.config.loader import load_config
from cosmos_primitives.config.paths import check_runnable

RECIPE = "examples/wfm_rl.py"


def _outcome(path: str) -> tuple[Any, list[str], list[str]]:
    """``(config or None, problems that stop the load, problems that stop the recipe at start-up)``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            config = load_config(path)
        except ConfigError as exc:
            return None, exc.problems, []
    try:
        check_runnable(config, path)
    except ConfigError as exc:
        return config, [], exc.problems
    return config, [], []


def world_model_report(path: str, reading: WorldModelReading) -> tuple[str, bool]:
    """``(the report's text, whether the recipe starts on the file as it is)``."""
    lines = [f"{path}: {reading.title}; run it with python {RECIPE} --config {path}", "", "maps:"]
    for key, ours, value in reading.mapped:
        rule = rule_for(key, reading.kind)
        why = targets(rule)[1] if rule is not None else ""
        lines.append(f"  {key} = {value!r} -> {ours}" + (f"  ({why})" if why else ""))
    lines += ["", "ignored (no effect here, or a difference docs/from_cosmos_rl.md states):"]
    lines += [f"  {key}: {why}" for key, why in reading.ignored]
    lines += ["", f"refused ({RECIPE} stops on these):"] + [f"  {key} {what}" for key, what in reading.refused.items()]
    lines += ["", "defaults (unset in the file: cosmos-rl's value is used):"]
    lines += [f"  {key} = {value!r}" for key, value in reading.defaults.items()]
    lines += ["", "meanings translated:"] + [f"  {line}" for line in reading.translated]
    config, load_problems, start_problems = _outcome(path)
    if load_problems:
        return "\n".join([*lines, "", "does NOT load:", *(f"  {p}" for p in load_problems)]) + "\n", False
    figures = effective_values(config, reading.data_ranks)
    lines += ["", f"trains (on {reading.data_ranks} data-parallel ranks, the file's layout): "
              + ", ".join(f"{k} = {v}" for k, v in figures.items() if k != "data_ranks")]
    if start_problems:
        verdict = [f"loads with cp.load_config; {RECIPE} stops at start-up on:", *(f"  {p}" for p in start_problems)]
        return "\n".join([*lines, "", *verdict]) + "\n", False
    return "\n".join([*lines, "", f"loads with cp.load_config; {RECIPE} starts on it"]) + "\n", True


def world_model_json(path: str, reading: WorldModelReading) -> tuple[dict[str, Any], bool]:
    """``(the report as one JSON object, whether the recipe starts on the file)``: the members of an
    LLM / VLM file's (``cosmos_primitives.migrate.Inspection``) and ``kind`` / ``recipe``; ``effective``
    holds :func:`~cosmos_primitives.config.compat.cosmos_rl_wfm.effective_values` (None when the file does not load)."""
    config, load_problems, start_problems = _outcome(path)
    runs = config is not None and not start_problems
    out = {
        "file": path, "read_as": "cosmos-rl", "why": reading.style_reason,
        "kind": f"cosmos-rl world-model ({reading.kind})", "recipe": RECIPE,
        "mapped": [{"key": key, "ours": ours, "value": value} for key, ours, value in reading.mapped],
        "ignored": [{"key": key, "why": why} for key, why in reading.ignored],
        "refused": reading.refused, "defaults": reading.defaults, "translated": reading.translated,
        "loads": config is not None, "runs": runs, "problems": load_problems + start_problems,
        "effective": None if config is None else effective_values(config, reading.data_ranks),
    }
    return out, runs
