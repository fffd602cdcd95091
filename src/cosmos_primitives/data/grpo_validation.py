"""The GRPO prompts of a config: the training prompts and, with ``[validation] enable``, the
validation prompts: a separate ``[validation.dataset]``, or a held-out part of the training prompts
(cosmos-rl's ``train.train_policy.dataset.test_size``).

cosmos-rl (``split_train_n_val_dataset``, used by its GRPO controller when validation is on and no
``validation.dataset.name`` is given) holds out the first rows of the training data unshuffled; here,
as in the SFT split, the held-out items are drawn at random with a generator seeded by ``[train] seed``
(:func:`~cosmos_primitives.data.sft_validation.split_validation`), the same on every rank and run.
"""

from __future__ import annotations

from typing import Any

from cosmos_primitives.data.plugins import prompt_dataset
from cosmos_primitives.data.sft_validation import IndexedSubset, split_validation
from cosmos_primitives.logging.console import get_logger


def build_grpo_datasets(config: Any, processor: Any = None) -> tuple[Any, Any | None]:
    """``(train_prompts, validation_prompts)`` of a :class:`~cosmos_primitives.config.Config`
    (each read by :func:`~cosmos_primitives.data.plugins.prompt_dataset`).

    Without ``[validation] enable`` the validation prompts are None and training sees every item.
    With it: ``[validation.dataset]`` when its ``name`` is set, else the items
    ``[train.train_policy.dataset] test_size`` (int: a count; float in (0, 1): a fraction, rounded
    up; unset: 0.1) holds out of the training prompts, which training then never sees.

    Raises:
        ValueError: ``test_size`` would hold out none or every training item (naming the key).
    """
    policy_cfg = config.train.train_policy
    dataset_cfg = policy_cfg.dataset
    columns = {"prompt_column": policy_cfg.prompt_column_name, "response_column": policy_cfg.response_column_name}
    train = prompt_dataset(dataset_cfg, **columns, processor=processor, setup_config=config)
    if not config.validation.enable:
        return train, None
    if config.validation.dataset.name:
        return train, prompt_dataset(config.validation.dataset, **columns, processor=processor, setup_config=config)
    train_indices, val_indices = split_validation(len(train), dataset_cfg.test_size, config.train.seed)
    get_logger().info(f"validation: {len(val_indices)} of the {len(train)} training prompts held out "
                      f"(train.train_policy.dataset.test_size = {dataset_cfg.test_size}); training uses the "
                      f"other {len(train_indices)}")
    return IndexedSubset(train, train_indices), IndexedSubset(train, val_indices)
