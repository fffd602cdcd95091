"""Where checkpoints live on disk, what makes one complete, and how folders are published atomically.

Layout of a run directory::

    <run_dir>/checkpoints/step_N/       complete DCP checkpoint (holds the COMPLETE marker)
    <run_dir>/checkpoints/step_N.tmp/   being written, or left by a crash: ignored, cleaned up
    <run_dir>/checkpoints/abandoned/    set aside on resume: newer than the resumed checkpoint
                                        (a rollback's abandoned future, or damaged); never resumed
    <run_dir>/safetensors/step_N/       intermediate Hugging Face export
    <run_dir>/safetensors/final/        final Hugging Face export

A folder becomes visible under its final name only by one ``os.rename`` of a fully written
``.tmp`` folder, so a crash at any moment leaves either the old state or the new one.

Order is the run's save history, not the step number: each marker records ``seq`` (1 + the largest
``seq`` in the folder when it was committed) and ``parent`` (the checkpoint its state descends
from). After a rollback to an older step the new saves are the newest ones.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

CHECKPOINTS_DIR = "checkpoints"
SAFETENSORS_DIR = "safetensors"
FINAL_DIR = "final"  # the export at the end of a run: <run_dir>/safetensors/final
MARKER = "COMPLETE"
ABANDONED_DIR = "abandoned"
TMP_SUFFIX = ".tmp"
_OLD_SUFFIX = ".old"
_STEP_DIR = re.compile(r"^step_(\d+)$")
_RUN_DIR = re.compile(r"^\d{14}$")


def final_export_dir(run_dir: str | Path) -> Path:
    """``<run_dir>/safetensors/final``: where a run's final Hugging Face (or diffusers) export goes."""
    return Path(run_dir) / SAFETENSORS_DIR / FINAL_DIR


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
    """The JSON the saver wrote into the marker: ``step``, ``world_size``, ``saved_at``, ``format``
    and (format 2) ``seq`` and ``parent``."""
    return json.loads((Path(path) / MARKER).read_text())


def write_marker(path: str | Path, info: dict[str, Any]) -> None:
    """Write the completion marker and flush it to disk before the folder is renamed."""
    marker = Path(path) / MARKER
    with open(marker, "w") as f:
        json.dump(info, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def save_order(path: Path) -> tuple[float, int]:
    """Sort key of a complete checkpoint in its run's save history: ``(seq, step)``.

    Markers written before ``seq`` existed count as older than every newer one (seq 0); an unreadable
    (torn) marker counts as the newest, so that resume looks at it first and reports it.
    """
    try:
        seq: float = float(read_marker(path).get("seq", 0))
    except (OSError, ValueError, AttributeError):
        seq = math.inf
    return seq, step_of(path) or 0


def list_checkpoints(checkpoints_dir: str | Path) -> list[Path]:
    """Complete ``step_N`` checkpoints in ``checkpoints_dir``, oldest first in save order."""
    root = Path(checkpoints_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and is_complete(p)]
    return sorted(found, key=save_order)


def is_readable(path: Path) -> bool:
    """False for a complete checkpoint whose marker cannot be parsed (torn): :func:`save_order` puts it last."""
    return save_order(path)[0] != math.inf


def list_abandoned(parent: str | Path) -> list[Path]:
    """The folders :func:`set_aside` moved into ``parent/abandoned/``, by step (then by set-aside suffix)."""
    aside = Path(parent) / ABANDONED_DIR
    if not aside.is_dir():
        return []

    def order(p: Path) -> tuple[int, int]:
        name, _, k = p.name.partition("-")
        return step_of(name) or 0, int(k) if k.isdigit() else 1

    return sorted((p for p in aside.iterdir() if p.is_dir() and step_of(p.name.partition("-")[0]) is not None),
                  key=order)


def next_seq(checkpoints_dir: str | Path) -> int:
    """The ``seq`` of the next checkpoint committed into ``checkpoints_dir``."""
    finite = [s for s, _ in map(save_order, list_checkpoints(checkpoints_dir)) if s != math.inf]
    return int(max(finite, default=0)) + 1


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


def find_checkpoints(path: str | Path) -> list[Path]:
    """The checkpoints resume may use, looking inside ``path``, oldest first in save order.

    ``path`` may be a complete ``step_N`` folder (just that one), a ``checkpoints`` folder, a run
    directory (``<output_dir>/<timestamp>``) or an output directory holding several runs; in the
    last case those of the newest run that has a complete checkpoint. Incomplete folders never count.
    """
    path = Path(path)
    if is_complete(path):
        return [path]
    for candidate in (path, path / CHECKPOINTS_DIR):
        found = list_checkpoints(candidate)
        if found:
            return found
    for run in _run_dirs_newest_first(path):
        found = list_checkpoints(run / CHECKPOINTS_DIR)
        if found:
            return found
    return []


def find_latest_checkpoint(path: str | Path) -> Path | None:
    """The newest (in save order) of :func:`find_checkpoints`, or None."""
    found = find_checkpoints(path)
    return found[-1] if found else None


def set_aside(path: Path) -> Path:
    """Move a folder into ``abandoned/`` beside it (one rename), where resume and rotation never look.

    Returns its new path: ``abandoned/<name>``, or ``abandoned/<name>-<k>`` when that name is taken.
    """
    aside = path.parent / ABANDONED_DIR
    aside.mkdir(exist_ok=True)
    target, k = aside / path.name, 1
    while target.exists():
        k += 1
        target = aside / f"{path.name}-{k}"
    os.rename(path, target)
    _fsync_dir(path.parent)
    return target


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


def marker_info(step: int, world_size: int, *, seq: int, parent: str | None) -> dict[str, Any]:
    """Marker contents: format 2 means one ``MANIFEST_rank<r>.json`` per rank of ``world_size``."""
    return {"step": step, "world_size": world_size, "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "format": 2,
            "seq": seq, "parent": parent}


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
