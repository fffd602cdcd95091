"""Tiny models with random weights, built from configs: Qwen2.5-VL, Qwen3-VL, Qwen2, Qwen3, and a Wan-style flow
transformer with its VAE. Small enough for CPU tests, same code paths as the real ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from cosmos_primitives.testing.tokenizer import (
    IMAGE_PAD_ID,
    VIDEO_PAD_ID,
    VISION_END_ID,
    VISION_START_ID,
    qwen2_5_vl_chat_template,
    qwen3_vl_chat_template,
    qwen_tokenizer,
)
from cosmos_primitives.utils.extras import require

QWEN_VOCAB_SIZE = 151936
TINY_PIXELS = 28 * 28  # one merged 2x2 patch of 14 px
TINY_QWEN3_VL_PIXELS = 32 * 32  # one merged 2x2 patch of 16 px


def _mrope_section(head_dim: int) -> list[int]:
    """mRoPE splits the rotary half-dimension into (temporal, height, width) sections."""
    half = head_dim // 2
    return [half - 2 * (half // 3), half // 3, half // 3]


def _vl_vision_fields(vision_depth: int, hidden_size: int) -> dict[str, Any]:
    """Vision-tower sizes shared by the tiny VL families (32 wide, 2 heads, 2x2 merge, 2-frame patches)."""
    return dict(depth=vision_depth, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=hidden_size,
                spatial_merge_size=2, temporal_patch_size=2)


def _vl_token_ids() -> dict[str, int]:
    return dict(image_token_id=IMAGE_PAD_ID, video_token_id=VIDEO_PAD_ID, vision_start_token_id=VISION_START_ID,
                vision_end_token_id=VISION_END_ID)


def _with_initializer_range(config: Any, initializer_range: float | None) -> Any:
    if initializer_range is not None:
        # the top-level model initialises all of its modules with the top config's std when it has one
        config.initializer_range = initializer_range
        config.text_config.initializer_range = initializer_range
        config.vision_config.initializer_range = initializer_range
    return config


def tiny_qwen2_5_vl_config(hidden_size: int = 64, num_layers: int = 2, vision_depth: int = 2,
                           initializer_range: float | None = None) -> Any:
    """A Qwen2.5-VL config of a few million parameters (mostly the 151,936-token embedding).

    ``initializer_range``: std of the random weights (every module, vision tower included).
    ``None`` keeps transformers' 0.02, which is right for a 3,584-wide model but leaves a tiny one
    in a slow-learning regime: it only starts to use the image after long, seed-dependent plateaus.
    Models meant to learn (demos, learning tests) use ``hidden_size ** -0.5``.
    """
    from transformers import Qwen2_5_VLConfig

    rope = {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": _mrope_section(hidden_size // 4)}
    config = Qwen2_5_VLConfig(
        text_config={**_text_config_fields(hidden_size, num_layers), "rope_parameters": rope},
        vision_config={**_vl_vision_fields(vision_depth, hidden_size), "patch_size": 14, "window_size": 112,
                       "fullatt_block_indexes": [vision_depth - 1]},
        tie_word_embeddings=True,
        **_vl_token_ids(),
    )
    return _with_initializer_range(config, initializer_range)


def tiny_qwen2_5_vl(seed: int = 0, **config_kwargs: Any) -> Any:
    """A randomly initialised tiny ``Qwen2_5_VLForConditionalGeneration`` (float32, eval mode off)."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(seed)
    return _with_generation_ids(Qwen2_5_VLForConditionalGeneration(tiny_qwen2_5_vl_config(**config_kwargs)))


def tiny_qwen3_vl_config(hidden_size: int = 64, num_layers: int = 2, vision_depth: int = 2,
                         initializer_range: float | None = None, tie_word_embeddings: bool = True) -> Any:
    """A Qwen3-VL config (Cosmos-Reason2's family) of a few million parameters.

    Same text sizes as :func:`tiny_qwen2_5_vl_config`, with Qwen3-VL's own parts: interleaved mRoPE
    (``mrope_interleaved``), explicit ``head_dim``, a vision tower of 16-px patches with learned
    position embeddings and one deepstack layer (vision block 0's features added to the decoder's
    first layer). ``tie_word_embeddings``: True as Cosmos-Reason2-2B, False as -8B (a separate
    ``lm_head``). ``initializer_range`` as for Qwen2.5-VL.
    """
    from transformers import Qwen3VLConfig

    head_dim = hidden_size // 4
    rope = {"rope_type": "default", "rope_theta": 5_000_000.0, "mrope_section": _mrope_section(head_dim),
            "mrope_interleaved": True}
    text = {**_text_config_fields(hidden_size, num_layers), "head_dim": head_dim, "rope_parameters": rope,
            "tie_word_embeddings": tie_word_embeddings}
    config = Qwen3VLConfig(
        text_config=text,
        vision_config={**_vl_vision_fields(vision_depth, hidden_size), "patch_size": 16,
                       "num_position_embeddings": 64, "deepstack_visual_indexes": [0]},
        tie_word_embeddings=tie_word_embeddings,
        **_vl_token_ids(),
    )
    return _with_initializer_range(config, initializer_range)


def tiny_qwen3_vl(seed: int = 0, **config_kwargs: Any) -> Any:
    """A randomly initialised tiny ``Qwen3VLForConditionalGeneration`` (float32)."""
    from transformers import Qwen3VLForConditionalGeneration

    torch.manual_seed(seed)
    return _with_generation_ids(Qwen3VLForConditionalGeneration(tiny_qwen3_vl_config(**config_kwargs)))


def tiny_qwen2_5_vl_processor(min_pixels: int = 4 * TINY_PIXELS, max_pixels: int = 16 * TINY_PIXELS) -> Any:
    """A ``Qwen2_5_VLProcessor`` over the real Qwen vocabulary with small pixel budgets.

    Images and videos are resized to between ``min_pixels`` and ``max_pixels`` (multiples of 28 px).
    """
    from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessor

    require("torchvision", "the Qwen2.5-VL video processor")
    from transformers import Qwen2VLVideoProcessor

    size = {"shortest_edge": min_pixels, "longest_edge": max_pixels}
    return Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(size=size),
        video_processor=Qwen2VLVideoProcessor(size=size),
        tokenizer=qwen_tokenizer(),
        chat_template=qwen2_5_vl_chat_template(),
    )


def tiny_qwen3_vl_processor(min_pixels: int = 4 * TINY_QWEN3_VL_PIXELS, max_pixels: int = 16 * TINY_QWEN3_VL_PIXELS,
                            video_min_pixels: int = 8 * TINY_QWEN3_VL_PIXELS,
                            video_max_pixels: int = 256 * TINY_QWEN3_VL_PIXELS) -> Any:
    """A ``Qwen3VLProcessor`` (16-px patches, 32-px tokens) over the real Qwen vocabulary, with a
    Qwen3-VL chat template and small pixel budgets.

    Images are resized to between ``min_pixels`` and ``max_pixels`` each; a video's frames together
    to between ``video_min_pixels`` and ``video_max_pixels`` (the Qwen3-VL video processor budgets
    the whole clip, not one frame). Sides are multiples of 32 px.
    """
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor

    require("torchvision", "the Qwen3-VL video processor")
    from transformers import Qwen3VLVideoProcessor

    return Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(size={"shortest_edge": min_pixels, "longest_edge": max_pixels},
                                              patch_size=16, merge_size=2, temporal_patch_size=2),
        video_processor=Qwen3VLVideoProcessor(
            size={"shortest_edge": video_min_pixels, "longest_edge": video_max_pixels},
            patch_size=16, merge_size=2, temporal_patch_size=2),
        tokenizer=qwen_tokenizer(),
        chat_template=qwen3_vl_chat_template(),
    )


def _text_config_fields(hidden_size: int, num_layers: int) -> dict[str, Any]:
    """Config fields shared by the tiny text-only Qwen families (Qwen vocabulary and special ids)."""
    return dict(
        vocab_size=QWEN_VOCAB_SIZE,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=151643,
        eos_token_id=151645,
        pad_token_id=151643,
    )


def _with_generation_ids(model: Any) -> Any:
    # a chat turn ends with <|im_end|>; <|endoftext|> also stops (as in Qwen's generation_config.json)
    model.generation_config.pad_token_id = 151643
    model.generation_config.eos_token_id = [151645, 151643]
    return model


def tiny_qwen2(seed: int = 0, hidden_size: int = 64, num_layers: int = 2) -> Any:
    """A randomly initialised tiny text-only ``Qwen2ForCausalLM`` over the Qwen vocabulary (the
    Qwen2 / Qwen2.5 text family: q / k / v projections with biases)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    return _with_generation_ids(Qwen2ForCausalLM(Qwen2Config(**_text_config_fields(hidden_size, num_layers))))


def tiny_qwen3(seed: int = 0, hidden_size: int = 64, num_layers: int = 2,
               initializer_range: float | None = None) -> Any:
    """A randomly initialised tiny text-only ``Qwen3ForCausalLM`` over the Qwen vocabulary (the
    Qwen3 family: no q / k / v biases, per-head RMS norms ``q_norm`` / ``k_norm``).
    ``initializer_range``: std of the random weights (None: the config's default, 0.02), as for
    ``tiny_qwen2_5_vl``."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(head_dim=hidden_size // 4, **_text_config_fields(hidden_size, num_layers))
    if initializer_range is not None:
        config.initializer_range = initializer_range
    return _with_generation_ids(Qwen3ForCausalLM(config))


def save_tiny_qwen2_5_vl(path: str | Path, seed: int = 0, **config_kwargs: Any) -> Path:
    """Write a tiny Qwen2.5-VL and its processor to ``path`` (loadable with ``from_pretrained``)."""
    path = Path(path)
    tiny_qwen2_5_vl(seed=seed, **config_kwargs).save_pretrained(path)
    tiny_qwen2_5_vl_processor().save_pretrained(path)
    return path


def save_tiny_qwen3_vl(path: str | Path, seed: int = 0, **config_kwargs: Any) -> Path:
    """Write a tiny Qwen3-VL (:func:`tiny_qwen3_vl`) and its processor
    (:func:`tiny_qwen3_vl_processor`) to ``path`` (loadable with ``from_pretrained``)."""
    path = Path(path)
    tiny_qwen3_vl(seed=seed, **config_kwargs).save_pretrained(path)
    tiny_qwen3_vl_processor().save_pretrained(path)
    return path


def save_tiny_qwen2(path: str | Path, seed: int = 0) -> Path:
    """Write a tiny Qwen2 and the Qwen tokenizer to ``path``."""
    path = Path(path)
    tiny_qwen2(seed=seed).save_pretrained(path)
    qwen_tokenizer().save_pretrained(path)
    return path


def save_tiny_qwen3(path: str | Path, seed: int = 0) -> Path:
    """Write a tiny Qwen3 and the Qwen tokenizer to ``path``."""
    path = Path(path)
    tiny_qwen3(seed=seed).save_pretrained(path)
    qwen_tokenizer().save_pretrained(path)
    return path


def tiny_wan_transformer(seed: int = 0, in_channels: int = 4, text_dim: int = 32, num_layers: int = 2,
                         num_attention_heads: int = 2) -> Any:
    """A tiny diffusers ``WanTransformer3DModel`` (flow matching, velocity prediction), heads of 16 channels.

    Input ``hidden_states``: ``[B, in_channels, T, H, W]`` latents with even ``H``, ``W``;
    ``encoder_hidden_states``: ``[B, L, text_dim]``; ``timestep``: ``[B]`` in ``[0, 1000]``.
    """
    diffusers = require("diffusers", "the tiny flow-matching transformer")
    torch.manual_seed(seed)
    return diffusers.WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=num_attention_heads,
        attention_head_dim=16,
        in_channels=in_channels,
        out_channels=in_channels,
        text_dim=text_dim,
        freq_dim=32,
        ffn_dim=64,
        num_layers=num_layers,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=64,
    )


def tiny_cosmos_transformer(seed: int = 0, latent_channels: int = 4, text_dim: int = 32, num_layers: int = 2,
                            num_attention_heads: int = 2, extra_pos_embed_type: str | None = None) -> Any:
    """A tiny diffusers ``CosmosTransformer3DModel`` shaped like Cosmos-Predict2.5's (text-to-world).

    ``in_channels = latent_channels + 1`` (the condition-mask channel), a padding-mask channel added
    inside; ``timestep``: ``[B]`` sigma in ``[0, 1]``. Feed it through
    :func:`cosmos_primitives.models.flow_transformers.cosmos_velocity_fn`. Needs torchvision.
    ``num_attention_heads`` heads of 16 channels; ``extra_pos_embed_type = "learnable"`` adds
    Cosmos-Predict2's learnable position embedding, its tables drawn at random (diffusers' are zero).
    """
    diffusers = require("diffusers", "the tiny Cosmos transformer")
    torch.manual_seed(seed)
    model = diffusers.CosmosTransformer3DModel(
        in_channels=latent_channels + 1,
        out_channels=latent_channels,
        num_attention_heads=num_attention_heads,
        attention_head_dim=16,
        num_layers=num_layers,
        text_embed_dim=text_dim,
        adaln_lora_dim=8,
        max_size=(16, 32, 32),
        patch_size=(1, 2, 2),
        concat_padding_mask=True,
        extra_pos_embed_type=extra_pos_embed_type,
    )
    if model.learnable_pos_embed is not None:
        with torch.no_grad():
            for table in model.learnable_pos_embed.parameters():
                table.normal_()
    return model


COSMOS_PREDICT2_5_2B_TRANSFORMER: dict[str, Any] = {
    "in_channels": 16 + 1,  # the Wan2.1 VAE's 16 latent channels + the condition-mask channel
    "out_channels": 16,
    "num_attention_heads": 16,
    "attention_head_dim": 128,
    "num_layers": 28,
    "mlp_ratio": 4.0,
    "text_embed_dim": 1024,
    "adaln_lora_dim": 256,
    "max_size": (128, 240, 240),
    "patch_size": (1, 2, 2),
    "rope_scale": (1.0, 3.0, 3.0),
    "concat_padding_mask": True,
    "extra_pos_embed_type": None,
    "use_crossattn_projection": True,
    "crossattn_proj_in_channels": 100352,  # Cosmos-Reason1-7B: 28 layers x 3584, concatenated
    "encoder_hidden_states_channels": 1024,
}
"""The ``CosmosTransformer3DModel`` config of Cosmos-Predict2.5-2B as published (diffusers'
``Cosmos-2.5-Predict-Base-2B`` conversion config; 2.06e9 weights)."""


def cosmos_predict2_5_2b_transformer(device: str | torch.device = "meta", dtype: torch.dtype = torch.bfloat16) -> Any:
    """A ``CosmosTransformer3DModel`` of Cosmos-Predict2.5-2B's shape with random weights, by default on
    the meta device (no memory: for shape checks of what a recipe feeds it)."""
    diffusers = require("diffusers", "the Cosmos-Predict2.5 transformer")
    with torch.device(device):
        model = diffusers.CosmosTransformer3DModel(**COSMOS_PREDICT2_5_2B_TRANSFORMER)
    # as from_pretrained(torch_dtype=...) does: the learnable position embedding stays float32
    keep = set(getattr(model, "_keep_in_fp32_modules", None) or [])
    for name, module in model.named_modules():
        if not any(name == k or name.startswith(k + ".") or name.endswith("." + k) for k in keep):
            for param in module.parameters(recurse=False):
                param.data = param.data.to(dtype)
    return model


def tiny_unipc_flow_scheduler(flow_shift: float = 5.0) -> Any:
    """A flow-sigma ``UniPCMultistepScheduler``, the scheduler kind of Cosmos-Predict2.5 in diffusers."""
    diffusers = require("diffusers", "the flow-matching scheduler")
    return diffusers.UniPCMultistepScheduler(use_flow_sigmas=True, flow_shift=flow_shift,
                                             prediction_type="flow_prediction")


def tiny_wan_vae(seed: int = 0, z_dim: int = 4) -> Any:
    """A tiny diffusers ``AutoencoderKLWan``: video ``[B, 3, T, H, W]`` in [-1, 1] <-> latents
    ``[B, z_dim, T, H/2, W/2]`` (no temporal downsampling; Wan's causal chunking wants
    ``T = 1 + 4k`` frames)."""
    diffusers = require("diffusers", "the tiny video VAE")
    torch.manual_seed(seed)
    return diffusers.AutoencoderKLWan(
        base_dim=8,
        z_dim=z_dim,
        dim_mult=[1, 1],
        num_res_blocks=1,
        attn_scales=[],
        temperal_downsample=[False],
        latents_mean=[0.0] * z_dim,
        latents_std=[1.0] * z_dim,
    )


def tiny_flow_scheduler(shift: float = 3.0) -> Any:
    """The diffusers ``FlowMatchEulerDiscreteScheduler`` the flow sampler reads its sigmas from."""
    diffusers = require("diffusers", "the flow-matching scheduler")
    return diffusers.FlowMatchEulerDiscreteScheduler(shift=shift)
