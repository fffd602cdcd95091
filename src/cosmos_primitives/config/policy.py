"""``[policy]``: the trainable model and how it is laid out over devices."""

from __future__ import annotations

from typing import Literal

import msgspec

from cosmos_primitives.config.base import AtLeastOne, Fraction, Section


class ParallelismConfig(Section):
    """``[policy.parallelism]`` / ``[rollout.parallelism]``: mesh sizes.

    The product ``pp * dp_replicate * dp_shard * cp * tp`` must equal the number of ranks in the
    group; ``dp_shard_size = -1`` takes whatever is left, or ``dp_replicate_size = -1`` with a fixed
    ``dp_shard_size`` (HSDP replicas of a fixed shard group: cosmos-rl's world-model layout).
    """

    dp_replicate_size: int = 1
    dp_shard_size: int = -1
    cp_size: AtLeastOne = 1
    tp_size: AtLeastOne = 1
    pp_size: AtLeastOne = 1


DIFFUSERS_LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0")
"""``target_modules`` for the attention projections of a diffusers transformer (Wan, Cosmos-Predict2.5)."""


class LoraConfig(Section):
    """``[policy.lora]``: low-rank adapters (peft) on a language, vision-language or diffusion model.

    Only the adapters train; the KL reference is the same network with its adapters disabled.

    - ``target_modules``: suffixes of the module names to adapt. The default names the attention
      projections of Qwen-family models; a diffusers transformer (Wan, Cosmos-Predict2.5) names its
      own, e.g. ``["to_q", "to_k", "to_v", "to_out.0"]`` (:data:`DIFFUSERS_LORA_TARGETS`).
    - ``init_lora_weights``: peft's option (``true`` / ``"gaussian"`` start with ``B = 0``, i.e. at
      the base model).
    - ``enabled = false``: no adapters, every weight trains, as without the table (the loader drops
      it, so ``policy.lora.enabled=false`` on the command line switches a recipe's LoRA off).
    """

    enabled: bool = True
    r: AtLeastOne = 32
    lora_alpha: float = 64.0
    lora_dropout: Fraction = 0.0
    target_modules: list[str] = msgspec.field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    init_lora_weights: bool | str = True


class PolicyConfig(Section):
    """``[policy]``: what ``cp.policy.build_policy`` builds.

    - ``model_name_or_path`` / ``model_revision``: HF model folder or Hub repo (Qwen2-family causal
      LM or Qwen2.5-VL); for world-model RL (``examples/wfm_rl.py``) a diffusers folder holding
      ``transformer/``, ``vae/`` and ``scheduler/``, or ``"tiny"`` for the random test model.
    - ``dtype``: compute dtype. Sharded trainers keep ``[train] master_dtype`` weights and compute in
      this dtype through FSDP2 mixed precision; unsharded models are loaded in it.
    - ``model_gradient_checkpointing``: recompute each decoder layer / vision block (transformer
      block of a diffusion model) in backward.
    - ``trainable_patterns`` / ``freeze_patterns``: regexes searched in parameter names (e.g.
      ``'^model\\.visual\\.'`` as a TOML literal string freezes Qwen2.5-VL's vision tower);
      freezing wins.
    - ``logprob_chunk_size``: tokens per chunk of the log-prob head (its float32 buffer is
      ``chunk x vocab x 4`` bytes: 622 MB at 1,024 x 151,936).
    - ``lora``: ``[policy.lora]``; without it every weight trains (full fine-tuning).
    """

    model_name_or_path: str = ""
    model_revision: str | None = None
    model_max_length: AtLeastOne = 4096
    model_gradient_checkpointing: bool = False
    dtype: Literal["bfloat16", "float32", "float16"] = "bfloat16"
    parallelism: ParallelismConfig = msgspec.field(default_factory=ParallelismConfig)
    freeze_patterns: list[str] = msgspec.field(default_factory=list)
    trainable_patterns: list[str] = msgspec.field(default_factory=list)
    logprob_chunk_size: AtLeastOne = 1024
    lora: LoraConfig | None = None
