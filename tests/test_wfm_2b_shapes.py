"""Cosmos-Predict2.5-2B at its real shapes: the recipe config matches the published transformer, the
tensors the recipe feeds a transformer of that shape go through its forward on the meta device, and
the text-embedding tool writes what the clip loader reads."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives.algo.flow_step import guided_velocity, to_diffusers_guidance
from cosmos_primitives.data.precompute_text_embeddings import main
from cosmos_primitives.data.text_embeddings import SYSTEM_PROMPT, precompute_clip_folder, reason_text_embeddings
from cosmos_primitives.policy import DiffusionPolicy, check_text_width, text_width
from cosmos_primitives.testing import (
    COSMOS_PREDICT2_5_2B_TRANSFORMER,
    cosmos_predict2_5_2b_transformer,
    save_tiny_qwen2_5_vl,
    write_mp4,
)

diffusers = pytest.importorskip("diffusers")
RECIPE = Path(__file__).resolve().parents[1] / "examples" / "configs" / "cosmos_predict2_5_2b_flowgrpo.toml"


def test_the_2b_recipe_takes_the_published_transformers_text_width():
    cfg = cp.load_config(RECIPE)
    transformer = cosmos_predict2_5_2b_transformer()  # meta: no memory
    assert 2.0e9 < sum(p.numel() for p in transformer.parameters()) < 2.1e9  # "2B"
    # Cosmos-Reason1-7B (Qwen2.5-VL-7B): 28 decoder layers x 3584 features, concatenated
    assert text_width(transformer) == 28 * 3584 == cfg.wfm.data.text_dim
    assert cfg.wfm.data.max_tokens == 512 and cfg.wfm.data.text_encoder == "none"
    assert cfg.policy.dtype == "bfloat16"
    # the Wan2.1 VAE's 16 channels (+ the condition mask going in)
    assert COSMOS_PREDICT2_5_2B_TRANSFORMER["in_channels"] == diffusers.AutoencoderKLWan().config.z_dim + 1
    with pytest.raises(ValueError, match="text_dim = 100352"):
        check_text_width(transformer, 1024)  # the width the recipe used to give


@pytest.fixture
def clip_folder_2b(tmp_path):
    """A clip folder whose embeddings have the 2B model's width (4 tokens each, float16 safetensors)."""
    from safetensors.torch import save_file

    root = tmp_path / "clips"
    for name in ("a", "b"):
        write_mp4(root / "videos" / f"{name}.mp4", num_frames=2, size=(16, 16))
        (root / "metas").mkdir(exist_ok=True)
        (root / "metas" / f"{name}.txt").write_text(f"clip {name}")
        (root / "text_embedding").mkdir(exist_ok=True)
        save_file({"text_embedding": torch.randn(4, 100352, dtype=torch.float16)},
                  str(root / "text_embedding" / f"{name}.safetensors"))
    save_file({"text_embedding": torch.randn(4, 100352, dtype=torch.float16)},
              str(root / "negative_prompt.safetensors"))
    return root


@pytest.mark.slow
def test_every_tensor_the_recipe_feeds_the_2b_transformer_goes_through_it_on_meta(clip_folder_2b):
    cfg = cp.load_config(RECIPE)
    data = msgspec.structs.replace(cfg.wfm.data, path=str(clip_folder_2b),
                                   negative_embedding=str(clip_folder_2b / "negative_prompt.safetensors"))
    w = cfg.wfm
    dtype = cp.policy.resolve_dtype(cfg.policy.dtype)
    transformer = cosmos_predict2_5_2b_transformer(dtype=dtype)
    policy = DiffusionPolicy(transformer, lora=cfg.policy.lora, keep_reference=w.kl_beta > 0)
    assert policy.num_trainable() > 0 and all(p.is_meta for p in policy.trainable_parameters())

    # the prompts as the recipe reads them: [max_tokens, D] float32 per clip, batched and repeated per group
    dataset = cp.data.build_wfm_dataset(data)
    one, mask = dataset.text_embedding(0)
    assert one.shape == (512, 100352) and one.dtype == torch.float32 and int(mask.sum()) == 4
    check_text_width(transformer, one.shape[-1])
    negative = cp.data.negative_prompt_embedding(data, w.negative_prompt)[0]
    assert negative.shape == (1, 512, 100352)
    # 2 prompts x 2 rollouts, stacked as collate_clips + repeat_interleave do (on meta: 822 MB otherwise)
    text = torch.empty(4, *one.shape, dtype=one.dtype, device="meta")
    negative = negative.to("meta")
    del one

    # the latents: what the Wan2.1 VAE makes of a 93-frame 432 x 768 clip (the recipe encodes one to learn it)
    with torch.device("meta"):
        vae = diffusers.AutoencoderKLWan()
    clip = torch.empty(1, 3, data.num_frames, data.height, data.width, device="meta")
    latent_shape = tuple(cp.rollout.encode_video(vae, clip).shape[1:])
    assert latent_shape == (16, 24, 54, 96)  # 16 channels, (93 - 1) / 4 + 1 frames, 8x smaller

    x = torch.empty(4, *latent_shape, device="meta")
    timestep = torch.full((4,), 700.0, device="meta")
    velocity = policy.velocity_fn()
    guided = guided_velocity(velocity, x, timestep, text, negative,
                             to_diffusers_guidance(w.guidance_scale, w.guidance_convention))
    assert guided.shape == x.shape and guided.dtype == torch.float32
    with policy.reference() as reference:  # the KL term's reference: the adapters switched off
        assert reference(x, timestep, text).shape == x.shape


def test_precompute_writes_safetensors_embeddings_the_clip_loader_reads(tmp_path):
    from transformers import AutoTokenizer

    encoder = save_tiny_qwen2_5_vl(tmp_path / "encoder")  # 2 layers x 64 features
    root = tmp_path / "clips"
    for name, caption in (("a", "a red car turns left"), ("b", "a robot arm lifts a cup")):
        write_mp4(root / "videos" / f"{name}.mp4", num_frames=2, size=(16, 16))
        (root / "metas").mkdir(exist_ok=True)
        (root / "metas" / f"{name}.txt").write_text(caption)
    written = main([str(root), "--encoder", str(encoder), "--max-tokens", "32", "--negative-prompt", "blurry",
                    "--device", "cpu", "--batch-size", "2"])
    assert sorted(p.name for p in written) == ["a.safetensors", "b.safetensors", "negative_prompt.safetensors"]
    assert not list(root.rglob("*.pkl")) and not list(root.rglob("*.pickle")) and not list(root.rglob("*.tmp"))

    from safetensors.torch import load_file

    stored = load_file(str(root / "text_embedding" / "a.safetensors"))
    assert list(stored) == ["text_embedding"] and stored["text_embedding"].dtype == torch.float16
    assert stored["text_embedding"].shape == (32, 2 * 64)

    # the values: each layer's hidden states, normalised, side by side (computed here independently)
    model = cp.policy.hf_loading.load_hf_model(encoder, dtype="float32").eval()
    tokenizer = AutoTokenizer.from_pretrained(encoder)
    ids = tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM_PROMPT},
                                         {"role": "user", "content": "a red car turns left"}],
                                        tokenize=True, add_generation_prompt=False, max_length=32,
                                        truncation=True, padding="max_length")
    ids = torch.as_tensor(ids["input_ids"] if not isinstance(ids, list) else ids).reshape(1, -1)
    with torch.no_grad():
        hidden = model.model(input_ids=ids, output_hidden_states=True).hidden_states
    last = hidden[2][0]
    expected = (last - last.mean(-1, keepdim=True)) / (last.std(-1, keepdim=True) + 1e-8)
    torch.testing.assert_close(stored["text_embedding"][:, 64:].float(), expected, atol=2e-3, rtol=1e-3)
    assert torch.equal(reason_text_embeddings(model, tokenizer, ["a red car turns left"], 32)[0].half(),
                       stored["text_embedding"])

    # the clip loader reads them (no text encoder configured) at the width the tool reports
    data = cp.config.WFMDataConfig(kind="clip_folder", path=str(root), num_frames=2, height=16, width=16,
                                   max_tokens=32, text_dim=128, text_encoder="none",
                                   negative_embedding=str(root / "negative_prompt.safetensors"))
    text, mask = cp.data.build_wfm_dataset(data).text_embedding(0)
    assert text.shape == (32, 128) and bool(mask.all())
    np.testing.assert_allclose(text.numpy(), stored["text_embedding"].float().numpy())
    assert cp.data.negative_prompt_embedding(data)[0].shape == (1, 32, 128)

    # existing files are kept unless overwrite
    assert precompute_clip_folder(root, model, tokenizer, max_tokens=32) == []
    assert len(precompute_clip_folder(root, model, tokenizer, max_tokens=32, overwrite=True)) == 2
