"""``[train.train_policy]`` and its ``[...dataset]``: what is trained on which data."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from cosmos_primitives.config.base import AtLeastOne, NonNegativeInt, Positive, Section, ShareBelowOne


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
    Images and videos are read as cosmos-rl's Qwen-VL packers read them (qwen-vl-utils' rules): a
    conversation part's own ``"fps"`` / ``"max_pixels"`` / ``"min_pixels"`` / ``"max_frames"`` (or
    any other qwen-vl-utils key) wins, then ``fps`` / ``max_pixels`` / ``min_pixels`` /
    ``max_frames`` here, then qwen-vl-utils' defaults (unset here: 2 fps; frames per video floored
    to an even number, at most ``min(768, frames in the clip)``; per video frame at least 128 x 28 x
    28 pixels and at most 768 x 28 x 28; images 4 .. 16384 x 28 x 28 pixels; 28 is Qwen2.5-VL's
    token side, 32 Qwen3-VL's). ``max_pixels`` / ``min_pixels`` bound images and video frames alike.
    ``total_pixels`` is a video's budget (qwen-vl-utils' key, a part's own wins): each frame is
    capped at ``total_pixels / frames x 2`` pixels (two frames make one temporal patch), so a long
    clip gets smaller frames; unset: qwen-vl-utils' default, 0.9 x 128000 tokens. The Cosmos-Reason2
    example scripts give every video ``0.9 x policy.model_max_length`` tokens of 32 x 32 pixels
    (``examples/configs/cosmos_reason2_2b_sft.toml``).

    Bad samples (missing or undecodable media, samples longer than the packing budget) are skipped,
    counted and logged; the run stops once more than ``bad_sample_budget`` were seen on one rank.

    ``test_size`` (read on ``[train.train_policy.dataset]`` by the SFT and colocated GRPO recipes, cosmos-rl's key and
    meaning): with ``[validation] enable`` and no ``[validation.dataset] name``, this many items (an
    int) or this fraction of the items (a float in (0, 1), rounded up) are held out of training as
    the validation split (unset: 0.1, as cosmos-rl); chosen at random, seeded by ``[train] seed``
    (:func:`cosmos_primitives.data.split_validation`). Without validation it holds nothing out; 0
    holds nothing out either, so with validation on it needs ``[validation.dataset] name``.
    """

    name: str = ""
    # SFT and GRPO: a dataset class (or factory) by import path, "my_pkg.data:MyDataset", or script path,
    # "tools/dataset/cosmos_sft.py", used instead of the built-in readers; cosmos-rl dataset classes run
    # unchanged (cp.data.plugins)
    plugin: str = ""
    subset: str = ""
    revision: str = ""
    split: str = "train"
    test_size: NonNegativeInt | ShareBelowOne | None = None
    kind: Literal["auto", "hf", "video_folder"] = "auto"
    media_dir: str = ""
    # unset: qwen-vl-utils' default, as cosmos-rl's packers use for a part without the key
    fps: Positive | None = None
    max_pixels: AtLeastOne | None = None
    min_pixels: AtLeastOne | None = None
    max_frames: AtLeastOne | None = None
    total_pixels: AtLeastOne | None = None
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

    Data order (``cp.config.sampler_settings``): ``dataloader_shuffle`` (false: the dataset's own
    order) and ``dataloader_seed`` (None: ``[train] seed``; a cosmos-rl file gets cosmos-rl's 0),
    the seed of the per-epoch permutation, ``torch.randperm`` seeded ``seed + epoch`` as torch's
    ``DistributedSampler`` (cosmos-rl's SFT loader) draws it.
    ``max_token_len_per_mini_batch`` (cosmos-rl's key): the GRPO update groups rows of similar
    length into micro-batches of at most that many padded tokens (``rows x longest row``, per
    context-parallel rank) instead of ``mini_batch`` rows; the loss is unchanged
    (``cp.policy.grpo_update``).
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
    # GRPO dynamic batching: micro-batches of rows x longest row <= this many tokens (None: mini_batch rows)
    max_token_len_per_mini_batch: AtLeastOne | None = None
    sequence_packing: bool = True
    packing_budget: AtLeastOne | None = None
    packing_buffer: AtLeastOne = 32
    dataloader_shuffle: bool = True
    dataloader_seed: int | None = None


def sampler_settings(config: Any) -> dict[str, Any]:
    """``seed`` and ``shuffle`` of the training data's sampler (``cp.data.ResumableDistributedSampler``)
    from a :class:`~cosmos_primitives.config.Config`: ``[train.train_policy] dataloader_seed`` (unset:
    ``[train] seed``) and ``dataloader_shuffle``."""
    return data_order(config.train.train_policy, config.train.seed)


def data_order(train_policy: TrainPolicyConfig, seed: int | None = None) -> dict[str, Any]:
    """:func:`sampler_settings` from the sections: ``train_policy``'s ``dataloader_seed`` (unset:
    ``seed``, the run's ``[train] seed``; both unset: 0) and ``dataloader_shuffle``."""
    order_seed = train_policy.dataloader_seed if train_policy.dataloader_seed is not None else seed
    return {"seed": 0 if order_seed is None else order_seed, "shuffle": train_policy.dataloader_shuffle}
