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
        if isinstance(item, str):
            item = [{"role": "user", "content": item}]
        if not isinstance(item, list) or not all(isinstance(m, dict) and "role" in m for m in item):
            raise BadSampleError(where, f"__getitem__ must return a conversation (a list of messages) or a "
                                        f"string, got {type(item).__name__}")
        loaded = load_conversation(item, self.media_dir, self.settings, sample_id=where)
        return Prompt(conversation=loaded.conversation, prompt_id=where, images=loaded.images, videos=loaded.videos,
                      video_fps=loaded.video_fps, reference="" if reference is None else str(reference),
                      row={"index": index})


def prompt_dataset(dataset_cfg: Any, config: Any = None, processor: Any = None) -> Any:
    """The GRPO prompt source of a ``DatasetConfig``: its ``plugin`` (a class or factory by import path,
    called without arguments; an object with cosmos-rl's ``setup`` / ``get_reference_answer`` is
    wrapped in :class:`CosmosRLPromptDataset`, any other is taken to yield :class:`Prompt` items
    itself) or the built-in MCQ reader. ``config`` and ``processor``'s tokenizer (or ``processor``
    itself when it is one) go to the plug-in's ``setup``.

    Raises:
        ImportError: the plug-in does not import (naming the path and the key).
    """
    if not dataset_cfg.plugin:
        return MCQPromptDataset.from_config(dataset_cfg)
    factory = import_object(dataset_cfg.plugin, what="[train.train_policy.dataset] plugin")
    dataset = factory() if callable(factory) else factory
    if not (hasattr(dataset, "setup") or hasattr(dataset, "get_reference_answer")):
        return dataset  # this library's shape: dataset[i] is a Prompt
    tokenizer = getattr(processor, "tokenizer", processor)
    return CosmosRLPromptDataset(dataset, config, tokenizer, media_dir=default_media_dir(dataset_cfg),
                                 settings=MediaSettings.from_config(dataset_cfg), name=dataset_cfg.plugin)
