"""Read a benchmark file (a JSON list or JSONL of MCQ / open-ended items) into checked items.

An item is one JSON object::

    {"id": "clip_0007-q2", "dataset": "robovqa", "video": "robovqa/clips/clip_0007.mp4",
     "question": "What will the robot do next?", "choices": ["pick", "place", "wait"], "answer": "B"}

- ``question`` and ``answer`` are required. ``answer`` is the right letter (``"B"``, ``"(B)"``,
  ``"<answer>B</answer>"``, a 0-based index or the choice's text are accepted and turned into the
  letter); without choices the item is open-ended and ``answer`` is the expected text.
- ``choices``: a list (lettered A, B, C, ...) or a ``{letter: text}`` dict (Cosmos-Reason benchmark
  files call it ``index2ans``; ``correct_answer`` is accepted for ``answer``).
- ``video`` / ``image``: a path or a list of paths, relative to the data dir; both optional.
- ``dataset``: the table row the item counts in (default: the file's stem, less a
  ``_benchmark_qa_pairs`` suffix); ``id``: unique within its dataset, it names the saved
  prediction (default ``line<N>``; give ids for resumes that survive edits of the file).

Cosmos-Reason1 benchmark files (``<dataset>_benchmark_qa_pairs.json``) hold one row per clip,
``{"video": "clips/<clip>.mp4", "qa_pairs": {...} or [{...}, ...]}``; each QA pair becomes an item
with the row's other keys, id ``<clip>`` (one pair) or ``<clip>-<k>`` (a list), so pointing
``data_dir`` at ``<data>/<dataset>`` evaluates a downloaded benchmark as it is.

Saved predictions are grouped as the guide's evaluation tool groups them: one results file per
clip (``BenchmarkItem.clip``: the clip's file name without its extension, as the tool's
``video_id``), holding that clip's QA pairs by their index (``question_idx``). An item of a plain
file is its own group: ``clip`` is its ``id``, ``question_idx`` 0.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import attrs

from cosmos_primitives.data.bad_samples import BadSampleError
from cosmos_primitives.data.mcq import answer_letter, mcq_choices

QUESTION_KEYS = ("question",)
ANSWER_KEYS = ("answer", "correct_answer")
CHOICES_KEYS = ("choices", "index2ans")
MEDIA_KEYS = ("video", "image")
MAX_LISTED_ERRORS = 10
QA_PAIRS_KEY = "qa_pairs"
COSMOS_BENCHMARK_SUFFIX = "_benchmark_qa_pairs"


class BenchmarkFormatError(ValueError):
    """The benchmark file cannot be read, or items in it are malformed (each named by line)."""


@attrs.define
class BenchmarkItem:
    """One checked benchmark item.

    ``choices``: ``[(letter, text), ...]``, or None for an open-ended item; ``answer``: the right
    letter (MCQ) or the expected text (open-ended); ``media``: ``[(kind, path), ...]`` with kind
    ``"video"`` or ``"image"``, paths as written in the file; ``line``: 1-based line of the item in
    the file; ``row``: the item as read; ``clip`` / ``question_idx``: its results file and its
    place in it (see the module docstring).
    """

    id: str
    dataset: str
    question: str
    answer: str
    choices: list[tuple[str, str]] | None
    media: list[tuple[str, str]]
    line: int
    row: dict[str, Any]
    clip: str = ""
    question_idx: int = 0

    def __attrs_post_init__(self) -> None:
        self.clip = self.clip or self.id

    @property
    def is_mcq(self) -> bool:
        return self.choices is not None

    @property
    def letters(self) -> list[str]:
        return [letter for letter, _ in self.choices or []]


def _first(row: dict[str, Any], keys: Sequence[str]) -> tuple[str | None, Any]:
    for key in keys:
        if row.get(key) is not None:
            return key, row[key]
    return None, None


def _media(row: dict[str, Any], where: str) -> list[tuple[str, str]]:
    media = []
    for kind in MEDIA_KEYS:
        value = row.get(kind)
        if value in (None, "", []):
            continue
        paths = value if isinstance(value, list) else [value]
        for path in paths:
            if not isinstance(path, str) or not path:
                raise BenchmarkFormatError(f"{where}: '{kind}' must be a path or a list of paths, got {value!r}")
            media.append((kind, path))
    return media


def parse_item(row: Any, line: int, default_dataset: str, source: str = "benchmark", *, clip: str = "",
               question_idx: int = 0) -> BenchmarkItem:
    """Check one item (``line``: its 1-based line in ``source``; ``clip`` / ``question_idx``: its
    results file and place in it, default: its id and 0).

    Raises:
        BenchmarkFormatError: naming ``source``, the line, and the missing or bad key.
    """
    where = f"{source} line {line}"
    if not isinstance(row, dict):
        raise BenchmarkFormatError(f"{where}: an item must be a JSON object, got {type(row).__name__}")
    _, question = _first(row, QUESTION_KEYS)
    if question is None:
        raise BenchmarkFormatError(f"{where}: item is missing key 'question' (it has {sorted(row)})")
    answer_key, answer = _first(row, ANSWER_KEYS)
    if answer is None:
        raise BenchmarkFormatError(f"{where}: item is missing key 'answer' (it has {sorted(row)})")
    choices_key, raw_choices = _first(row, CHOICES_KEYS)
    choices = None
    try:
        if raw_choices is not None and raw_choices != [] and raw_choices != {}:
            choices = mcq_choices(raw_choices, where)
            answer = answer_letter(answer, dict(choices), where)
        else:
            answer = str(answer).strip()
    except BadSampleError as exc:
        raise BenchmarkFormatError(f"{where}: '{choices_key}' / '{answer_key}': {exc.reason}") from exc
    item_id = row.get("id")
    dataset = row.get("dataset") or default_dataset
    return BenchmarkItem(id=str(item_id) if item_id not in (None, "") else f"line{line}", dataset=str(dataset),
                         question=str(question), answer=answer, choices=choices, media=_media(row, where),
                         line=line, row=row, clip=clip, question_idx=question_idx)


def _json_list_with_lines(text: str, source: str) -> list[tuple[int, Any]]:
    """Decode a JSON array element by element, keeping each element's 1-based starting line."""
    decoder = json.JSONDecoder()
    pos = len(text) - len(text.lstrip())
    if not text.startswith("[", pos):
        raise BenchmarkFormatError(f"{source}: a .json benchmark must hold a list of items (or use .jsonl)")
    pos += 1
    out: list[tuple[int, Any]] = []
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text):
            raise BenchmarkFormatError(f"{source}: the JSON list is not closed with ']'")
        if text[pos] == "]":
            return out
        line = text.count("\n", 0, pos) + 1
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise BenchmarkFormatError(f"{source} line {exc.lineno}: invalid JSON: {exc.msg}") from exc
        out.append((line, value))


def expand_qa_pairs(row: Any, line: int, source: str) -> list[tuple[Any, str, int]]:
    """``[(row, clip, question_idx), ...]``: a Cosmos-Reason1 benchmark row (one clip, ``qa_pairs``)
    as one row per QA pair; another row as itself (clip ``""``: its id, index 0)."""
    if not isinstance(row, dict) or QA_PAIRS_KEY not in row:
        return [(row, "", 0)]
    pairs = row[QA_PAIRS_KEY]
    shared = {k: v for k, v in row.items() if k != QA_PAIRS_KEY}
    media = shared.get("video") or shared.get("image")
    stem = PurePosixPath(media).name.rsplit(".", 1)[0] if isinstance(media, str) and media else ""
    base = str(shared.get("id") or stem or f"line{line}")
    clip = stem or base
    if isinstance(pairs, dict):
        return [({**shared, "id": base, **pairs}, clip, 0)]
    if not isinstance(pairs, list):
        raise BenchmarkFormatError(f"{source} line {line}: '{QA_PAIRS_KEY}' must be a dict or a list of dicts")
    return [({**shared, "id": f"{base}-{k}", **pair} if isinstance(pair, dict) else pair, clip, k)
            for k, pair in enumerate(pairs)]


def read_benchmark_rows(path: str | Path) -> list[tuple[int, Any]]:
    """``[(line, row), ...]`` of a ``.json`` list or a ``.jsonl`` file (blank lines skipped)."""
    path = Path(path)
    if not path.is_file():
        raise BenchmarkFormatError(f"benchmark file {path} does not exist")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise BenchmarkFormatError(f"{path} line {line}: not UTF-8 text (byte {exc.start} of the file); "
                                   f"save the benchmark as UTF-8") from None
    if path.suffix == ".json" or text.lstrip().startswith("["):
        return _json_list_with_lines(text, str(path))
    rows = []
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            rows.append((line, json.loads(raw)))
        except json.JSONDecodeError as exc:
            raise BenchmarkFormatError(f"{path} line {line}: invalid JSON: {exc.msg}") from exc
    return rows


def load_benchmark(path: str | Path, *, default_dataset: str | None = None,
                   datasets: Sequence[str] = (), limit: int = -1) -> list[BenchmarkItem]:
    """Read and check every item of a benchmark file.

    Args:
        path: a ``.json`` file holding a list of items, or a ``.jsonl`` file (one item per line).
        default_dataset: dataset of items without a ``dataset`` key (default: the file's stem,
            less ``_benchmark_qa_pairs``).
        datasets: keep only items of these datasets (empty: all).
        limit: keep the first ``limit`` items after the dataset filter (-1: all).

    Raises:
        BenchmarkFormatError: the file is missing or not JSON, or items are malformed: all malformed
            items are listed (up to 10), each with its line and the missing / bad key; duplicate ids
            within a dataset name both lines.
    """
    path = Path(path)
    default = default_dataset or path.stem.removesuffix(COSMOS_BENCHMARK_SUFFIX)
    items: list[BenchmarkItem] = []
    errors: list[str] = []
    for line, row in read_benchmark_rows(path):
        try:
            items.extend(parse_item(one, line, default, str(path), clip=clip, question_idx=k)
                         for one, clip, k in expand_qa_pairs(row, line, str(path)))
        except BenchmarkFormatError as exc:
            errors.append(str(exc))
    seen: dict[tuple[str, str], int] = {}
    for item in items:
        key = (item.dataset, item.id)
        if key in seen:
            errors.append(f"{path} line {item.line}: id {item.id!r} of dataset {item.dataset!r} is already used "
                          f"on line {seen[key]}; ids name the saved predictions, so they must be unique")
        seen.setdefault(key, item.line)
    places: dict[tuple[str, str, int], BenchmarkItem] = {}
    for item in items:
        place = (item.dataset, item.clip, item.question_idx)
        other = places.setdefault(place, item)
        if other is not item and other.id != item.id:
            errors.append(f"{path} line {item.line}: item {item.id!r} would be saved as QA pair {item.question_idx} "
                          f"of clip {item.clip!r}, as item {other.id!r} of line {other.line} is; give one of them "
                          "another id")
    if errors:
        listed = "\n  ".join(errors[:MAX_LISTED_ERRORS])
        more = f"\n  ... and {len(errors) - MAX_LISTED_ERRORS} more" if len(errors) > MAX_LISTED_ERRORS else ""
        raise BenchmarkFormatError(f"{len(errors)} malformed item(s) in {path}:\n  {listed}{more}")
    if datasets:
        wanted = set(datasets)
        unknown = wanted - {item.dataset for item in items}
        if unknown:
            raise BenchmarkFormatError(f"{path} has no items of dataset(s) {sorted(unknown)}; "
                                       f"its datasets are {sorted({i.dataset for i in items})}")
        items = [item for item in items if item.dataset in wanted]
    return items[:limit] if limit >= 0 else items
