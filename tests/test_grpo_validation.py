"""GRPO validation prompts: a separate [validation.dataset], or without its name the items
train.train_policy.dataset.test_size holds out of the training prompts (cosmos-rl's meaning), which
training then never sees."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import cosmos_primitives as cp
from cosmos_primitives.data import build_grpo_datasets


def _datasets(cfg: cp.Config, processor=None):
    """``build_grpo_datasets`` of a loaded config's sections, as the recipe calls it."""
    return build_grpo_datasets(cfg.train.train_policy, cfg.validation, seed=cfg.train.seed, processor=processor,
                               setup_config=cfg)


def _config(rows: Path, *overrides: str) -> cp.config.Config:
    return cp.load_config(None, ["train.train_policy.type=grpo", "train.train_policy.prompt_column_name=q",
                                 "train.train_policy.response_column_name=a",
                                 f"train.train_policy.dataset.name={rows}", *overrides])


def _texts(dataset) -> list[str]:
    return [dataset[i].conversation for i in range(len(dataset))]


@pytest.fixture
def rows(tmp_path: Path) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"q": f"question {i}", "a": str(i)}) + "\n" for i in range(10)))
    return path


def test_test_size_holds_validation_prompts_out_of_training(rows: Path) -> None:
    train, val = _datasets(_config(rows, "validation.enable=true", "train.train_policy.dataset.test_size=3"))
    assert (len(train), len(val)) == (7, 3)
    assert set(_texts(train)).isdisjoint(_texts(val))
    assert sorted(_texts(train) + _texts(val)) == sorted(f"question {i}" for i in range(10))
    assert [p.reference for p in (val[i] for i in range(3))] == [t.split()[-1] for t in _texts(val)]
    again, _ = _datasets(_config(rows, "validation.enable=true", "train.train_policy.dataset.test_size=3"))
    assert _texts(again) == _texts(train)  # seeded by [train] seed: the same split on every rank and resume

    _, default = _datasets(_config(rows, "validation.enable=true"))
    assert len(default) == 1  # unset: 10 %, rounded up
    whole, none = _datasets(_config(rows, "train.train_policy.dataset.test_size=3"))
    assert len(whole) == 10 and none is None  # no validation: nothing held out
    with pytest.raises(ValueError, match="test_size = 10 holds out 10 of the 10"):
        _datasets(_config(rows, "validation.enable=true", "train.train_policy.dataset.test_size=10"))


def test_a_named_validation_dataset_leaves_the_training_prompts_whole(rows: Path, tmp_path: Path) -> None:
    other = tmp_path / "val.jsonl"
    other.write_text(json.dumps({"q": "held elsewhere", "a": "x"}) + "\n")
    train, val = _datasets(_config(rows, "validation.enable=true", f"validation.dataset.name={other}",
                                             "train.train_policy.dataset.test_size=3"))
    assert len(train) == 10 and _texts(val) == ["held elsewhere"]


@pytest.mark.parametrize(("test_size", "max_items", "available", "count"), [
    (None, None, 250, 250),
    (0.01, None, 250, 2),    # int(250 * 0.01): cosmos-rl's countdown / deepmath scripts' __len__
    (0.01, None, 99, 0),     # rounded down, to nothing, as there
    (7, None, 250, 7), (700, None, 250, 250),  # an item count, at most the dataset
    (0.5, 40, 250, 40), (None, 3, 250, 3),     # max_items caps either
])
def test_validation_dataset_test_size_takes_the_first_items_as_cosmos_rl_s_distillation_scripts(
        test_size, max_items, available, count) -> None:
    overrides = [] if test_size is None else [f"validation.dataset.test_size={test_size}"]
    overrides += [] if max_items is None else [f"validation.max_items={max_items}"]
    cfg = cp.load_config(None, ["train.train_policy.type=grpo", *overrides])
    assert cp.config.validation_item_count(cfg, available) == count


def test_validation_top_p_unset_is_the_rollout_s_as_cosmos_rl(rows: Path) -> None:
    cfg = _config(rows, "rollout.sampling_config.top_p=0.9")
    assert cp.data.SamplingParams.for_validation(cfg.validation, cfg.rollout, seed=cfg.train.seed).top_p == 0.9
    cfg = _config(rows, "rollout.sampling_config.top_p=0.9", "validation.top_p=0.95", "validation.temperature=0.6",
                  "validation.max_response_length=33", "train.seed=5")
    params = cp.data.SamplingParams.for_validation(cfg.validation, cfg.rollout, seed=cfg.train.seed)
    got = (params.num_samples_per_prompt, params.top_p, params.temperature, params.max_response_length, params.seed)
    assert got == (1, 0.95, 0.6, 33, 5)
