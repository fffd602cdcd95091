"""The world-model RL recipes: the TOMLs load with the values REFERENCE.md gives, and a two-step
run of examples/wfm_rl.py from a diffusers folder exercises the options the tiny recipes leave off
(guidance in the Cosmos convention, the KL to the reference, two mini-batches, the weight export)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives.logging import metric_series, read_metrics
from cosmos_primitives.parallel.mesh import resolve_sizes
from cosmos_primitives.testing import (
    tiny_cosmos_transformer,
    tiny_flow_scheduler,
    tiny_unipc_flow_scheduler,
    tiny_wan_transformer,
    tiny_wan_vae,
)

diffusers = pytest.importorskip("diffusers")
ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "examples" / "configs"


def test_cosmos_predict_recipe_has_the_reference_values():
    cfg = cp.load_config(CONFIGS / "cosmos_predict2_5_2b_flowgrpo.toml")
    w, lora = cfg.wfm, cfg.policy.lora
    assert (lora.r, lora.lora_alpha) == (32, 64.0)
    assert lora.target_modules == ["to_q", "to_k", "to_v", "to_out.0"]
    assert cfg.policy.dtype == "bfloat16" and cfg.policy.model_gradient_checkpointing
    assert w.num_inference_steps == 20 and w.guidance_scale == 4.5 and w.guidance_convention == "diffusers"
    assert 1e-4 <= w.clip_range <= 1e-3 and 0.004 <= w.kl_beta <= 0.04 and w.adv_clip_max == 5.0
    assert 4 <= w.num_samples_per_prompt <= 24 and w.sampler.noise_level == 0.7
    assert 1e-4 <= cfg.train.optm_lr <= 3e-4 and cfg.train.optm_grad_norm_clip == 1.0
    assert (w.data.num_frames, w.data.height, w.data.width) == (93, 432, 768)
    ddrl = cp.load_config(CONFIGS / "cosmos_predict2_5_2b_flowgrpo.toml", overrides=[
        "wfm.algorithm=ddrl", "wfm.data_beta=0.01", "wfm.kl_beta=0", "wfm.clip_range=1e-4", "train.optm_lr=1e-5"])
    assert ddrl.wfm.algorithm == "ddrl" and ddrl.wfm.data_beta == 0.01


@pytest.mark.parametrize("name", ["wfm_flowgrpo_tiny.toml", "wfm_ddrl_tiny.toml", "wfm_nft_tiny.toml"])
def test_tiny_recipes_load(name):
    cfg = cp.load_config(CONFIGS / name)
    assert cfg.policy.model_name_or_path == "tiny" and cfg.policy.dtype == "float32" and cfg.wfm.start_reward_server
    assert cfg.train.ckpt.enable_checkpoint and cfg.train.ckpt.save_freq > 0
    assert [t.name for t in cfg.remote_reward.rewards] == ["brightness"]


# the parallelism snippet of the world-model guide (shared/seeds/003_dc13d0a521ed8848.txt), as written there
GUIDE_PARALLELISM = """
[model]
fsdp_shard_size = 8
dp_replicate_size = 4

[model_parallel]
context_parallel_size = 2
"""


def test_world_model_guide_parallelism_snippet_loads(tmp_path):
    """``[model_parallel] context_parallel_size`` is the world-model recipe's cp size (the mesh it builds
    is [policy.parallelism]'s), next to the guide's HSDP sizes; it fits a 64-rank job."""
    path = tmp_path / "guide.toml"
    path.write_text((CONFIGS / "wfm_flowgrpo_tiny.toml").read_text() + GUIDE_PARALLELISM)
    par = cp.load_config(path).policy.parallelism
    assert (par.cp_size, par.dp_shard_size, par.dp_replicate_size) == (2, 8, 4)
    assert resolve_sizes(par, 64) == {"pp": 1, "dp_replicate": 4, "dp_shard": 8, "cp": 2, "tp": 1}
    path.write_text(path.read_text() + "\n[policy.parallelism]\ncp_size = 4\n")
    with pytest.raises(cp.ConfigError, match=r"'model_parallel\.context_parallel_size' = 2 and "
                                             r"'policy\.parallelism\.cp_size' = 4"):
        cp.load_config(path)


def test_unknown_wfm_key_names_the_closest_one():
    with pytest.raises(cp.ConfigError, match="noise_level"):
        cp.load_config(CONFIGS / "wfm_flowgrpo_tiny.toml", overrides=["wfm.sampler.noise_levl=0.5"])


def write_folder(root, transformer, scheduler):
    """A diffusers model folder: ``transformer/``, the tiny Wan ``vae/``, ``scheduler/``."""
    transformer.save_pretrained(root / "transformer")
    tiny_wan_vae(seed=0).save_pretrained(root / "vae")
    scheduler.save_pretrained(root / "scheduler")
    return root


def load_example():
    """``examples/wfm_rl.py`` as a module."""
    spec = importlib.util.spec_from_file_location("wfm_rl_example", ROOT / "examples" / "wfm_rl.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def run_recipe(args):
    """``examples/wfm_rl.py``'s ``main(args)`` in this process with one torch thread; its run directory."""
    example = load_example()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return example.main(args)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture
def diffusers_folder(tmp_path):
    return write_folder(tmp_path / "tiny-wan-diffusers", tiny_wan_transformer(seed=0), tiny_flow_scheduler())


def test_recipe_runs_from_a_diffusers_folder_with_kl_guidance_and_minibatches(diffusers_folder, tmp_path):
    run_dir = run_recipe([
        "--config", str(CONFIGS / "wfm_flowgrpo_tiny.toml"),
        f"policy.model_name_or_path={diffusers_folder}", f"train.output_dir={tmp_path / 'out'}", "logging.logger=[]",
        "train.max_steps=2", "wfm.num_samples_per_prompt=4", "wfm.num_inference_steps=4",
        "wfm.eval_num_inference_steps=0", "wfm.sampler.sde_window_size=0", "wfm.train_step_fraction=0.5",
        "wfm.guidance_convention=cosmos", "wfm.guidance_scale=1.5", "wfm.kl_beta=0.04", "wfm.num_minibatches=2",
        "train.ckpt.enable_checkpoint=true", "train.ckpt.export_safetensors=true",
    ])
    records = read_metrics(run_dir)
    assert metric_series(records, "reward_mean")[0] == [1, 2]
    resolved = cp.load_config(run_dir / "config.toml")  # the resolved config, overrides included
    assert (resolved.wfm.guidance_scale, resolved.wfm.num_minibatches) == (1.5, 2)
    kl = metric_series(records, "kl")[1]
    assert kl[0] >= 0.0 and kl[1] > 0.0  # the adapter moved away from the reference after the first update
    from safetensors.torch import load_file

    weights = load_file(str(run_dir / "trained_weights.safetensors"))
    assert weights and all("lora_" in name for name in weights)
    # the export: a diffusers folder whose transformer (LoRA merged) and lora/ (on the base model) both
    # give the trained policy's velocity; the trained policy = base + the adapters of trained_weights
    final = run_dir / "safetensors" / "final"
    assert {"model_index.json", "transformer", "lora", "vae", "scheduler"} <= {p.name for p in final.iterdir()}
    policy = cp.policy.DiffusionPolicy(tiny_wan_transformer(seed=0), lora=resolved.policy.lora)
    missing = policy.transformer.load_state_dict(weights, strict=False)
    assert not missing.unexpected_keys
    x, text = torch.randn(2, 4, 1, 8, 8), torch.randn(2, 8, 32)
    timestep = torch.tensor([800.0, 300.0])
    with torch.no_grad():
        trained = policy.velocity_fn()(x, timestep, text)
        merged = cp.models.flow_transformers.flow_velocity_fn(
            diffusers.WanTransformer3DModel.from_pretrained(final, subfolder="transformer"))(x, timestep, text)
        base = tiny_wan_transformer(seed=0)
        untrained = cp.models.flow_transformers.flow_velocity_fn(base)(x, timestep, text)
        base.load_lora_adapter(str(final / "lora"), prefix="transformer", use_safetensors=True)
        adapted = cp.models.flow_transformers.flow_velocity_fn(base)(x, timestep, text)
    assert (trained - untrained).abs().max() > 1e-4  # training moved the velocity
    torch.testing.assert_close(merged, trained, atol=1e-5, rtol=0)
    torch.testing.assert_close(adapted, trained, atol=1e-5, rtol=0)


@pytest.fixture
def cosmos_folder(tmp_path):
    """A diffusers folder laid out like Cosmos-Predict2.5-2B's: Cosmos transformer, Wan VAE, UniPC scheduler."""
    return write_folder(tmp_path / "tiny-cosmos-diffusers", tiny_cosmos_transformer(seed=0),
                        tiny_unipc_flow_scheduler())


@pytest.mark.parametrize("recipe", ["wfm_flowgrpo_tiny.toml", "wfm_ddrl_tiny.toml"])
def test_recipe_runs_a_cosmos_predict2_5_folder(cosmos_folder, tmp_path, recipe):
    run_dir = run_recipe([
        "--config", str(CONFIGS / recipe), f"policy.model_name_or_path={cosmos_folder}",
        f"train.output_dir={tmp_path / 'out'}", "logging.logger=[]", "train.max_steps=2",
        "wfm.num_samples_per_prompt=4", "wfm.num_inference_steps=4", "wfm.eval_num_inference_steps=0",
        "wfm.sampler.sde_window_size=0", "wfm.kl_beta=0.04", "train.ckpt.enable_checkpoint=true",
    ])
    records = read_metrics(run_dir)
    assert metric_series(records, "reward_mean")[0] == [1, 2]
    kl = metric_series(records, "kl")[1]
    assert kl[1] > 0.0  # the LoRA adapters on the Cosmos attention moved away from the reference
    from safetensors.torch import load_file

    weights = load_file(str(run_dir / "trained_weights.safetensors"))
    assert weights and all("lora_" in name for name in weights)
    assert any(name.startswith("transformer_blocks.0.attn1.to_q") for name in weights)
