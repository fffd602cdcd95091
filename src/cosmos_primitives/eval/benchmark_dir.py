"""The Cosmos-Reason1 guide's benchmark layout under ``--data_dir``: one folder per dataset.

``tools/eval/download_hf_data.py --target data --task benchmark`` (and ``process_raw_data.py
--data_dir data``) write::

    data/benchmark/<dataset>/<dataset>_benchmark_qa_pairs.json   # one row per clip, "qa_pairs" nested
    data/benchmark/<dataset>/clips/<clip>.mp4                    # rows say "video": "clips/<clip>.mp4"

and the guide's ``evaluate.py --config robovqa.yaml --data_dir data`` reads the datasets its YAML
lists (``datasets: [robovqa]``) from ``data/benchmark``. :func:`load_benchmark_dir` does the same;
``data_dir`` may also be the ``benchmark`` folder itself. A QA pair whose clip was not downloaded
(the guide leaves AgiBot, BridgeData V2 and HoloAssist clips to a manual step) is a failed item of
the evaluation, listed with its path, as any missing media.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path, PurePosixPath

import attrs

from cosmos_primitives.eval.benchmark import (
    COSMOS_BENCHMARK_SUFFIX,
    BenchmarkFormatError,
    BenchmarkItem,
    load_benchmark,
)

BENCHMARK_FOLDER = "benchmark"


def benchmark_root(data_dir: str | Path) -> Path:
    """``<data_dir>/benchmark`` when that folder exists (the guide's ``--data_dir``), else ``data_dir``."""
    data_dir = Path(data_dir).expanduser()
    nested = data_dir / BENCHMARK_FOLDER
    return nested if nested.is_dir() else data_dir


def benchmark_file(root: Path, dataset: str) -> Path:
    return root / dataset / f"{dataset}{COSMOS_BENCHMARK_SUFFIX}.json"


def benchmark_files(data_dir: str | Path, datasets: Sequence[str] = ()) -> dict[str, Path]:
    """``{dataset: <root>/<dataset>/<dataset>_benchmark_qa_pairs.json}`` for ``datasets`` (empty:
    every dataset folder of the root that holds its file), root = :func:`benchmark_root`.

    Raises:
        BenchmarkFormatError: ``data_dir`` is not a folder, or a named dataset's file is missing (the
            path it looked for and the datasets it found are named), or it holds no dataset at all.
    """
    root = benchmark_root(data_dir)
    if not root.is_dir():
        raise BenchmarkFormatError(f"--data_dir {data_dir} is not a folder")
    found = {d.name: benchmark_file(root, d.name) for d in sorted(root.iterdir())
             if d.is_dir() and benchmark_file(root, d.name).is_file()}
    if not datasets:
        if not found:
            raise BenchmarkFormatError(f"no benchmark under {root}: expected <dataset>/<dataset>"
                                       f"{COSMOS_BENCHMARK_SUFFIX}.json folders (the Cosmos-Reason1 guide's "
                                       "download_hf_data.py --task benchmark layout), or pass --benchmark FILE")
        return found
    missing = [d for d in datasets if d not in found]
    if missing:
        named = "; ".join(f"dataset {d!r}: {benchmark_file(root, d)} does not exist" for d in missing)
        raise BenchmarkFormatError(f"{named} (datasets found under {root}: {sorted(found) or 'none'})")
    return {d: found[d] for d in datasets}


def _under(folder: str, path: str) -> str:
    return path if PurePosixPath(path).is_absolute() else f"{folder}/{path}"


def _clip_order(item: BenchmarkItem) -> str:
    """The tool walks each dataset's ``clips/`` folder in sorted file-name order."""
    videos = [path for kind, path in item.media if kind == "video"]
    return PurePosixPath(videos[0]).name if videos else item.clip


def _first_clips(items: list[BenchmarkItem], root: Path, limit: int) -> list[BenchmarkItem]:
    """Whole clips, in order, until at least ``limit`` items of clips that exist are taken (the
    tool's ``--limit``: per dataset, a clip's QA pairs are never split, clips it cannot find are not
    counted)."""
    kept: list[BenchmarkItem] = []
    counted = 0
    for index, item in enumerate(items):
        if counted >= limit and item.clip != items[index - 1].clip:
            break
        kept.append(item)
        if all((root / path).is_file() for _, path in item.media):
            counted += 1
    return kept


def load_benchmark_dir(data_dir: str | Path, datasets: Sequence[str] = (), limit: int = -1) -> list[BenchmarkItem]:
    """Every item of :func:`benchmark_files`, as the guide's evaluation tool orders them: datasets in
    the given order (else by name), each dataset's clips by file name, a clip's QA pairs in file
    order. Media paths are made relative to :func:`benchmark_root` (``clips/x.mp4`` of ``robovqa``
    becomes ``robovqa/clips/x.mp4``), so the root is the data dir to evaluate them with. Items
    without a ``dataset`` key count under their folder's name.

    ``limit`` > 0: per dataset, the first clips whose QA pairs make at least ``limit`` items, as the
    tool's ``--limit`` does (0 or -1: every item).

    Raises:
        BenchmarkFormatError: as :func:`benchmark_files` and :func:`load_benchmark`.
    """
    root = benchmark_root(data_dir)
    items: list[BenchmarkItem] = []
    for dataset, path in benchmark_files(data_dir, datasets).items():
        found = [attrs.evolve(item, media=[(kind, _under(dataset, p)) for kind, p in item.media])
                 for item in load_benchmark(path, default_dataset=dataset)]
        found.sort(key=_clip_order)
        items.extend(_first_clips(found, root, limit) if limit > 0 else found)
    return items
