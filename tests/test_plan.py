"""The memory plan (``cosmos_primitives.plan``): against the published requirements of the seed guides,
against peak memory measured on the CPU, and its command line.

Seed requirements (cosmos-rl's Cosmos-Reason1 guides): 7B SFT with FSDP over 2 GPUs of 80 GB
("SFT training requires using a minimum of 2 GPUs ... for 7B ... 80GB"); GRPO on 4 GPUs, the policy
FSDP over 2 of them, the rollout (TP 2) on the other 2. The model is Cosmos-Reason1-7B's
architecture, Qwen2.5-VL-7B (``tests/data/qwen2_5_vl_7b_config.json``: 8.29 B parameters, 7.62 B
trainable with the vision tower frozen as the recipe does).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import cosmos_primitives as cp
from cosmos_primitives.config.policy import ParallelismConfig, PolicyConfig
from cosmos_primitives.config.root import Config
from cosmos_primitives.config.train import TrainConfig
from cosmos_primitives.plan import ModelShape, estimate_memory
from cosmos_primitives.plan.__main__ import main as plan_main

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "examples" / "configs"
VL_7B = json.loads((Path(__file__).parent / "data" / "qwen2_5_vl_7b_config.json").read_text())
GB80 = 80 * 10**9


@pytest.fixture(scope="module")
def shape_7b() -> ModelShape:
    return ModelShape.from_hf_config(VL_7B, freeze_patterns=[r"^model\.visual\."])


def test_shape_of_the_7b_model(shape_7b: ModelShape) -> None:
    assert shape_7b.total_params == pytest.approx(8.29e9, rel=0.01)
    assert shape_7b.trainable_params == pytest.approx(7.62e9, rel=0.01)
    assert (shape_7b.layers, shape_7b.hidden, shape_7b.kv_dim, shape_7b.vocab) == (28, 3584, 512, 152064)
    # embed_tokens + untied lm_head (2 x 152,064 x 3,584) and the vision patch embedding / merger
    assert shape_7b.root_params == pytest.approx(2 * 152064 * 3584, rel=0.05)


def test_7b_sft_fits_on_two_80gb_gpus_and_not_on_one(shape_7b: ModelShape) -> None:
    plans = {}
    for gpus in (1, 2):
        cfg = cp.load_config(CONFIGS / "cosmos_reason1_7b_sft.toml", [f"policy.parallelism.dp_shard_size={gpus}"])
        plans[gpus] = estimate_memory(cfg, shape_7b, world_size=gpus, device_memory=GB80)
    two, one = plans[2], plans[1]
    assert two.parameters == pytest.approx(8.29e9 * 4 / 2, rel=0.01)  # float32 master weights, halved
    assert two.optimizer == pytest.approx(7.62e9 * 8 / 2, rel=0.01)
    assert 60e9 < two.total < GB80 < one.total
    assert "WARNING" in one.report(GB80) and "WARNING" not in two.report(GB80)


def test_7b_grpo_policy_fits_on_two_of_four_80gb_gpus(shape_7b: ModelShape) -> None:
    """The seed's 4-GPU GRPO: policy FSDP 2 (these figures), rollout TP 2 on the other two GPUs."""
    def plan(gpus: int, *overrides: str):
        cfg = cp.load_config(CONFIGS / "cosmos_reason1_7b_grpo.toml",
                             [f"policy.parallelism.dp_shard_size={gpus}", *overrides])
        return estimate_memory(cfg, shape_7b, world_size=gpus, mode="disaggregated", device_memory=GB80)

    assert plan(2).total < GB80 < plan(1).total
    assert plan(2).rollout_engine == 0
    # a KL reference adds the sharded bf16 copy: 8.29 B x 2 bytes / 2
    with_kl = plan(2, "grpo.kl_beta=0.01")
    assert with_kl.reference == pytest.approx(8.29e9, rel=0.01)
    # colocated on 4 GPUs: vLLM's gpu_memory_utilization share is on every trainer GPU
    cfg = cp.load_config(CONFIGS / "cosmos_reason1_7b_grpo.toml")
    colocated = estimate_memory(cfg, shape_7b, world_size=4, mode="colocated", device_memory=GB80)
    assert colocated.rollout_engine == int(0.5 * GB80)


def test_memory_options_lower_the_plan(shape_7b: ModelShape) -> None:
    cfg = cp.load_config(CONFIGS / "cosmos_reason1_7b_sft.toml", ["policy.parallelism.dp_shard_size=1"])
    base = estimate_memory(cfg, shape_7b, world_size=1, device_memory=GB80)
    offload = estimate_memory(cp.load_config(CONFIGS / "cosmos_reason1_7b_sft.toml",
                                             ["policy.parallelism.dp_shard_size=1", "train.fsdp_offload=true"]),
                              shape_7b, world_size=1, device_memory=GB80)
    bf16 = estimate_memory(cp.load_config(CONFIGS / "cosmos_reason1_7b_sft.toml",
                                          ["policy.parallelism.dp_shard_size=1", "train.master_dtype=bfloat16"]),
                           shape_7b, world_size=1, device_memory=GB80)
    assert offload.parameters == offload.optimizer == 0 and offload.host == pytest.approx(16 * 7.62e9 + 4 * 0.68e9,
                                                                                          rel=0.02)
    assert offload.total < GB80 < base.total  # 7B SFT on one 80 GB GPU needs offload
    assert bf16.parameters == base.parameters // 2 and bf16.optimizer == base.optimizer


def test_plan_command_prints_the_plan_and_warns(tiny_qwen2_dir: Path, capsys: pytest.CaptureFixture) -> None:
    args = [str(CONFIGS / "sft_tiny.toml"), f"policy.model_name_or_path={tiny_qwen2_dir}", "--gpus", "1"]
    assert plan_main(args) == 0
    out = capsys.readouterr().out
    assert "memory plan per GPU" in out and "optimizer state" in out and "WARNING" not in out
    assert plan_main([*args, "--gpu-memory-gb", "0.01"]) == 1
    assert "WARNING: the estimated peak" in capsys.readouterr().out
    assert plan_main([str(CONFIGS / "sft_tiny.toml"), "train.no_such_key=1"]) == 2


# --- against peak memory measured on the CPU (cosmos_primitives.testing.memory) ---------------------

SMALL = {"vocab_size": 32000, "hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": True}
TOKENS = 128
MEASURED = {  # [train] options, model_gradient_checkpointing
    "plain": ({}, False),
    "checkpointing": ({}, True),
    "bf16_master": ({"master_dtype": "bfloat16"}, False),
}


def small_config(name: str) -> Config:
    train_options, checkpointing = MEASURED[name]
    return Config(policy=PolicyConfig(dtype="bfloat16", model_gradient_checkpointing=checkpointing,
                                      parallelism=ParallelismConfig(dp_shard_size=2), logprob_chunk_size=128),
                  train=TrainConfig(**train_options))


def _measure(name: str) -> int:
    from cosmos_primitives.testing.memory import measure_training_peak

    cfg = small_config(name)
    return measure_training_peak(SMALL, cfg.policy, cfg.train, TOKENS)["peak"]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MEASURED))
def test_estimate_within_25_percent_of_the_measured_cpu_peak(name: str) -> None:
    measured = max(cp.testing.run_distributed(_measure, 2, args=(name,), timeout_s=900))
    estimate = estimate_memory(small_config(name), ModelShape.from_hf_config(SMALL), world_size=2, device="cpu",
                               tokens=TOKENS)
    error = (estimate.total - measured) / measured
    print(f"{name}: measured {measured / 2**20:.1f} MiB, estimated {estimate.total / 2**20:.1f} MiB ({error:+.1%})")
    assert abs(error) <= 0.25
