"""``[train.train_policy]`` and its ``[...dataset]``: what is trained on which data."""

from __future__ import annotations

from typing import Literal

import msgspec

from cosmos_primitives.config.base import AtLeastOne, NonNegativeInt, OpenFraction, Positive, Section


class DatasetConfig(Section):
    """``[train.train_policy.dataset]``: a hub name or a local path, and how to read its media.

    Sources (``kind``): ``"hf"`` reads a ``datasets`` dataset (hub name, a ``save_to_disk`` folder,
    or a ``.json`` / ``.jsonl`` / ``.parquet`` file) whose rows hold a ``conversations`` column;
    ``"video_folder"`` reads ``<name>/videos/<id><video_suffix>.mp4`` beside
    ``<name>/metas/<id>.label.json``; ``"auto"`` picks ``video_folder`` when ``name`` is a folder
    holding ``videos/`` and ``metas/``, else ``hf``.

    Media: relative media paths resolve under ``media_dir`` (default: the dataset's own folder; for a
    Hub dataset, cosmos-rl's clip folder ``$COSMOS_CACHE/datasets/<owner>/<name>/<subset>/video_clips``
    when it exists); a file not found there is looked up by name below it. SFT rows whose
    conversation has no media part get the file of their ``video_column`` (or ``image_column``).
    Videos are sampled at ``fps`` frames per second, at most ``max_frames`` frames (an even number,
    as Qwen2.5-VL's temporal patch is 2 frames), each frame resized to at most ``max_pixels`` pixels
    (a per-part ``"fps"`` / ``"max_pixels"`` in the conversation overrides these).

    Bad samples (missing or undecodable media, samples longer than the packing budget) are skipped,
    counted and logged; the run stops once more than ``bad_sample_budget`` were seen on one rank.

    ``test_size`` (read on ``[train.train_policy.dataset]`` by the SFT and colocated GRPO recipes, cosmos-rl's key and
    meaning): with ``[validation] enable`` and no ``[validation.dataset] name``, this many items (an
    int) or this fraction of the items (a float in (0, 1), rounded up) are held out of training as
    the validation split (unset: 0.1, as cosmos-rl); chosen at random, seeded by ``[train] seed``
    (:func:`cosmos_primitives.data.split_validation`). Without validation it holds nothing out.
    """

    name: str = ""
    # SFT and GRPO: a dataset class (or factory) by import path, "my_pkg.data:MyDataset", or script path,
    # "tools/dataset/cosmos_sft.py", used instead of the built-in readers; cosmos-rl dataset classes run
    # unchanged (cp.data.plugins)
    plugin: str = ""
    subset: str = ""
    revision: str = ""
    split: str = "train"
    test_size: AtLeastOne | OpenFraction | None = None
    kind: Literal["auto", "hf", "video_folder"] = "auto"
    media_dir: str = ""
    fps: Positive = 2.0
    max_pixels: AtLeastOne = 81920
    min_pixels: AtLeastOne = 3136
    max_frames: AtLeastOne = 32
    video_backend: Literal["auto", "decord", "pyav"] = "auto"
    bad_sample_budget: NonNegativeInt = 100
    # video folder adapter
    video_suffix: str = ""
    label_field: str = ""
    prompt: str = "Describe what happens in this video."
    # unset: no system message (a chat template may add its own default); "" : an empty system message,
    # as cosmos-rl sends (a cosmos-rl file renders token for token the same)
    system_prompt: str | None = None
    # MCQ prompt adapter (Cosmos-Reason1-RL style rows)
    question_column: str = "question"
    choices_column: str = "choices"
    answer_column: str = "answer"
    video_column: str = "video"
    image_column: str = "image"


class TrainPolicyConfig(Section):
    """``[train.train_policy]``: what is trained (``type``) and on which data.

    ``sequence_packing``: several samples share one row of at most ``packing_budget`` tokens
    (``None``: ``policy.model_max_length``). ``packing_buffer``: samples held to choose rows from when
    batches are drawn one at a time (``SFTBatchLoader.next_batch`` / iteration); ``examples/sft.py``
    draws per optimizer step (``next_step``), which packs that step's ``train_batch_per_replica``
    samples together, so there the step's samples are the buffer and this key has no effect.
    The GRPO knobs that older configs spell here (``epsilon_low``, ``kl_beta``, ``loss_type``,
    ``variant``, ...) are aliases of the fields of ``[grpo]``.
    """

    type: Literal["sft", "grpo"] = "sft"
    dataset: DatasetConfig = msgspec.field(default_factory=DatasetConfig)
    conversation_column_name: str = "conversations"
    # cosmos-rl's prompt / reference-answer column names, read by a dataset plug-in ([...dataset] plugin)
    prompt_column_name: str = ""
    response_column_name: str = ""
    mini_batch: AtLeastOne = 1
    sequence_packing: bool = True
    packing_budget: AtLeastOne | None = None
    packing_buffer: AtLeastOne = 32
