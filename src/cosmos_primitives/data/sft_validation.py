"""The SFT validation split: a held-out part of the training dataset (cosmos-rl's
``dataset.test_size``) or a separate ``[validation.dataset]``, and the loader each rank scores it with.

cosmos-rl (``split_train_n_val_dataset``) holds out the first / last rows of the training data
unshuffled; here the held-out items are drawn at random with a generator seeded by ``[train]
seed``, so a dataset sorted by source or length is not split along that order, and the same
seed gives the same split on every rank and every run (resumes included).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from cosmos_primitives.config.dataset import TrainPolicyConfig
from cosmos_primitives.config.validation import ValidationConfig
from cosmos_primitives.data.sft_loader import SFTBatchLoader, build_sft_dataset, build_sft_loader

if TYPE_CHECKING:  # pragma: no cover
    from cosmos_primitives.config.root import Config

DEFAULT_TEST_SIZE = 0.1  # cosmos-rl's, when validation is on and test_size is unset


class IndexedSubset:
    """``dataset`` seen through ``indices``: ``subset[i]`` is ``dataset[indices[i]]``."""

    def __init__(self, dataset: Any, indices: Sequence[int]) -> None:
        self.dataset = dataset
        self.indices = list(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[self.indices[index]]


def held_out_count(num_items: int, test_size: int | float | None) -> int:
    """Items ``test_size`` holds out of ``num_items``: an int is a count, a float in (0, 1) a
    fraction (rounded up, as ``datasets``' ``train_test_split``), None the default 10 %.

    Raises:
        ValueError: the count would leave no item to train on (or hold out none), naming the key.
    """
    size = DEFAULT_TEST_SIZE if test_size is None else test_size
    if isinstance(size, float) and not 0.0 < size < 1.0:
        raise ValueError(f"train.train_policy.dataset.test_size = {size!r}: a fraction must lie in (0, 1)")
    count = math.ceil(size * num_items) if isinstance(size, float) else int(size)
    if not 1 <= count < num_items:
        raise ValueError(f"train.train_policy.dataset.test_size = {test_size!r} holds out {count} of the "
                         f"{num_items} training items: it must leave at least one to train on and hold out at "
                         "least one; lower it, or give a separate validation dataset ([validation.dataset] name)")
    return count


def split_validation(num_items: int, test_size: int | float | None, seed: int) -> tuple[list[int], list[int]]:
    """``(train_indices, validation_indices)``, disjoint, covering ``range(num_items)``, each sorted.

    The validation indices are the first :func:`held_out_count` of a ``torch.randperm`` seeded
    with ``seed``: the same arguments give the same split on any machine.
    """
    count = held_out_count(num_items, test_size)
    order = torch.randperm(num_items, generator=torch.Generator().manual_seed(seed)).tolist()
    return sorted(order[count:]), sorted(order[:count])


def build_sft_datasets(train_policy: TrainPolicyConfig, validation: ValidationConfig, *, seed: int,
                       processor: Any = None, setup_config: Config | None = None) -> tuple[Any, Any | None]:
    """``(train_dataset, validation_dataset)`` of the ``[train.train_policy]`` and ``[validation]`` sections.

    Without ``[validation] enable`` the validation dataset is None and training sees every item.
    With it: ``[validation.dataset]`` when its ``name`` or ``plugin`` is set (read with the training
    dataset's ``conversation_column_name``), else the items ``[train.train_policy.dataset]
    test_size`` holds out of the training dataset (:func:`split_validation`, seeded by ``seed``, the
    run's ``[train] seed``), which training then never sees. Dataset plug-ins get ``setup_config``
    (the run's config) and ``processor``'s tokenizer (:func:`build_sft_dataset`). Media are sized
    for ``processor`` (the model's; its patch size).
    """
    column = train_policy.conversation_column_name
    train = build_sft_dataset(train_policy.dataset, column, setup_config=setup_config, processor=processor)
    if not validation.enable:
        return train, None
    if validation.dataset.name or validation.dataset.plugin:
        return train, build_sft_dataset(validation.dataset, column, setup_config=setup_config, processor=processor)
    train_indices, val_indices = split_validation(len(train), train_policy.dataset.test_size, seed)
    return IndexedSubset(train, train_indices), IndexedSubset(train, val_indices)


def build_sft_validation_loader(train_policy: TrainPolicyConfig, processor: Any, model_config: Any, dataset: Any, *,
                                model_max_length: int, seed: int | None = None, rank: int = 0,
                                world_size: int = 1) -> SFTBatchLoader:
    """The loader of this rank's share of the validation ``dataset``: items ``rank, rank + world_size,
    ...`` (every item on exactly one rank, none repeated), encoded, packed and batched as
    :func:`build_sft_loader` does for training (same arguments).

    Raises:
        ValueError: the split has fewer items than there are data-parallel ranks.
    """
    if len(dataset) < world_size:
        raise ValueError(f"the validation split has {len(dataset)} item(s), fewer than the {world_size} "
                         "data-parallel ranks that score it: hold out more (train.train_policy.dataset.test_size) "
                         "or give a larger validation dataset")
    share = IndexedSubset(dataset, range(rank, len(dataset), world_size))
    return build_sft_loader(train_policy, processor, model_config, model_max_length=model_max_length, seed=seed,
                            dataset=share)
