"""GRPO prompt datasets named by import path (``[train.train_policy.dataset] plugin``), including
dataset classes written for cosmos-rl.

A cosmos-rl dataset has the method shape ``setup(config, tokenizer)``, ``__len__``,
``__getitem__(idx) -> conversation`` (a list of chat messages, media parts by path) and
``get_reference_answer(idx) -> str``. :class:`CosmosRLPromptDataset` runs such a class unchanged:
it calls ``setup`` with the loaded config (cosmos-rl's keys it reads, e.g.
``config.train.train_policy.dataset.name`` or ``.prompt_column_name``, are at the same place) and
the tokenizer, and turns each item into a :class:`~cosmos_primitives.data.records.Prompt` with its
media loaded and the reference answer. The conversation is used as it is, system message included
(cosmos-rl's Reason1 script sends an empty one, so the chat template adds no default).
"""

from __future__ import annotations

from typing import Any

from cosmos_primitives.data.bad_samples import BadSampleError
from cosmos_primitives.data.conversation import load_conversation
from cosmos_primitives.data.mcq import MCQPromptDataset
from cosmos_primitives.data.media import MediaSettings, default_media_dir
from cosmos_primitives.data.records import Prompt
from cosmos_primitives.utils.imports import import_object


class CosmosRLPromptDataset:
    """Prompts from a dataset object with cosmos-rl's method shape.

    Args:
        dataset: the instance (``setup`` is called here when it has one).
        config: what ``setup`` receives as its config (the loaded :class:`~cosmos_primitives.config.Config`).
        tokenizer: what ``setup`` receives as its tokenizer.
        media_dir, settings: where relative media paths resolve and how media are read.
        name: used in bad-sample messages.

    ``dataset[i]`` is a :class:`Prompt`; an item that fails (an exception in the user's
    ``__getitem__``, a missing media file) raises :class:`BadSampleError` naming the index, so the
    recipes count and skip it within the bad-sample budget.
    """

    def __init__(self, dataset: Any, config: Any = None, tokenizer: Any = None, media_dir: Any = None,
                 settings: MediaSettings | None = None, name: str = "plugin") -> None:
        if hasattr(dataset, "setup"):
            dataset.setup(config, tokenizer)
        self.dataset = dataset
        self.media_dir = media_dir
        self.settings = settings or MediaSettings()
        self.name = name

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Prompt:
        where = f"{self.name}[{index}]"
        try:
            item = self.dataset[index]
            reference = self.dataset.get_reference_answer(index) if hasattr(self.dataset, "get_reference_answer") \
                else None
        except Exception as exc:  # the user's code: one bad item is a counted bad sample, not a dead run
            raise BadSampleError(where, f"{type(exc).__name__}: {exc}") from exc
        if isinstance(item, str):  # plain text, used as it is (cosmos-rl's text models do the same)
            return Prompt(conversation=item, prompt_id=where, reference="" if reference is None else str(reference),
                          row={"index": index})
        if not isinstance(item, list) or not all(isinstance(m, dict) and "role" in m for m in item):
            raise BadSampleError(where, f"__getitem__ must return a conversation (a list of messages) or a "
                                        f"string, got {type(item).__name__}")
        loaded = load_conversation(item, self.media_dir, self.settings, sample_id=where)
        return Prompt(conversation=loaded.conversation, prompt_id=where, images=loaded.images, videos=loaded.videos,
                      video_fps=loaded.video_fps,
                      video_metadata=loaded.video_metadata, reference="" if reference is None else str(reference),
                      row={"index": index})


class ColumnPromptDataset:
    """GRPO prompts from rows with a prompt column and a reference-answer column (cosmos-rl's
    ``prompt_column_name`` / ``response_column_name``), text-only or with an image / video.

    A string prompt is plain text used as it is, with no chat template (as cosmos-rl and TRL take a
    string prompt), unless the row has an image or video or ``system_prompt`` is a non-empty string:
    then it becomes the user message (after the media) of a conversation that goes through the chat
    template. A prompt that is already a conversation (a list of messages) is used as it is.
    ``system_prompt`` (unless None) adds a system message before a conversation; ``""`` is an empty
    one, as cosmos-rl's Reason1 script sends (a plain-text prompt stays plain). The reference answer
    is the response column's value as text ("" when no response column is named); the rewards
    receive it and the row.
    """

    def __init__(self, rows: Any, prompt_column: str, response_column: str = "", media_dir: Any = None,
                 settings: MediaSettings | None = None, image_column: str = "image", video_column: str = "video",
                 system_prompt: str | None = None, name: str = "dataset") -> None:
        self.rows = rows
        self.prompt_column, self.response_column = prompt_column, response_column
        self.media_dir = media_dir
        self.settings = settings or MediaSettings()
        self.image_column, self.video_column = image_column, video_column
        self.system_prompt = system_prompt
        self.name = name

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> Prompt:
        row = dict(self.rows[index])
        where = f"{self.name}[{index}]"
        if self.prompt_column not in row:
            raise BadSampleError(where, f"no prompt column {self.prompt_column!r} "
                                        f"(train.train_policy.prompt_column_name); row has {sorted(row)}")
        prompt = row[self.prompt_column]
        media = row.get(self.video_column) or row.get(self.image_column)
        reference = row.get(self.response_column, "") if self.response_column else ""
        reference = "" if reference is None else str(reference)
        if isinstance(prompt, str) and not media and not self.system_prompt:
            return Prompt(conversation=prompt, prompt_id=str(row.get("id", where)), reference=reference, row=row)
        if isinstance(prompt, str):
            content: list[dict[str, Any]] = []
            if row.get(self.video_column):
                content.append({"type": "video", "video": str(row[self.video_column])})
            elif row.get(self.image_column):
                content.append({"type": "image", "image": str(row[self.image_column])})
            content.append({"type": "text", "text": prompt})
            messages = [{"role": "user", "content": content}]
        elif isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt):
            messages = prompt
        else:
            raise BadSampleError(where, f"prompt column {self.prompt_column!r} holds a {type(prompt).__name__}, "
                                        "not a string or a conversation: read such rows with a dataset plug-in "
                                        "(train.train_policy.dataset.plugin) or the MCQ reader's dotted columns")
        if self.system_prompt is not None:
            messages = [{"role": "system", "content": self.system_prompt}, *messages]
        loaded = load_conversation(messages, self.media_dir, self.settings, sample_id=where)
        return Prompt(conversation=loaded.conversation, prompt_id=str(row.get("id", where)), images=loaded.images,
                      videos=loaded.videos, video_fps=loaded.video_fps,
                      video_metadata=loaded.video_metadata, reference=reference, row=row)


def prompt_dataset(dataset_cfg: Any, config: Any = None, processor: Any = None) -> Any:
    """The GRPO prompt source of a ``DatasetConfig``: its ``plugin`` (a class or factory by import path,
    called without arguments; an object with cosmos-rl's ``setup`` / ``get_reference_answer`` is
    wrapped in :class:`CosmosRLPromptDataset`, any other is taken to yield :class:`Prompt` items
    itself); else, when ``config`` names ``train.train_policy.prompt_column_name``, a
    :class:`ColumnPromptDataset` over the dataset's rows; else the built-in MCQ reader.
    ``config`` and ``processor``'s tokenizer (or ``processor`` itself when it is one) go to the
    plug-in's ``setup``.

    Raises:
        ImportError: the plug-in does not import (naming the path and the key).
    """
    columns = getattr(getattr(getattr(config, "train", None), "train_policy", None), "prompt_column_name", "")
    if not dataset_cfg.plugin and columns:
        from cosmos_primitives.data.hf_conversations import load_hf_dataset

        rows = load_hf_dataset(dataset_cfg.name, split=dataset_cfg.split, subset=dataset_cfg.subset,
                               revision=dataset_cfg.revision)
        return ColumnPromptDataset(rows, columns, config.train.train_policy.response_column_name,
                                   media_dir=default_media_dir(dataset_cfg),
                                   settings=MediaSettings.from_config(dataset_cfg, processor),
                                   image_column=dataset_cfg.image_column, video_column=dataset_cfg.video_column,
                                   system_prompt=dataset_cfg.system_prompt, name=dataset_cfg.name or "dataset")
    if not dataset_cfg.plugin:
        return MCQPromptDataset.from_config(dataset_cfg, processor=processor)
    factory = import_object(dataset_cfg.plugin, what="[train.train_policy.dataset] plugin")
    dataset = factory() if callable(factory) else factory
    if not (hasattr(dataset, "setup") or hasattr(dataset, "get_reference_answer")):
        return dataset  # this library's shape: dataset[i] is a Prompt
    tokenizer = getattr(processor, "tokenizer", processor)
    return CosmosRLPromptDataset(dataset, config, tokenizer, media_dir=default_media_dir(dataset_cfg),
                                 settings=MediaSettings.from_config(dataset_cfg, processor), name=dataset_cfg.plugin)
