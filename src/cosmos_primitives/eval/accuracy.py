"""Accuracy tables: correct / total per dataset and overall, from predictions or a results directory.

Accuracy = correct / total over the items that were evaluated, as the guide's
``calculate_accuracy.py`` counts it: ``overall`` pools every prediction (micro average) and equals
the "Mean accuracy" that script prints for the same folder. Items that could not be evaluated
(missing or undecodable media) are not in ``total`` (the tool leaves them out too); they are
counted in ``failed`` so a table never hides them.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cosmos_primitives.eval.result_store import ResultStore

OVERALL = "overall"


def accuracy_table(records: Iterable[dict[str, Any]],
                   failures: Iterable[dict[str, Any]] = ()) -> dict[str, dict[str, Any]]:
    """``{dataset: {"correct", "total", "accuracy", "failed"}, ..., "overall": {...}}``.

    Args:
        records: predictions, each with ``datasource`` and ``is_correct`` (the results files' keys).
        failures: items that could not be evaluated, each with ``dataset``.

    ``accuracy`` is a fraction in ``[0, 1]`` (0.0 when ``total`` is 0); datasets are sorted by name,
    ``overall`` comes last.
    """
    counts: dict[str, dict[str, Any]] = {}

    def row(dataset: str) -> dict[str, Any]:
        return counts.setdefault(dataset, {"correct": 0, "total": 0, "accuracy": 0.0, "failed": 0})

    for record in records:
        entry = row(str(record["datasource"]))
        entry["total"] += 1
        entry["correct"] += int(bool(record["is_correct"]))
    for failure in failures:
        row(str(failure["dataset"]))["failed"] += 1
    table = {name: counts[name] for name in sorted(counts)}
    overall = {key: sum(entry[key] for entry in table.values()) for key in ("correct", "total", "failed")}
    table[OVERALL] = {**overall, "accuracy": 0.0}
    for entry in table.values():
        entry["accuracy"] = entry["correct"] / entry["total"] if entry["total"] else 0.0
    return table


def format_accuracy_table(table: dict[str, dict[str, Any]]) -> str:
    """The table as aligned text: ``dataset  correct / total  accuracy %  failed``."""
    width = max([len("dataset"), *(len(name) for name in table)])
    lines = [f"{'dataset':<{width}}  {'correct / total':>15}  {'accuracy':>8}  {'failed':>6}"]
    lines.append("-" * len(lines[0]))
    for name, entry in table.items():
        if name == OVERALL:
            lines.append("-" * len(lines[0]))
        ratio = f"{entry['correct']} / {entry['total']}"
        lines.append(f"{name:<{width}}  {ratio:>15}  {100 * entry['accuracy']:>7.2f}%  {entry['failed']:>6}")
    return "\n".join(lines)


def calculate_accuracy(results_dir: str | Path, datasets: Iterable[str] = ()) -> dict[str, dict[str, Any]]:
    """Recompute the accuracy table from a results folder alone, for all datasets or only
    ``datasets``: every prediction at any depth below it, as the guide's ``calculate_accuracy.py
    --result_dir`` reads it (``overall`` is its mean accuracy), and the failure lists of the last
    runs."""
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise FileNotFoundError(f"results directory {results_dir} does not exist")
    store = ResultStore(results_dir)
    datasets = list(datasets)
    return accuracy_table(store.records(datasets), store.failures(datasets))
