"""The GRPO prompts of a config: the training prompts and, with ``[validation] enable``, the
validation prompts: a separate ``[validation.dataset]``, or a held-out part of the training prompts
(cosmos-rl's ``train.train_policy.dataset.test_size``).

cosmos-rl (``split_train_n_val_dataset``, used by its GRPO controller when validation is on and no
``validation.dataset.name`` is given) holds out the first rows of the training data unshuffled; here,
as in the SFT split, the held-out items are drawn at random with a generator seeded by ``[train] seed``
(:func:`~cosmos_primitives.data.sft_validation.split_validation`), the same on every rank and run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cosmos_primitives.config.dataset import TrainPolicyConfig
from cosmos_primitives.config.validation import ValidationConfig
from cosmos_primitives.data.plugins import prompt_dataset
from cosmos_primitives.data.sft_validation import IndexedSubset, split_validation
from cosmos_primitives.logging.console import get_logger

if TYPE_CHECKING:  # pragma: no cover
    from cosmos_primitives.config.root import Config


def build_grpo_datasets(train_policy: TrainPolicyConfig, validation: ValidationConfig, *, seed: int,
                        processor: Any = None, setup_config: Config | None = None) -> tuple[Any, Any | None]:
    """``(train_prompts, validation_prompts)`` of the ``[train.train_policy]`` and ``[validation]``
    sections (each read by :func:`~cosmos_primitives.data.plugins.prompt_dataset` with
    ``train_policy``'s prompt / response columns; ``setup_config``, the run's config, goes to a
    dataset plug-in's ``setup``).

    Without ``[validation] enable`` the validation prompts are None and training sees every item.
    With it: ``[validation.dataset]`` when its ``name`` is set, else the items
    ``[train.train_policy.dataset] test_size`` (int: a count; float in (0, 1): a fraction, rounded
    up; unset: 0.1) holds out of the training prompts, drawn with ``seed`` (the run's ``[train]
    seed``), which training then never sees.

    Raises:
        ValueError: ``test_size`` would hold out none or every training item (naming the key).
    """
    dataset_cfg = train_policy.dataset
    columns = {"prompt_column": train_policy.prompt_column_name, "response_column": train_policy.response_column_name}
    train = prompt_dataset(dataset_cfg, **columns, processor=processor, setup_config=setup_config)
    if not validation.enable:
        return train, None
    if validation.dataset.name:
        return train, prompt_dataset(validation.dataset, **columns, processor=processor, setup_config=setup_config)
    train_indices, val_indices = split_validation(len(train), dataset_cfg.test_size, seed)
    get_logger().info(f"validation: {len(val_indices)} of the {len(train)} training prompts held out "
                      f"(train.train_policy.dataset.test_size = {dataset_cfg.test_size}); training uses the "
                      f"other {len(train_indices)}")
    return IndexedSubset(train, train_indices), IndexedSubset(train, val_indices)
