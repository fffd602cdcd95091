"""The world-model memory plan (``cosmos_primitives.plan.wfm``): the shape it reads from a diffusers
config against the built model, the Cosmos-Predict2.5-2B FlowGRPO recipe under 80 GB per rank at its
``dp_shard_size`` (and what would not fit), its command line, and the GPU pack's dry run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives.config.policy import LoraConfig
from cosmos_primitives.plan.__main__ import main as plan_main
from cosmos_primitives.plan.wfm import WFMShape, estimate_wfm_memory
from cosmos_primitives.testing import COSMOS_PREDICT2_5_2B_TRANSFORMER, tiny_cosmos_transformer

pytest.importorskip("diffusers")
ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "examples" / "configs" / "cosmos_predict2_5_2b_flowgrpo.toml"
GB80 = 80 * 10**9
GIB = 1 << 30


def _recipe(*overrides: str) -> tuple[cp.Config, WFMShape]:
    cfg = cp.load_config(RECIPE, list(overrides))
    return cfg, WFMShape.from_diffusers_config(COSMOS_PREDICT2_5_2B_TRANSFORMER, lora=cfg.policy.lora)


def test_shape_counts_what_the_built_model_has():
    lora = LoraConfig(r=4, lora_alpha=8.0, target_modules=["to_q", "to_k", "to_v", "to_out.0"])
    model = tiny_cosmos_transformer()
    shape = WFMShape.from_diffusers_config(dict(model.config), lora=lora)
    assert shape.total_params == sum(p.numel() for p in model.parameters())
    policy = cp.policy.DiffusionPolicy(model, lora=lora)
    assert shape.trainable_params == policy.num_trainable()  # peft's adapters, counted from the config alone
    assert (shape.blocks, shape.hidden, shape.text_dim, shape.patch) == (2, 32, 32, (1, 2, 2))
    # self-attention q / k / v / out and cross-attention q / out take the block's hidden states
    assert shape.lora_video_layers == 6


def test_shape_of_cosmos_predict2_5_2b():
    _, shape = _recipe()
    assert shape.total_params == pytest.approx(2.06e9, rel=0.01) and shape.blocks == 28 and shape.hidden == 2048
    # r 32 on to_q / to_k / to_v / to_out.0 of both attentions (cross-attention keys / values read 1,024-wide text)
    assert shape.trainable_params == 28 * 32 * (4 * 4096 + 2 * 4096 + 2 * 3072)
    assert shape.text_dim == 100352
    assert shape.latent_shape(93, 432, 768) == (16, 24, 54, 96)  # the Wan2.1 VAE: 4x in time, 8x in space


def test_the_2b_flowgrpo_recipe_fits_80gb_per_rank_at_its_dp_shard_size():
    cfg, shape = _recipe()
    ranks = cfg.policy.parallelism.dp_shard_size
    plan = estimate_wfm_memory(cfg, shape, world_size=ranks, device_memory=GB80)
    print(plan.report(GB80))
    assert plan.total < 70 * GIB < GB80 and "WARNING" not in plan.report(GB80)
    # the formula terms, exactly
    assert plan.weights == -(-4 * shape.total_params // ranks)  # float32, sharded over 8
    assert plan.tokens == 24 * 27 * 48 and plan.micro_batch == cfg.train.train_policy.mini_batch
    assert plan.text == 8 * 512 * 100352 * 4  # 1 prompt x 8 rollouts per rank, float32
    assert plan.trajectory == 8 * 21 * 16 * 24 * 54 * 96 * 4  # every one of the 20 steps' latents
    # the update's memory grows with the micro-batch, not with the mini-batch
    moments = [estimate_wfm_memory(cp.load_config(RECIPE, [f"train.train_policy.mini_batch={m}"]), shape,
                                   world_size=ranks).train_moment for m in (1, 2, 4)]
    assert moments[0] < moments[1] < moments[2]
    assert moments[2] - moments[1] == pytest.approx(2 * (moments[1] - moments[0]), rel=0.01)


def test_without_checkpointing_one_sample_alone_does_not_fit():
    cfg, shape = _recipe("policy.model_gradient_checkpointing=false", "train.train_policy.mini_batch=1")
    plan = estimate_wfm_memory(cfg, shape, world_size=8, device_memory=GB80)
    # 28 blocks x 99 KB per token x 31,104 tokens of one sample: above 80 GB before anything else
    assert plan.train_moment > GB80 and "WARNING" in plan.report(GB80)
    with_checkpointing = estimate_wfm_memory(_recipe("train.train_policy.mini_batch=1")[0], shape, world_size=8)
    assert with_checkpointing.train_moment < 0.2 * plan.train_moment


def test_plan_command_plans_the_recipe_from_a_transformer_config(tmp_path: Path, capsys: pytest.CaptureFixture):
    config = tmp_path / "transformer_config.json"
    config.write_text(json.dumps({"_class_name": "CosmosTransformer3DModel", **COSMOS_PREDICT2_5_2B_TRANSFORMER}))
    assert plan_main([str(RECIPE), "--transformer-config", str(config), "--gpu-memory-gb", "80"]) == 0
    out = capsys.readouterr().out
    assert "on 8 GPU(s)" in out and "world-model RL" in out and "trained-step backward" in out
    assert plan_main([str(RECIPE), "policy.model_gradient_checkpointing=false", "train.train_policy.mini_batch=1",
                      "--transformer-config", str(config)]) == 1
    assert "WARNING: the estimated peak" in capsys.readouterr().out
    assert plan_main([str(RECIPE), "--mode", "wfm"]) == 2  # /path/to/... is no diffusers folder
    assert "transformer/config.json" in capsys.readouterr().err


def test_plan_command_reads_a_diffusers_folder(tmp_path: Path, capsys: pytest.CaptureFixture):
    folder = tmp_path / "model"
    tiny_cosmos_transformer().save_pretrained(folder / "transformer")
    cp.testing.tiny_wan_vae().save_pretrained(folder / "vae")
    config = ROOT / "examples" / "configs" / "wfm_flowgrpo_tiny.toml"
    assert plan_main([str(config), f"policy.model_name_or_path={folder}", "policy.lora.target_modules=[\"to_q\"]",
                      "--gpus", "1"]) == 0
    out = capsys.readouterr().out
    assert "world-model RL" in out and "scaled from the measured" in out  # a 32-wide float32 model


@pytest.mark.filterwarnings("ignore:FSDP2-wrapped module")  # the transformer's output is a view of its last op
def test_gpu_pack_part_dry_runs_on_the_cpu():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_wfm_memory import flowgrpo_memory_2b

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = flowgrpo_memory_2b(True)
    finally:
        torch.set_num_threads(threads)
    figures = result["figures"]
    assert figures["rollout_s"] > 0
    for variant in ("checkpointing", "no_checkpointing"):
        assert figures[f"{variant}_oom"] is False and figures[f"{variant}_train_s"] > 0
        assert figures[f"{variant}_plan_gib"] > 0
