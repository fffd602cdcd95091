"""Where checkpoints live on disk, what makes one complete, and how folders are published atomically.

Layout of a run directory::

    <run_dir>/checkpoints/step_N/       complete DCP checkpoint (holds the COMPLETE marker)
    <run_dir>/checkpoints/step_N.tmp/   being written, or left by a crash: ignored, cleaned up
    <run_dir>/safetensors/step_N/       intermediate Hugging Face export
    <run_dir>/safetensors/final/        final Hugging Face export

A folder becomes visible under its final name only by one ``os.rename`` of a fully written
``.tmp`` folder, so a crash at any moment leaves either the old state or the new one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

CHECKPOINTS_DIR = "checkpoints"
SAFETENSORS_DIR = "safetensors"
MARKER = "COMPLETE"
TMP_SUFFIX = ".tmp"
_OLD_SUFFIX = ".old"
_STEP_DIR = re.compile(r"^step_(\d+)$")
_RUN_DIR = re.compile(r"^\d{14}$")


def step_dir_name(step: int) -> str:
    return f"step_{step}"


def step_of(path: str | Path) -> int | None:
    """``N`` for a folder named ``step_N``, else None."""
    match = _STEP_DIR.match(Path(path).name)
    return int(match.group(1)) if match else None


def is_complete(path: str | Path) -> bool:
    """True for a ``step_N`` checkpoint folder holding the completion marker."""
    path = Path(path)
    return step_of(path) is not None and (path / MARKER).is_file()


def read_marker(path: str | Path) -> dict[str, Any]:
    """The JSON the saver wrote into the marker: ``step``, ``world_size``, ``saved_at``, ``format``."""
    return json.loads((Path(path) / MARKER).read_text())


def write_marker(path: str | Path, info: dict[str, Any]) -> None:
    """Write the completion marker and flush it to disk before the folder is renamed."""
    marker = Path(path) / MARKER
    with open(marker, "w") as f:
        json.dump(info, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def list_checkpoints(checkpoints_dir: str | Path) -> list[Path]:
    """Complete ``step_N`` checkpoints in ``checkpoints_dir``, oldest step first."""
    root = Path(checkpoints_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and is_complete(p)]
    return sorted(found, key=lambda p: step_of(p) or 0)


def list_incomplete(checkpoints_dir: str | Path) -> list[Path]:
    """Folders in ``checkpoints_dir`` a crash left behind: ``*.tmp``, ``*.old`` and unmarked ``step_N``."""
    root = Path(checkpoints_dir)
    if not root.is_dir():
        return []
    leftovers = []
    for p in root.iterdir():
        unfinished = p.name.endswith((TMP_SUFFIX, _OLD_SUFFIX)) or (step_of(p) is not None and not is_complete(p))
        if p.is_dir() and unfinished:
            leftovers.append(p)
    return sorted(leftovers)


def _run_dirs_newest_first(output_dir: Path) -> list[Path]:
    if not output_dir.is_dir():
        return []
    return sorted((p for p in output_dir.iterdir() if p.is_dir() and _RUN_DIR.match(p.name)), reverse=True)


def find_latest_checkpoint(path: str | Path) -> Path | None:
    """The checkpoint to resume from, looking inside ``path``.

    ``path`` may be a complete ``step_N`` folder (returned as is), a ``checkpoints`` folder, a run
    directory (``<output_dir>/<timestamp>``) or an output directory holding several runs; in the
    last case the newest run that has a complete checkpoint wins, and within a run the highest step.
    Incomplete folders are never returned.
    """
    path = Path(path)
    if is_complete(path):
        return path
    for candidate in (path, path / CHECKPOINTS_DIR):
        found = list_checkpoints(candidate)
        if found:
            return found[-1]
    for run in _run_dirs_newest_first(path):
        found = list_checkpoints(run / CHECKPOINTS_DIR)
        if found:
            return found[-1]
    return None


def remove_tree(path: Path) -> None:
    """Delete a folder (missing is fine)."""
    shutil.rmtree(path, ignore_errors=True)


def retire(path: Path) -> None:
    """Delete a published folder so that no crash can leave it looking complete but partial.

    It is first renamed to ``<name>.old`` (one atomic step: from then on it is ignored), then deleted.
    """
    old = path.with_name(path.name + _OLD_SUFFIX)
    remove_tree(old)
    try:
        os.rename(path, old)
    except FileNotFoundError:
        return
    remove_tree(old)


def publish(tmp: Path, final: Path) -> None:
    """Rename a fully written ``tmp`` folder to ``final``, replacing an existing ``final``.

    The old ``final`` is first moved aside to ``<final>.old`` and deleted only after the rename, so
    there is always one complete copy on disk.
    """
    old = final.with_name(final.name + _OLD_SUFFIX)
    if final.exists():
        remove_tree(old)
        os.rename(final, old)
    os.rename(tmp, final)
    _fsync_dir(final.parent)
    remove_tree(old)


def _fsync_dir(path: Path) -> None:
    # the rename itself is durable only once the parent directory entry is flushed
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def marker_info(step: int, world_size: int) -> dict[str, Any]:
    return {"step": step, "world_size": world_size, "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "format": 1}


def rotate(folders: list[Path], max_keep: int, protected: set[Path] | frozenset[Path] = frozenset()) -> list[Path]:
    """Delete the oldest of ``folders`` (ordered oldest first) beyond ``max_keep``; return what was deleted.

    ``max_keep = -1`` keeps everything. The newest folder is never deleted, nor any in ``protected``
    (e.g. still being uploaded: those go at a later rotation).
    """
    if max_keep < 0 or len(folders) <= max_keep:
        return []
    keep_from = max(len(folders) - max_keep, 0)
    doomed = [p for p in folders[:keep_from] if p not in protected and p != folders[-1]]
    for p in doomed:
        retire(p)
    return doomed
