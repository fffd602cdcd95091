"""Hugging Face safetensors export in one process: shards, index, processor files, from_pretrained parity."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from torch import nn

from cosmos_primitives.checkpoint import CheckpointManager, export_safetensors, final_export_dir
from cosmos_primitives.checkpoint.safetensors_export import GB
from cosmos_primitives.config import CheckpointConfig
from cosmos_primitives.testing import tiny_qwen2_5_vl, tiny_qwen3_vl


@pytest.fixture
def cosmos_log(caplog: pytest.LogCaptureFixture):
    """The cosmos logger does not propagate to the root logger: attach pytest's capture handler to it."""
    logger = logging.getLogger("cosmos")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="cosmos")
    yield caplog
    logger.removeHandler(caplog.handler)


@pytest.mark.parametrize(("family", "tied"), [("qwen2_5_vl", True), ("qwen3_vl", True), ("qwen3_vl", False)],
                         ids=["qwen2_5_vl", "qwen3_vl-tied", "qwen3_vl-untied"])
def test_export_tiny_vl_loads_with_identical_logits(tmp_path: Path, family: str, tied: bool, tiny_vl_processor,
                                                    tiny_qwen3_vl_processor, cosmos_log) -> None:
    """Both families (Qwen3-VL tied as Cosmos-Reason2-2B, untied as -8B) round-trip through the export."""
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration, Qwen3VLForConditionalGeneration

    if family == "qwen2_5_vl":
        model, model_class, tiny_vl_processor = tiny_qwen2_5_vl(seed=1), Qwen2_5_VLForConditionalGeneration, \
            tiny_vl_processor
    else:
        model, model_class, tiny_vl_processor = tiny_qwen3_vl(seed=1, tie_word_embeddings=tied), \
            Qwen3VLForConditionalGeneration, tiny_qwen3_vl_processor
    with torch.no_grad():
        model.model.language_model.norm.weight.mul_(1.5)
    out = tmp_path / "safetensors" / "final"
    max_gb = 0.0005  # 500 kB: forces many shards
    path = export_safetensors(model, out, processor=tiny_vl_processor, max_shard_size_gb=max_gb)
    assert path == out
    assert f"Exported safetensors to {out}" in cosmos_log.text

    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 3 and sorted(p.name for p in out.glob("*.safetensors")) == shards
    for shard in shards:
        tensors = [k for k, v in index["weight_map"].items() if v == shard]
        if len(tensors) > 1:  # a single tensor over the limit is allowed its own shard
            assert (out / shard).stat().st_size <= max_gb * GB + 64 * 1024  # + the safetensors header
    names = set(index["weight_map"])
    # each family under its released checkpoints' names (Qwen3-VL keeps transformers 5's module paths)
    prefix = {"qwen2_5_vl": ("model.", ""), "qwen3_vl": ("model.language_model.", "model.")}[family]
    assert f"{prefix[0]}embed_tokens.weight" in names and f"{prefix[1]}visual.patch_embed.proj.weight" in names
    assert ("lm_head.weight" not in names) == tied  # a tied head is saved once, as transformers saves it
    for name in ("config.json", "generation_config.json", "preprocessor_config.json", "chat_template.json",
                 "tokenizer.json", "tokenizer_config.json"):
        assert (out / name).is_file(), name

    loaded = model_class.from_pretrained(out)
    ids = torch.tensor([[9707, 11, 1879, 0, 151644, 872, 198, 100]])
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
    processor = AutoProcessor.from_pretrained(out)
    assert type(processor) is type(tiny_vl_processor)
    assert processor.chat_template == tiny_vl_processor.chat_template
    assert processor.image_processor.size == tiny_vl_processor.image_processor.size
    assert processor.image_processor.patch_size == tiny_vl_processor.image_processor.patch_size
    assert processor.video_processor.size == tiny_vl_processor.video_processor.size


def test_export_dtype_bfloat16(tmp_path: Path) -> None:
    from transformers import Qwen2_5_VLForConditionalGeneration

    model = tiny_qwen2_5_vl(seed=2)
    out = export_safetensors(model, tmp_path / "bf16", dtype="bfloat16")
    loaded = Qwen2_5_VLForConditionalGeneration.from_pretrained(out)
    assert loaded.dtype == torch.bfloat16
    ref = model.model.language_model.layers[1].mlp.down_proj.weight.to(torch.bfloat16)
    assert torch.equal(loaded.model.language_model.layers[1].mlp.down_proj.weight, ref)


VL_VARIANTS = {  # builder and config kwargs; Qwen3-VL with the 2B's tied head and the 8B's untied one
    "qwen2_5_vl": (tiny_qwen2_5_vl, {}),
    "qwen3_vl_tied": (tiny_qwen3_vl, {}),
    "qwen3_vl_untied": (tiny_qwen3_vl, {"tie_word_embeddings": False}),
}


@pytest.mark.parametrize("variant", sorted(VL_VARIANTS))
def test_one_file_export_has_an_index_too(variant: str, tmp_path: Path) -> None:
    """A one-file export loads back with identical logits, and its tensors are exactly what weight sync
    sends in the ``"hf_checkpoint"`` layout (what vLLM loads from the folder = what it gets later)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText

    import cosmos_primitives as cp

    build, kwargs = VL_VARIANTS[variant]
    model = build(seed=3, **kwargs)
    out = export_safetensors(model, tmp_path / "one")  # default ~4 GB shards: a single file
    assert [p.name for p in out.glob("*.safetensors")] == ["model.safetensors"]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    tensors = load_file(str(out / "model.safetensors"))
    assert index["weight_map"] == dict.fromkeys(tensors, "model.safetensors")
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())
    loaded = AutoModelForImageTextToText.from_pretrained(out)
    assert type(loaded) is type(model)
    ids = torch.tensor([[9707, 11, 1879, 0, 151644, 872, 198, 100]])
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
    family = cp.models.get_family(model.config.model_type)
    tied = model.config.tie_word_embeddings
    specs = cp.models.map_names([n for n, _ in model.named_parameters()], "hf_checkpoint", family, tied=tied)
    assert {s.name for s in specs} == set(tensors)
    assert ("lm_head.weight" in tensors) != tied


def test_plain_module_is_written_under_its_state_dict_names(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    model = nn.Sequential(nn.Linear(300, 300), nn.Linear(300, 10))
    out = export_safetensors(model, tmp_path / "plain", max_shard_size_gb=300 * 300 * 4 / GB)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == {"0.weight", "0.bias", "1.weight", "1.bias"}
    # 0.weight fills a shard exactly; the three small tensors after it share the second one
    assert len(set(index["weight_map"].values())) == 2
    assert index["weight_map"]["0.bias"] == index["weight_map"]["1.bias"] != index["weight_map"]["0.weight"]
    loaded = {}
    for shard in set(index["weight_map"].values()):
        loaded.update(load_file(str(out / shard)))
    assert all(torch.equal(loaded[k], v) for k, v in model.state_dict().items())


def test_manager_exports_steps_and_final_with_rotation(tmp_path: Path) -> None:
    model = nn.Linear(4, 4)
    cfg = CheckpointConfig(enable_checkpoint=True, save_mode="sync", save_freq=1, max_keep=2)
    ckpt = CheckpointManager(cfg, tmp_path, model=model)
    for step in (1, 2, 3):
        ckpt.maybe_save(step, force=step == 3)
    final = ckpt.export_final()
    ckpt.close()
    assert sorted(p.name for p in (tmp_path / "safetensors").iterdir()) == ["final", "step_2", "step_3"]
    assert final == tmp_path / "safetensors" / "final" and (final / "model.safetensors.index.json").exists()
    assert final_export_dir(tmp_path) == final  # what readers of a run folder use
    assert [p.name for p in ckpt.checkpoints()] == ["step_2", "step_3"]
