"""Checksums of a checkpoint's files: written per rank at save time, verified before resume.

Each rank of a save writes ``MANIFEST_rank<r>.json`` into the checkpoint folder once DCP has
written (and fsynced) its files: DCP names rank ``r``'s shards ``__<r>_<i>.distcp`` (``r`` the rank
within the saving group), and the first rank also covers DCP's ``.metadata``. A manifest maps each
file name to ``{"size": bytes, "sha256": hex}``. The completion marker is written only after every
rank's manifest exists, so a complete checkpoint covers every file it needs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

from cosmos_primitives.checkpoint import layout

_CHUNK_BYTES = 8 << 20
_DCP_METADATA = ".metadata"


def manifest_name(rank: int) -> str:
    return f"MANIFEST_rank{rank}.json"


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file, read in 8 MiB chunks (constant memory for multi-GB shards)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def rank_files(folder: Path, rank: int) -> list[Path]:
    """The files rank ``rank`` of the saving group wrote into ``folder`` (DCP's naming)."""
    own = sorted(folder.glob(f"__{rank}_*.distcp"))
    if rank == 0 and (folder / _DCP_METADATA).is_file():
        own.append(folder / _DCP_METADATA)
    return own


def write_rank_manifest(folder: Path, rank: int) -> Path:
    """Hash this rank's files in ``folder`` and write (fsynced) ``MANIFEST_rank<rank>.json``; return its path."""
    entries = {p.name: {"size": p.stat().st_size, "sha256": file_sha256(p)} for p in rank_files(folder, rank)}
    target = folder / manifest_name(rank)
    with open(target, "w") as f:
        json.dump({"rank": rank, "files": entries}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    return target


def missing_manifests(folder: Path, world_size: int) -> list[str]:
    """Names of the per-rank manifests of a ``world_size``-rank save not (yet) in ``folder``."""
    return [manifest_name(r) for r in range(world_size) if not (folder / manifest_name(r)).is_file()]


@dataclasses.dataclass
class Verification:
    """Outcome of :func:`verify_checkpoint`.

    ``ok``: loadable as far as the files go. ``problems``: one line per damaged or missing file.
    ``checked``: False for a checkpoint written before manifests existed (loaded unverified).
    """

    path: Path
    ok: bool
    problems: list[str]
    checked: bool = True


def verify_checkpoint(path: str | Path) -> Verification:
    """Check a ``step_N`` folder against its marker and manifests: every file present, sizes, SHA-256.

    Sizes are compared first, so a truncated shard is reported without reading it.
    """
    path = Path(path)
    try:
        marker = layout.read_marker(path)
        world_size = int(marker["world_size"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return Verification(path, False, [f"{layout.MARKER}: unreadable ({type(exc).__name__}: {exc})"])
    if int(marker.get("format", 1)) < 2:
        return Verification(path, True, [], checked=False)
    problems: list[str] = []
    for rank in range(world_size):
        name = manifest_name(rank)
        try:
            files = json.loads((path / name).read_text())["files"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            problems.append(f"{name}: unreadable ({type(exc).__name__}: {exc})")
            continue
        for file_name, entry in files.items():
            problem = _check_file(path / file_name, entry)
            if problem:
                problems.append(f"{file_name}: {problem}")
    return Verification(path, not problems, problems)


def _check_file(path: Path, entry: dict) -> str | None:
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return "missing"
    if size != entry["size"]:
        return f"size {size} bytes, the manifest says {entry['size']}"
    if file_sha256(path) != entry["sha256"]:
        return "SHA-256 differs from the manifest (bytes changed after the save)"
    return None
