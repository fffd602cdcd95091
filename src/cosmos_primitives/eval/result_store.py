"""Per-item prediction files under a results directory, written atomically.

Layout::

    <results_dir>/<dataset>/<item id>.json     one prediction per item
    <results_dir>/<dataset>/failed.jsonl       items of the last run that could not be evaluated

Each prediction is written to a temporary file in the same folder and renamed into place, so a
file either holds a complete prediction or does not exist: a run interrupted at any point keeps
every prediction written before it, and a re-run sees exactly those as saved.
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
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def safe_name(name: str) -> str:
    """A file-name-safe form of an id or dataset name; a short hash is appended when characters had
    to be replaced, so that different names never share a file."""
    cleaned = _UNSAFE.sub("_", name).lstrip(".") or "_"
    if cleaned != name or len(cleaned) > 150:
        cleaned = f"{cleaned[:150]}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"
    return cleaned


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


class ResultStore:
    """Read and write the predictions of one results directory."""

    def __init__(self, results_dir: str | Path) -> None:
        self.root = Path(results_dir)

    def path(self, dataset: str, item_id: str) -> Path:
        return self.root / safe_name(dataset) / f"{safe_name(item_id)}.json"

    def load(self, dataset: str, item_id: str) -> dict[str, Any] | None:
        """The saved prediction of an item, or None when there is none (or it is unreadable, which
        is logged: the item is then evaluated again)."""
        path = self.path(dataset, item_id)
        if not path.is_file():
            return None
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            get_logger().warning(f"ignoring unreadable prediction {path} ({exc}); the item will be evaluated again")
            return None
        return record if isinstance(record, dict) and record.get("id") == item_id else None

    def save(self, record: dict[str, Any]) -> Path:
        """Write one prediction (needs ``record["dataset"]`` and ``record["id"]``) atomically."""
        path = self.path(record["dataset"], record["id"])
        _atomic_write(path, json.dumps(record, ensure_ascii=False, indent=1) + "\n")
        return path

    def records(self, datasets: Iterable[str] = ()) -> Iterator[dict[str, Any]]:
        """Every readable prediction under the directory (of ``datasets`` only, when given), in
        dataset-folder then file-name order."""
        wanted = {safe_name(d) for d in datasets}
        if not self.root.is_dir():
            return
        for folder in sorted(p for p in self.root.iterdir() if p.is_dir()):
            if wanted and folder.name not in wanted:
                continue
            for path in sorted(folder.glob("*.json")):
                try:
                    record = json.loads(path.read_text(encoding="utf-8"))
                except (OSError, json.JSONDecodeError) as exc:
                    get_logger().warning(f"skipping unreadable prediction {path}: {exc}")
                    continue
                if isinstance(record, dict) and "correct" in record and "dataset" in record:
                    yield record

    def write_failures(self, dataset: str, failures: list[dict[str, Any]]) -> None:
        """Replace the failure list of ``dataset`` (removed when empty)."""
        path = self.root / safe_name(dataset) / FAILED_FILE
        if failures:
            _atomic_write(path, "".join(json.dumps(f, ensure_ascii=False) + "\n" for f in failures))
        else:
            path.unlink(missing_ok=True)

    def failures(self, datasets: Iterable[str] = ()) -> list[dict[str, Any]]:
        """The failure lists of the last runs (of ``datasets`` only, when given)."""
        wanted = {safe_name(d) for d in datasets}
        out: list[dict[str, Any]] = []
        for path in sorted(self.root.glob(f"*/{FAILED_FILE}")):
            if wanted and path.parent.name not in wanted:
                continue
            out.extend(json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
        return out
