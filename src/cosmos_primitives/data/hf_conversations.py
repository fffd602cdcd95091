"""Adapter for Hugging Face ``datasets`` whose rows hold a chat ``conversations`` column
(Cosmos-Reason1-SFT style), with video / image paths resolved under a clip folder.

Two row layouts are read: media parts inside the conversation (``{"type": "video", "video":
path}``), or a plain-text conversation beside a ``video`` (or ``image``) column, as in
Cosmos-Reason1-SFT-Dataset; then the clip goes first in the first user message."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cosmos_primitives.config.dataset import DatasetConfig
from cosmos_primitives.data.bad_samples import bad_sample_boundary
from cosmos_primitives.data.conversation import ConversationSample, load_conversation, normalize_conversation
from cosmos_primitives.data.media import MediaSettings, default_media_dir
from cosmos_primitives.utils.extras import require

_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}


def _has_module(name: str) -> bool:
    """Whether ``name`` can be imported (without importing it)."""
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # sys.modules[name] is None (import blocked) or has no spec
        return False


def read_utf8(path: Path) -> str:
    """The text of ``path``; bytes that are not UTF-8 raise a ``ValueError`` naming file and line."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ValueError(f"{path}:{line}: not UTF-8 text (byte {exc.start} of the file is 0x{data[exc.start]:02x}); "
                         f"save the dataset as UTF-8") from None


def read_json_records(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON Lines file (one object a line, blank lines skipped) or a JSON file
    holding a list of objects; a malformed line or record (or bytes that are not UTF-8) is reported
    by file and line."""
    import json

    text = read_utf8(path)
    if path.suffix.lower() == ".jsonl":
        rows = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except (json.JSONDecodeError, RecursionError) as exc:
                why = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
                raise ValueError(f"{path}:{number}: not a JSON object ({why}); each line of a .jsonl dataset must "
                                 "be one JSON object") from None
    else:
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from exc
        if not isinstance(rows, list):
            raise ValueError(f"{path}: a .json dataset must hold a list of records without the 'datasets' "
                             "package (pip install 'cosmos_primitives[hub]' reads other layouts)")
    bad = next((i for i, row in enumerate(rows) if not isinstance(row, dict)), None)
    if bad is not None:
        raise ValueError(f"{path}: record {bad} is a {type(rows[bad]).__name__}, not a JSON object")
    return rows


def load_hf_dataset(name: str, split: str = "train", subset: str = "", revision: str = "") -> Any:
    """A ``datasets.Dataset`` from a hub name, a ``save_to_disk`` folder, or a data file / folder.

    Local files (``.json``, ``.jsonl``, ``.parquet``, ``.csv``, ``.arrow``) are read with the
    matching ``datasets`` builder; the whole file is the ``split``. Without ``datasets`` installed, a
    local ``.jsonl`` or ``.json`` file (a list of records) is still read, as a list of dicts, so the
    recipes' own JSON data needs no extra; everything else needs the ``hub`` extra.
    """
    path = Path(name).expanduser()
    if path.is_file() and path.suffix.lower() in (".json", ".jsonl") and not _has_module("datasets"):
        return read_json_records(path)
    datasets = require("datasets", "Hugging Face conversation datasets")
    if path.is_dir() and ((path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()):
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise KeyError(f"{path} has splits {sorted(loaded)} but split={split!r} was asked for "
                               f"(config key train.train_policy.dataset.split)")
            loaded = loaded[split]
        return loaded
    if path.is_file():
        builder = _FILE_BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise ValueError(f"cannot read dataset file {path}: use one of {sorted(_FILE_BUILDERS)}")
        if builder == "json":
            read_utf8(path)  # the json builder would read other bytes without a word
        try:
            return datasets.load_dataset(builder, data_files={split: str(path)}, split=split)
        except Exception:
            if builder == "json":
                read_json_records(path)  # the builder's error names no line: this one does, when it finds it
            raise
    return datasets.load_dataset(name if not path.is_dir() else str(path), subset or None, split=split,
                                 revision=revision or None)


class HFConversationDataset:
    """Random access to conversation rows, media loaded per item.

    Args:
        rows: a ``datasets.Dataset`` or any sequence of dict rows.
        media_dir: folder relative media paths are taken under.
        settings: video / image reading defaults (a part's own ``fps`` / ``max_pixels`` win).
        conversation_column: the column holding the conversation (a list of messages or its JSON).
        video_column, image_column: a row's clip / image when its conversation holds no media part
            (Cosmos-Reason1-SFT rows); missing or empty columns are ignored.
        system_prompt: prepended as a system message when the row has none ("" keeps the template's).
        name: used in messages naming a row (``name[index]``).

    ``dataset[i]`` returns a :class:`ConversationSample` or raises
    :class:`~cosmos_primitives.data.bad_samples.BadSampleError` naming the file or row at fault.
    """

    def __init__(self, rows: Sequence[dict[str, Any]] | Any, media_dir: str | Path | None = None,
                 settings: MediaSettings | None = None, conversation_column: str = "conversations",
                 video_column: str = "video", image_column: str = "image",
                 system_prompt: str = "", name: str = "dataset") -> None:
        self.rows = rows
        self.media_dir = media_dir
        self.settings = settings or MediaSettings()
        self.conversation_column = conversation_column
        self.video_column, self.image_column = video_column, image_column
        self.system_prompt = system_prompt
        self.name = name
        columns = getattr(rows, "column_names", None)
        if columns is not None and conversation_column not in columns:
            raise KeyError(f"{name} has no column {conversation_column!r} (columns: {columns}); set "
                           f"train.train_policy.conversation_column_name")

    @classmethod
    def from_config(cls, cfg: DatasetConfig, conversation_column: str = "conversations",
                    processor: Any = None) -> HFConversationDataset:
        """From a :class:`~cosmos_primitives.config.DatasetConfig`; local datasets default their
        ``media_dir`` to their own folder; media are sized for ``processor`` (its patch size)."""
        rows = load_hf_dataset(cfg.name, split=cfg.split, subset=cfg.subset, revision=cfg.revision)
        return cls(rows, media_dir=default_media_dir(cfg), settings=MediaSettings.from_config(cfg, processor),
                   conversation_column=conversation_column, video_column=cfg.video_column,
                   image_column=cfg.image_column, system_prompt=cfg.system_prompt, name=cfg.name)

    def __len__(self) -> int:
        return len(self.rows)

    def conversation(self, index: int) -> list[dict[str, Any]]:
        """Row ``index``'s normalized conversation (media not loaded, paths as stored)."""
        row = self.rows[index]
        where = f"{self.name}[{index}]"
        if self.conversation_column not in row:
            raise KeyError(f"{where} has no field {self.conversation_column!r} (fields: {sorted(row)})")
        messages = normalize_conversation(row[self.conversation_column], where)
        _add_row_media(messages, row, self.video_column, self.image_column)
        if self.system_prompt and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    def __getitem__(self, index: int) -> ConversationSample:
        where = f"{self.name}[{index}]"
        with bad_sample_boundary(where):  # a malformed row is a bad sample (media errors name their file)
            return load_conversation(self.conversation(index), self.media_dir, self.settings, sample_id=where)


def _add_row_media(messages: list[dict[str, Any]], row: Any, video_column: str, image_column: str) -> None:
    """Put the row's clip (or image) first in the first user message, when no message has media."""
    if any(isinstance(m["content"], list) and any(p["type"] != "text" for p in m["content"]) for m in messages):
        return
    kind, value = next(((k, row[c]) for k, c in (("video", video_column), ("image", image_column)) if row.get(c)),
                       (None, None))
    if kind is None:
        return
    for message in messages:
        if message["role"] == "user":
            text = message["content"]
            parts = [{"type": "text", "text": text}] if isinstance(text, str) else list(text)
            message["content"] = [{"type": kind, kind: str(value)}, *parts]
            return
