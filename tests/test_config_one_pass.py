"""The config pipeline runs once per load: one read, one cosmos-rl pre-pass, one validation."""

from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from cosmos_primitives.config import loader

COSMOS_RL_FILE = """
redis = "12800"
[train]
epsilon = 1e-6
optm_lr = 2e-6
[train.train_policy]
type = "grpo"
temperature = 0.9
[rollout]
n_generation = 4
"""


def _count(monkeypatch: pytest.MonkeyPatch, calls: Counter[str], name: str, *, whole_tree_only: bool = False) -> None:
    original = getattr(loader, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        # _problems recurses into sub-tables and checks each override alone: count the whole-tree checks
        if not whole_tree_only or (args[2] == "" and not str(args[3]).startswith("override")):
            calls[name] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(loader, name, counted)


@pytest.mark.parametrize("entry", ["load_config", "config_from_dict"])
def test_one_load_runs_the_pipeline_once(entry: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "rl.toml"
    path.write_text(COSMOS_RL_FILE)
    calls: Counter[str] = Counter()
    for name in ("_read_cosmos_rl", "_apply_aliases", "_finish_cosmos_rl", "_apply_normalisers"):
        _count(monkeypatch, calls, name)
    _count(monkeypatch, calls, "_problems", whole_tree_only=True)
    converted: list[Any] = []
    real_convert = loader.msgspec.convert

    def convert(value: Any, tp: Any, **kwargs: Any) -> Any:
        converted.append(tp)
        return real_convert(value, tp, **kwargs)

    monkeypatch.setattr(loader.msgspec, "convert", convert)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        if entry == "load_config":
            cfg = loader.load_config(path, ["train.max_steps=3", "grpo.kl_beta=0.01"])
        else:
            cfg = loader.config_from_dict(loader.read_toml(path))
    assert cfg.grpo.num_samples_per_prompt == 4 and cfg.train.optm_eps == 1e-6  # read as cosmos-rl's
    assert calls == {"_read_cosmos_rl": 1, "_apply_aliases": 1, "_finish_cosmos_rl": 1, "_apply_normalisers": 1,
                     "_problems": 1}, calls
    assert converted.count(loader.Config) == 1  # the tree becomes a Config once


def test_the_cosmos_rl_pre_pass_warns_nothing_and_the_loader_says_its_reading_once(tmp_path: Path) -> None:
    from cosmos_primitives.config.compat import pre_pass

    path = tmp_path / "rl.toml"
    path.write_text(COSMOS_RL_FILE)
    tree = loader.read_toml(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # dict in, dict out: no warning, no log, no validation
        reading, why = loader._read_cosmos_rl(tree, pre_pass.pop_style(tree, str(path)))
        assert loader._apply_aliases(tree, str(path)) == []
        pre_pass.finish(tree, reading, set())
    assert reading is not None and "redis" in why  # read as cosmos-rl's: its top-level redis is the controller port
    assert tree["train"]["optm_eps"] == 1e-6 and tree["grpo"]["num_samples_per_prompt"] == 4
    assert tree["rollout"]["batch_size"] == 4  # cosmos-rl's 1 prompt per call x 4 samples
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader.load_config(path)
    assert [str(w.message) for w in caught if "read as a cosmos-rl config" in str(w.message)] == [
        reading.warning(str(path))]
