"""The SFT and colocated GRPO recipes on a tiny random Qwen3-VL (Cosmos-Reason2's family), run as users
run them (one ``python`` process each, the tiny configs with only model, data and sizes overridden): the
Qwen3-VL twins of the Qwen2.5-VL recipe runs. The SFT run is also the learning check: its loss falls."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives.testing.demo_assets import ensure_demo_assets
from cosmos_primitives.testing.recipe_runs import finish, launch_recipe, only_run_dir

REPO = Path(__file__).resolve().parents[1]
SFT_CONFIG = REPO / "examples" / "configs" / "sft_tiny.toml"
GRPO_CONFIG = REPO / "examples" / "configs" / "grpo_tiny.toml"
# 2 x 2 merged 16-px patches per frame (the tiny config's 3136 px is Qwen2.5-VL's 2 x 2 of 14-px patches)
FRAME_PIXELS = 4 * 32 * 32


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3-VL + processor, written by the demo assets as ``demo_model = "tiny_qwen3_vl"``."""
    path = tmp_path_factory.mktemp("qwen3_vl") / "model"
    ensure_demo_assets(cp.load_config(SFT_CONFIG, [f"policy.model_name_or_path=demo:{path}",
                                                   "custom.demo_model=tiny_qwen3_vl",
                                                   "train.train_policy.dataset.name=unused"]))
    return path


def test_sft_recipe_learns_on_tiny_qwen3_vl_video(model_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "video_qa"
    ensure_demo_assets(cp.load_config(SFT_CONFIG, [f"policy.model_name_or_path={model_dir}",
                                                   f"train.train_policy.dataset.name=demo:{data}",
                                                   "custom.demo_items=8"]))
    overrides = [f"policy.model_name_or_path={model_dir}", f"train.train_policy.dataset.name={data}",
                 f"train.train_policy.dataset.max_pixels={FRAME_PIXELS}",
                 f"train.train_policy.dataset.min_pixels={FRAME_PIXELS}", f"train.output_dir={tmp_path / 'runs'}",
                 "train.epoch=3", "train.ckpt.enable_checkpoint=false", "train.ckpt.export_safetensors=true",
                 "train.optm_warmup_steps=0"]
    log = tmp_path / "sft.log"
    finish(launch_recipe("examples/sft.py", SFT_CONFIG, overrides, log, cwd=REPO), log)
    run_dir = only_run_dir(tmp_path / "runs")
    records = cp.logging.read_metrics(run_dir)
    assert len(records) == 6  # 3 epochs x 8 clips / 4 per step: every video sample encoded and trained
    assert all(r["bad_samples"] == 0 and r["tokens"] > 0 for r in records)
    losses = [r["loss"] for r in records]
    assert sum(losses[-2:]) / 2 < sum(losses[:2]) / 2 - 0.5, f"loss did not fall: {losses}"

    from transformers import Qwen3VLForConditionalGeneration

    exported = Qwen3VLForConditionalGeneration.from_pretrained(run_dir / "safetensors" / "final")
    initial = Qwen3VLForConditionalGeneration.from_pretrained(model_dir)
    trained = exported.model.language_model.layers[0].mlp.up_proj.weight
    assert not torch.equal(trained, initial.model.language_model.layers[0].mlp.up_proj.weight)


def test_colocated_grpo_recipe_runs_on_tiny_qwen3_vl(model_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "colour_mcq" / "train.jsonl"
    ensure_demo_assets(cp.load_config(GRPO_CONFIG, [f"policy.model_name_or_path={model_dir}",
                                                    f"train.train_policy.dataset.name=demo:{data}",
                                                    "custom.demo_items=8"]))
    overrides = [f"policy.model_name_or_path={model_dir}", f"train.train_policy.dataset.name={data}",
                 f"train.output_dir={tmp_path / 'runs'}", "grpo.rollout_batch_size=2",
                 "grpo.num_samples_per_prompt=4", "rollout.max_response_length=8", "train.max_steps=2",
                 "train.optm_warmup_steps=0", "train.ckpt.export_safetensors=false"]
    log = tmp_path / "grpo.log"
    finish(launch_recipe("examples/grpo_vlm.py", GRPO_CONFIG, overrides, log, cwd=REPO), log)
    records = cp.logging.read_metrics(only_run_dir(tmp_path / "runs"))
    assert [r["step"] for r in records] == [1, 2]
