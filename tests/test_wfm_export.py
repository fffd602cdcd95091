"""The diffusers export of a trained flow transformer (``cp.checkpoint.export_diffusers``): the folder
loads with the transformer's class, the pipeline and diffusers' LoRA loader, and gives the trained
policy's velocity."""

from __future__ import annotations

import json

import pytest
import torch

from cosmos_primitives.checkpoint import export_diffusers
from cosmos_primitives.config.policy import LoraConfig
from cosmos_primitives.models.flow_transformers import flow_velocity_fn
from cosmos_primitives.policy import DiffusionPolicy
from cosmos_primitives.testing import tiny_cosmos_transformer, tiny_flow_scheduler, tiny_wan_transformer, tiny_wan_vae

diffusers = pytest.importorskip("diffusers")

# float32 on CPU: merging s * B A into W reorders the sums, so outputs agree to rounding, not bitwise
ATOL = 1e-5
BUILDERS = {"wan": tiny_wan_transformer, "cosmos": tiny_cosmos_transformer}


def trained_policy(kind: str, lora: bool) -> DiffusionPolicy:
    """A tiny policy whose trainable weights moved away from the base model's (as after training)."""
    config = LoraConfig(r=4, lora_alpha=8.0, target_modules=["to_q", "to_v", "proj_out"]) if lora else None
    policy = DiffusionPolicy(BUILDERS[kind](seed=0), lora=config)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=generator))
    return policy


def velocity_of(transformer, policy: DiffusionPolicy):
    x = torch.randn(2, 4, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    text = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(3))
    timestep = torch.tensor([700.0, 250.0])
    with torch.no_grad():
        return flow_velocity_fn(transformer, num_train_timesteps=policy.num_train_timesteps)(x, timestep, text)


@pytest.mark.parametrize("kind", ["wan", "cosmos"])
def test_lora_export_loads_with_the_transformer_class_and_the_lora_loader(kind, tmp_path, caplog):
    policy = trained_policy(kind, lora=True)
    expected = velocity_of(policy.transformer, policy)
    cls = type(BUILDERS[kind](seed=0))
    base_velocity = velocity_of(BUILDERS[kind](seed=0), policy)
    assert (expected - base_velocity).abs().max() > 100 * ATOL  # the adapters matter: the checks below can fail

    with caplog.at_level("INFO"):
        out = export_diffusers(policy.transformer, tmp_path / "final",
                               components={"vae": tiny_wan_vae(seed=0), "scheduler": tiny_flow_scheduler()})
    assert f"Exported diffusers folder to {out}" in caplog.text

    merged = cls.from_pretrained(out, subfolder="transformer")
    assert not any("lora" in name or "base_layer" in name for name in merged.state_dict())
    torch.testing.assert_close(velocity_of(merged, policy), expected, atol=ATOL, rtol=0)

    # the adapters alone, onto the base model with diffusers' own LoRA loader
    base = BUILDERS[kind](seed=0)
    base.load_lora_adapter(str(out / "lora"), prefix="transformer", use_safetensors=True)
    torch.testing.assert_close(velocity_of(base, policy), expected, atol=ATOL, rtol=0)
    adapter_config = json.loads((out / "lora" / "adapter_config.json").read_text())
    assert (adapter_config["r"], adapter_config["lora_alpha"]) == (4, 8.0)

    index = json.loads((out / "model_index.json").read_text())
    assert index["transformer"] == ["diffusers", cls.__name__] and index["text_encoder"] == [None, None]
    assert index["vae"] == ["diffusers", "AutoencoderKLWan"]


def test_the_wan_export_loads_as_a_pipeline(tmp_path):
    policy = trained_policy("wan", lora=True)
    out = export_diffusers(policy.transformer, tmp_path / "final",
                           components={"vae": tiny_wan_vae(seed=0), "scheduler": tiny_flow_scheduler()})
    # the text encoder is not trained nor copied: the user passes theirs (None: prompt embeddings only)
    pipe = diffusers.DiffusionPipeline.from_pretrained(out, text_encoder=None, tokenizer=None)
    assert type(pipe).__name__ == "WanPipeline"
    assert type(pipe.scheduler).__name__ == "FlowMatchEulerDiscreteScheduler"
    torch.testing.assert_close(velocity_of(pipe.transformer, policy), velocity_of(policy.transformer, policy),
                               atol=ATOL, rtol=0)


def test_full_fine_tuning_exports_the_weights_without_an_adapter_folder(tmp_path):
    policy = trained_policy("wan", lora=False)
    out = export_diffusers(policy.transformer, tmp_path / "final", dtype="bfloat16")
    assert not (out / "lora").exists()
    from safetensors.torch import load_file

    stored = load_file(str(next((out / "transformer").glob("diffusion_pytorch_model-*.safetensors"))))
    assert {v.dtype for v in stored.values()} == {torch.bfloat16}
    loaded = diffusers.WanTransformer3DModel.from_pretrained(out, subfolder="transformer", torch_dtype=torch.bfloat16)
    for name, value in policy.transformer.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value.to(torch.bfloat16)), name
