"""``[rollout] backend`` -> engine, and in-process weight sync into a vLLM engine (a stand-in with
vLLM's documented call shapes; the real vLLM cannot run here) checked by checksums."""

from __future__ import annotations

import logging

import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives import testing as cpt
from cosmos_primitives.config.rollout import RolloutConfig
from cosmos_primitives.sync import InProcessSync, WeightMismatchError
from test_rollout_vllm_standin import VL_FAMILIES, save_tiny, tiny_model


def test_hf_backend_builds_an_engine_over_its_own_module(tiny_qwen2_dir, qwen_tokenizer) -> None:
    engine, model = cp.rollout.build_rollout_engine(RolloutConfig(batch_size=5), str(tiny_qwen2_dir),
                                                    qwen_tokenizer, dtype="float32")
    assert isinstance(engine, cp.rollout.HFRolloutEngine) and engine.model is model
    assert next(model.parameters()).dtype == torch.float32 and not model.training
    assert cp.rollout.sync_layout(RolloutConfig()) == "hf"


def test_vllm_backend_takes_the_rollout_keys(standin_vllm, tiny_qwen2_dir, qwen_tokenizer) -> None:
    cfg = cp.load_config(overrides=["rollout.backend=vllm", "rollout.gpu_memory_utilization=0.4",
                                    "rollout.enforce_eager=false"]).rollout
    engine, model = cp.rollout.build_rollout_engine(cfg, str(tiny_qwen2_dir), qwen_tokenizer, dtype="bfloat16",
                                                    seed=7, max_model_len=512)
    assert model is None and isinstance(engine, cp.rollout.VLLMRolloutEngine)
    kwargs = standin_vllm.CALLS[0][1]
    assert (kwargs["gpu_memory_utilization"], kwargs["enforce_eager"], kwargs["dtype"], kwargs["seed"],
            kwargs["max_model_len"], kwargs["tensor_parallel_size"]) == (0.4, False, "bfloat16", 7, 512, 1)
    assert cp.rollout.sync_layout(cfg) == "hf_checkpoint"


def test_rollout_tensor_parallel_refusals(standin_vllm, tiny_qwen2_dir, qwen_tokenizer) -> None:
    """The HF engine cannot shard: tp_size > 1 is refused naming the key and the vLLM extra (it used to
    be ignored); vLLM takes tensor parallelism only, not pipeline / context parallel rollout sizes."""
    cfg_hf = cp.load_config(overrides=["rollout.backend=hf", "rollout.parallelism.tp_size=2"]).rollout
    with pytest.raises(ValueError, match=r"\[rollout\.parallelism\] tp_size = 2 with \[rollout\] backend = \"hf\""
                                         r".*cosmos_primitives\[vllm\]"):
        cp.rollout.build_rollout_engine(cfg_hf, str(tiny_qwen2_dir), qwen_tokenizer)
    cfg_pp = cp.load_config(overrides=["rollout.backend=vllm", "rollout.parallelism.pp_size=2"]).rollout
    with pytest.raises(ValueError, match=r"pp_size = 2 with backend = \"vllm\""):
        cp.rollout.build_rollout_engine(cfg_pp, str(tiny_qwen2_dir), qwen_tokenizer)
    assert standin_vllm.CALLS == []  # refused before vLLM was started


def test_auto_choosing_hf_runs_a_vllm_tp_size_unsharded_with_a_warning(tiny_qwen2_dir, qwen_tokenizer, caplog,
                                                                          monkeypatch) -> None:
    """A cosmos-rl file's rollout tp_size is vLLM's split: where ``backend = "auto"`` picks the HF engine
    (no vLLM or no GPU) the engine runs whole with a warning, instead of refusing the file."""
    monkeypatch.setattr("cosmos_primitives.utils.engine_choice.default_backend", lambda: ("hf", "test"))
    cfg = cp.load_config(overrides=["rollout.backend=auto", "rollout.parallelism.tp_size=2"]).rollout
    with caplog.at_level(logging.WARNING, logger="cosmos"):
        engine, model = cp.rollout.build_rollout_engine(cfg, str(tiny_qwen2_dir), qwen_tokenizer)
    assert isinstance(engine, cp.rollout.HFRolloutEngine) and model is not None
    assert "tp_size = 2 is vLLM's engine split" in caplog.text


def test_in_process_sync_into_vllm_is_checked_by_checksums(standin_vllm, tiny_qwen2_dir, qwen_tokenizer) -> None:
    trainer = cpt.tiny_qwen2(seed=11)  # other weights than the engine loaded from the folder
    cfg = cp.load_config(overrides=["rollout.backend=vllm"]).rollout
    engine, _ = cp.rollout.build_rollout_engine(cfg, str(tiny_qwen2_dir), qwen_tokenizer, dtype="float32")
    sync = InProcessSync(trainer, engine, layout=cp.rollout.sync_layout(cfg))
    result = sync.sync(version=3)
    assert result.verified and engine.weight_version == 3
    engine_params = dict(engine.llm.hf_model.named_parameters())
    for name, p in trainer.named_parameters():
        assert torch.equal(engine_params[name], p), name

    # an engine that loaded something else is caught on the first sync, naming the tensor
    real = engine.weight_checksums
    engine.weight_checksums = lambda names: {**real(names), "model.norm.weight": 0.0}
    broken = InProcessSync(trainer, engine, layout="hf_checkpoint")
    with pytest.raises(WeightMismatchError, match=r"'model\.norm\.weight'"):
        broken.sync(version=4)
    # and one that holds none of the names cannot pass for checked
    engine.weight_checksums = lambda names: {}
    with pytest.raises(WeightMismatchError, match="no checksum"):
        InProcessSync(trainer, engine, layout="hf_checkpoint").sync(version=5)


@pytest.mark.parametrize("variant", sorted(VL_FAMILIES))
def test_first_sync_checks_the_language_model_under_vllm_names(variant: str, standin_vllm, tmp_path,
                                                                monkeypatch) -> None:
    """Item 4: vLLM holds a VL model's language model as ``language_model.model.*`` with fused qkv /
    gate_up; the first-sync checksums are asked under those names, so a wrong language-model tensor
    is caught (under Qwen2.5-VL's checkpoint names only ``visual.*`` would have matched)."""
    from cosmos_primitives.rollout.vllm_engine import VLLMRolloutEngine

    folder = save_tiny(variant, tmp_path / "vl", seed=0)
    engine = VLLMRolloutEngine(str(folder), None, dtype="float32")
    checked: list[list[str]] = []
    real_sums = engine.weight_checksums
    engine.weight_checksums = lambda names: checked.append(list(names)) or real_sums(names)
    assert InProcessSync(tiny_model(variant, seed=1), engine, layout="hf_checkpoint").sync(version=1).verified
    held = dict(engine.llm.worker.model_runner.model.named_parameters())
    assert sorted(checked[0]) == sorted(held)  # every tensor the engine holds, the language model included
    assert "language_model.model.layers.1.self_attn.qkv_proj.weight" in held

    real_load = standin_vllm._VLLMModel.load_weights
    monkeypatch.setattr(standin_vllm._VLLMModel, "load_weights", lambda self, weights: real_load(
        self, ((n, t) for n, t in weights if "layers.1.self_attn.k_proj" not in n)))
    with pytest.raises(WeightMismatchError, match=r"'language_model\.model\.layers\.1\.self_attn\.qkv_proj\.weight'"):
        InProcessSync(tiny_model(variant, seed=2), engine, layout="hf_checkpoint").sync(version=2)


def test_default_memory_share_fits_beside_a_resident_trainer(standin_vllm, tiny_qwen2_dir, qwen_tokenizer) -> None:
    """Item 5: vLLM checks at start that gpu_memory_utilization x total is free; the colocated trainer's
    weights and optimizer state are already resident then (here 45% of the GPU)."""
    standin_vllm.GPU["used_by_others"] = int(0.45 * standin_vllm.GPU["total_bytes"])
    cfg = cp.load_config(overrides=["rollout.backend=vllm"]).rollout
    cp.rollout.build_rollout_engine(cfg, str(tiny_qwen2_dir), qwen_tokenizer, dtype="float32")
    assert standin_vllm.CALLS[0][1]["gpu_memory_utilization"] <= 0.55
    assert standin_vllm.CALLS[0][1]["enable_sleep_mode"] is True  # colocated: sleeps while the trainer steps
