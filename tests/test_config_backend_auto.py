"""``[rollout] backend = "auto"`` (the default) is resolved where the engine is built, not when the
config is read: one file loads to the same config on a machine with vLLM and a GPU and on one without."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import pytest

import cosmos_primitives as cp
from cosmos_primitives.config import RolloutConfig
from cosmos_primitives.rollout.engine_factory import sync_layout
from cosmos_primitives.utils import engine_choice as backend_choice

FILES = {
    "ours": 'config_style = "cosmos_primitives"\n[train.train_policy]\ntype = "grpo"\n',
    "cosmos-rl": 'redis = "12800"\n[train.train_policy]\ntype = "grpo"\n[policy]\nmodel_name_or_path = "m"\n',
}


def _machine(monkeypatch: pytest.MonkeyPatch, vllm: bool, gpu: bool) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(backend_choice.importlib.util, "find_spec",
                        lambda name, *a: (object() if vllm else None) if name == "vllm" else real_find_spec(name, *a))
    monkeypatch.setattr(backend_choice, "_gpu_present", lambda: gpu)


@pytest.mark.parametrize("kind", sorted(FILES))
def test_one_file_loads_the_same_with_and_without_vllm_and_a_gpu(kind: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "c.toml"
    path.write_text(FILES[kind])
    loaded = []
    for vllm, gpu in ((True, True), (False, False), (True, False)):
        _machine(monkeypatch, vllm, gpu)
        with caplog.at_level(logging.INFO, logger="cosmos"), pytest.warns() if kind == "cosmos-rl" else _nothing():
            loaded.append(cp.config.config_to_dict(cp.load_config(path)))
    assert loaded[0] == loaded[1] == loaded[2]
    assert loaded[0]["rollout"]["backend"] == "auto"
    assert "rollout.backend" not in caplog.text  # nothing about the machine is decided (or said) at load


def test_auto_is_resolved_where_the_engine_is_built(monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    cfg = cp.load_config().rollout
    _machine(monkeypatch, vllm=True, gpu=True)
    with caplog.at_level(logging.INFO, logger="cosmos"):
        assert backend_choice.resolve_backend(cfg.backend) == "vllm"
    assert "rollout.backend = 'auto': using 'vllm' (vLLM is installed and a GPU is present)" in caplog.text
    assert sync_layout(cfg) == "hf_checkpoint"  # the builder's layout follows the resolved engine
    _machine(monkeypatch, vllm=True, gpu=False)
    assert backend_choice.resolve_backend(cfg.backend) == "hf" and sync_layout(cfg) == "hf"
    _machine(monkeypatch, vllm=False, gpu=True)
    assert backend_choice.resolve_backend(cfg.backend) == "hf"
    for chosen in ("hf", "vllm"):  # a named engine is taken as it is, on any machine
        assert backend_choice.resolve_backend(RolloutConfig(backend=chosen).backend) == chosen


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_a_cosmos_rl_file_may_say_auto_and_other_engines_are_refused_with_the_choices(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(FILES["cosmos-rl"] + '[rollout]\nbackend = "auto"\n')
    with pytest.warns(UserWarning):
        cfg = cp.load_config(path)
    assert cfg.rollout.backend == "auto" and cfg.unsupported == {}
    path.write_text(FILES["cosmos-rl"] + '[rollout]\nbackend = "trtllm"\n')
    with pytest.warns(UserWarning):
        cfg = cp.load_config(path)
    assert "'vllm' and 'hf'" in cfg.unsupported["rollout.backend"] and "'auto'" in cfg.unsupported["rollout.backend"]
