"""Prediction files in the guide's evaluation tool's layout, written atomically.

Layout (the tool's ``evaluate.py``: ``{results_dir}/{model}/{answer_type}/{datasource}/{video_id}.json``)::

    <results_dir>/<model folder name>/<answer_type>/<dataset>/<clip>.json   a JSON list: the clip's QA pairs
    <results_dir>/<model folder name>/<answer_type>/<dataset>/failed.jsonl  items of the last run not evaluated

Each entry of a clip's list holds the tool's keys (``datasource``, ``video_id``, ``prompt``,
``correct_answer``, ``reasoning``, ``answer``, ``full_response``, ``is_correct``), so the tool's
``calculate_accuracy.py --result_dir <results_dir>`` (every ``*.json`` below it holding a list;
each entry with ``is_correct`` is a sample) reads the same accuracy; then this library's (``id``,
``question_idx``, ``attempts``, ``settings``, ...). ``failed.jsonl`` is not a ``.json`` file, so
the tool does not read it.

A clip's file is rewritten whole (temporary file, then rename) whenever predictions of its QA
pairs are added: it holds complete entries or does not exist, and a run interrupted at any point
keeps every entry written before.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from cosmos_primitives.logging.console import get_logger

FAILED_FILE = "failed.jsonl"
TOOL_KEYS = ("datasource", "video_id", "prompt", "correct_answer", "reasoning", "answer", "full_response",
             "is_correct")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def safe_name(name: str) -> str:
    """A file-name-safe form of a clip or dataset name; a short hash is appended when characters had
    to be replaced, so that different names never share a file."""
    cleaned = _UNSAFE.sub("_", name).lstrip(".") or "_"
    if cleaned != name or len(cleaned) > 150:
        cleaned = f"{cleaned[:150]}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"
    return cleaned


def run_dir(results_dir: str | Path, model_name: str, answer_type: str) -> Path:
    """``<results_dir>/<last part of model_name>/<answer_type>``: where the tool saves one run."""
    model_folder = os.path.basename(str(model_name).rstrip("/")) or "model"
    return Path(results_dir) / safe_name(model_folder) / answer_type


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _entries(path: Path) -> list[dict[str, Any]] | None:
    """The entries of one results file, or None when it is unreadable or not a list (logged)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        get_logger().warning(f"ignoring unreadable results file {path}: {exc}")
        return None
    if not isinstance(data, list):
        get_logger().warning(f"ignoring results file {path}: it holds a {type(data).__name__}, not a list of "
                             "predictions")
        return None
    return [entry for entry in data if isinstance(entry, dict)]


class ResultStore:
    """Read and write the predictions under one folder: a run's (:func:`run_dir`) to write, any
    results folder to read (:meth:`records` walks it all, as the tool's ``calculate_accuracy.py``)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path(self, dataset: str, clip: str) -> Path:
        return self.root / safe_name(dataset) / f"{safe_name(clip)}.json"

    def load(self, dataset: str, clip: str, question_idx: int, item_id: str | None = None) -> dict[str, Any] | None:
        """The saved prediction of QA pair ``question_idx`` of a clip, or None (an unreadable file is
        logged; its items are then evaluated again). An entry without ``question_idx`` (written by
        the tool itself) is matched by its place in the list; one whose ``id`` is not ``item_id``
        is not this item's."""
        path = self.path(dataset, clip)
        entries = _entries(path) if path.is_file() else None
        for place, entry in enumerate(entries or []):
            if entry.get("question_idx", place) != question_idx or "is_correct" not in entry:
                continue
            if item_id is not None and entry.get("id", item_id) != item_id:
                return None
            return entry
        return None

    def save(self, records: Iterable[dict[str, Any]]) -> list[Path]:
        """Add predictions (each with ``datasource``, ``video_id``, ``question_idx``) to their clips'
        files, replacing saved entries of the same QA pair; one atomic write per clip."""
        by_clip: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for record in records:
            by_clip.setdefault((record["datasource"], record["video_id"]), []).append(record)
        written = []
        for (dataset, clip), fresh in by_clip.items():
            path = self.path(dataset, clip)
            saved = (_entries(path) or []) if path.is_file() else []
            merged = {entry.get("question_idx", place): entry for place, entry in enumerate(saved)}
            merged.update({record["question_idx"]: record for record in fresh})
            ordered = [merged[k] for k in sorted(merged)]
            _atomic_write(path, json.dumps(ordered, ensure_ascii=False, indent=4) + "\n")
            written.append(path)
        return written

    def records(self, datasets: Iterable[str] = ()) -> Iterator[dict[str, Any]]:
        """Every prediction below the folder, at any depth (of ``datasets`` only, when given): the
        entries with ``is_correct`` of every ``*.json`` holding a list, files in sorted path order.
        An entry without ``datasource`` counts under its folder's name."""
        wanted = set(datasets)
        if not self.root.is_dir():
            return
        for path in sorted(self.root.rglob("*.json")):
            for entry in _entries(path) or []:
                if "is_correct" not in entry:
                    continue
                entry.setdefault("datasource", path.parent.name)
                if not wanted or entry["datasource"] in wanted:
                    yield entry

    def write_failures(self, dataset: str, failures: list[dict[str, Any]]) -> None:
        """Replace the failure list of ``dataset`` (removed when empty)."""
        path = self.root / safe_name(dataset) / FAILED_FILE
        if failures:
            _atomic_write(path, "".join(json.dumps(f, ensure_ascii=False) + "\n" for f in failures))
        else:
            path.unlink(missing_ok=True)

    def failures(self, datasets: Iterable[str] = ()) -> list[dict[str, Any]]:
        """The failure lists of the last runs below the folder (of ``datasets`` only, when given)."""
        wanted = set(datasets)
        out: list[dict[str, Any]] = []
        for path in sorted(self.root.rglob(FAILED_FILE)):
            rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
            out.extend(row for row in rows if not wanted or row.get("dataset") in wanted)
        return out
