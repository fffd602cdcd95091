"""Builders for unit-testing components on a CPU: tiny models, offline tokenizer, media, and a
runner for multi-process gloo tests (a real Redis server is ``cp.queue.RedisServer``).
Users can test their own components the same way
(``from cosmos_primitives.testing import tiny_qwen2_5_vl, run_distributed``)."""

from cosmos_primitives.testing.colour_mcq import (
    colour_mcq_rows,
    colour_mcq_sft_rows,
    write_colour_mcq,
    write_colour_mcq_sft,
)
from cosmos_primitives.testing.demo_assets import ensure_demo_assets, write_arithmetic, write_video_qa
from cosmos_primitives.testing.distributed import run_distributed
from cosmos_primitives.testing.media import (
    COLOURS,
    color_image,
    decode_frame_index,
    frame_index_pattern,
    write_corrupt_mp4,
    write_image,
    write_mp4,
)
from cosmos_primitives.testing.models import (
    COSMOS_PREDICT2_5_2B_TRANSFORMER,
    cosmos_predict2_5_2b_transformer,
    save_tiny_qwen2,
    save_tiny_qwen2_5_vl,
    save_tiny_qwen3,
    save_tiny_qwen3_vl,
    tiny_cosmos_transformer,
    tiny_flow_scheduler,
    tiny_qwen2,
    tiny_qwen2_5_vl,
    tiny_qwen2_5_vl_config,
    tiny_qwen2_5_vl_processor,
    tiny_qwen3,
    tiny_qwen3_vl,
    tiny_qwen3_vl_config,
    tiny_qwen3_vl_processor,
    tiny_unipc_flow_scheduler,
    tiny_wan_transformer,
    tiny_wan_vae,
)
from cosmos_primitives.testing.reason1_benchmark import write_reason1_benchmark
from cosmos_primitives.testing.tokenizer import (
    qwen2_5_vl_chat_template,
    qwen3_vl_chat_template,
    qwen_tokenizer,
    qwen_tokenizer_dir,
)

__all__ = [  # the public surface (tests/test_public_surface.py); the rest by module path
    "color_image", "qwen_tokenizer", "tiny_flow_scheduler", "tiny_qwen2_5_vl", "tiny_qwen2_5_vl_config",
    "tiny_qwen2_5_vl_processor", "tiny_qwen3", "tiny_wan_transformer", "tiny_wan_vae", "write_image",
]
