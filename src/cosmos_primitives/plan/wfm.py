"""Bytes per GPU of a world-model RL step (``examples/wfm_rl.py``: FlowGRPO, DDRL or DiffusionNFT on a
diffusers flow transformer), from its config and the transformer's ``config.json``, before anything
is built.

Notation (per rank): ``S`` FSDP shard ranks (``dp_shard x cp``), ``c`` bytes of ``[policy] dtype``,
``B`` rollouts per step (``[wfm] rollout_batch_size x num_samples_per_prompt``), ``m`` the
micro-batch (``[train.train_policy] mini_batch``, at most a mini-batch of ``B / num_minibatches``),
``T`` video tokens of one sample on this rank (latent frames x H'/2 x W'/2 / cp), ``L x D`` the text
embedding of one sample (``[wfm.data] max_tokens x text_dim``), ``n`` transformer blocks, ``N`` its
weights, ``N_a`` the LoRA weights (or all of them without LoRA), ``K`` denoising steps.

Formulas (exact byte counts of what the recipe allocates):

- **weights**: the recipe shards when it has several ranks (FSDP2 over the blocks, float32 weights
  gathered in ``c``): ``4 N / S``; on one rank the transformer is ``c`` and the LoRA weights float32.
  Sharded, the root unit and two blocks are gathered in ``c`` while the transformer runs.
- **LoRA gradients** ``4 N_a / S``, **AdamW** moments ``8 N_a / S``, its step's float32 temporary ``4 N_a / S``.
- **text embeddings**: the step's ``B x L x D`` float32 on the device, and at every forward one ``c``
  copy of the micro-batch's (the text projection's input; Cosmos-Predict2.5's 100,352-wide embeddings
  make this 98 MiB per sample in bfloat16).
- **trajectory**: ``B x (K + 1)`` latents in float32 (every step's latents are recorded); evaluation
  rollouts hold ``B x (eval steps + 1)`` while they run. DDRL and image- / video-to-world also hold
  the prompts' clip latents (``B`` latents) and, while encoding, the clips' frames in float32.
- **VAE** weights, float32.

Measured (``benchmarks/bench_wfm_memory.py --figures`` on the CPU by the ``wfmmem`` session on
2026-11-27, torch 2.14.1, diffusers 0.42.1; every torch allocation counted from the profiler's
allocation events, so no allocator slack; the constants of :data:`MEASURED`):

- the rollout's guided no-grad step of one sample (both guidance passes and the SDE step):
  ``per_sample + per_token T``, for the whole batch ``B`` times that;
- a trained step of one sample as ``flow_grpo_update`` runs it (the guided recompute, the guided KL
  reference passes, the loss, backward; the LoRA gradients allocated beforehand, counted above) on
  Cosmos-Predict2.5-2B's block stack (28 blocks 2,048 wide, bfloat16, LoRA r 32 computing in
  bfloat16 as under FSDP2), with and without gradient checkpointing: the forward's and the
  backward's peak, each ``per_sample + per_token T`` from runs at 128 and 256 tokens, carried
  linearly to the recipe's 31,104 (flash attention keeps ``O(T)``: q, k, v, output, log-sum-exp),
  ``per_block`` (from 1 and 2 blocks) carrying them to another depth; ``m`` samples cost ``m``
  times one. Without checkpointing a block keeps 99,020 bytes per token, with it 4,096 (its input);
- the VAE decode of one sample (the Wan2.1 VAE, float32): per output pixel (its feature maps at
  full resolution, ~20 KB) and per output pixel-frame (the video), fitted through 21 frames of
  64 x 64 and 13 of 128 x 128; the uint8 conversion after it peaks lower;
- what float32 LoRA weights (one rank without FSDP2: bfloat16 weights, float32 adapters, so peft
  computes them in float32) add to a block's saved activations per token.

A transformer of another width scales the per-token figures by ``hidden / 2048`` and another compute
dtype by ``c / 2`` (both noted in the estimate: not measured). Not counted: the VAE encode of DDRL's
and image- / video-to-world's clips, CUDA / NCCL / cuBLAS workspaces, attention kernels that keep
more than the CPU's flash kernel, the caching allocator's slack (``max_memory_reserved`` runs above
``max_memory_allocated``), the reward service (another process).

GPU comparisons: ``benchmarks/bench_wfm_memory.py`` (``flowgrpo_memory_2b``) reports the measured peak of
the update next to :attr:`WFMMemoryEstimate.train_moment` for the same settings (not run yet). The one
GPU figure so far, the GPU pack's first H200 run (``flowgrpo_step_2b``: one rank without FSDP2,
bfloat16 weights, float32 LoRA r 16 under autocast, 4 samples of 7,776 tokens in one forward, no
checkpointing, guidance and KL off, T5-wide text) peaked at 110 GiB. This plan gives 120 GiB for that
setting without autocast (float32 adapter copies: 33 GiB of it); counting autocast's copies as
bfloat16 (half) and leaving out the guidance / KL passes it did not run (1.4 GiB) gives ~102 GiB,
7 % under the measurement.

The peak is the largest of the moments of a step: rollout, trained-step forward, backward,
optimizer step, VAE decode, and the evaluation rollout.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, NamedTuple

import torch

from cosmos_primitives.config.root import Config
from cosmos_primitives.parallel.mesh import resolve_sizes
from cosmos_primitives.plan.estimate import DTYPE_BYTES, GIB

MEASURED: dict[str, Any] = {
    "source": "benchmarks/bench_wfm_memory.py --figures, CPU, torch 2.14.1, diffusers 0.42.1, 2026-11-27",
    "depth": 28, "width": 2048, "text_tokens": 512,
    "rollout": {"per_sample": 13_726_236, "per_token": 22_920},
    "no_checkpointing": {
        "per_block": {"per_sample": 10_633_280, "per_token": 99_020},
        "forward_peak": {"per_sample": 312_506_692, "per_token": 2_796_504},
        "backward_peak": {"per_sample": 313_311_992, "per_token": 2_749_520},
    },
    "checkpointing": {
        "per_block": {"per_sample": 5_120, "per_token": 4_096},
        "forward_peak": {"per_sample": 14_938_692, "per_token": 142_732},
        "backward_peak": {"per_sample": 26_377_208, "per_token": 190_672},
    },
    "vae_decode": {"per_pixel": 20_650, "per_pixel_frame": 54.0},
    # one rank without FSDP2 (bfloat16 weights, float32 LoRA weights): what float32 adapters add to a block's
    # saved activations, with ``layers`` adapted layers taking the block's hidden-wide input
    "lora_float32_inputs": {"per_token_per_block": 41_344, "layers": 6},
}
"""The measured figures in bytes (module docstring; ``benchmarks/bench_wfm_memory.py --figures`` prints
them in this layout): per sample and per video token of one sample, at ``depth`` blocks of ``width``
in bfloat16 with ``text_tokens`` text tokens; ``per_block`` is what one block more (or less) adds."""

WAN2_1_VAE = {"z_dim": 16, "temporal": 4, "spatial": 8, "params": 126_892_531}
"""The Wan2.1 VAE (Cosmos-Predict2.5's): latent channels, temporal and spatial compression, weights."""


class WFMShape(NamedTuple):
    """What the plan needs to know about a diffusers flow transformer (and its VAE)."""

    total_params: int
    trainable_params: int  # the LoRA adapters' weights, or all of them
    root_params: int  # outside the blocks (FSDP's root unit): embeddings, text projection, output layers
    block_params: int  # the largest block
    blocks: int
    hidden: int
    patch: tuple[int, int, int]
    text_dim: int  # the width of the text embeddings it takes
    lora_video_layers: int = 0  # LoRA-adapted linear layers of a block that take its hidden-wide input
    vae_z_dim: int = WAN2_1_VAE["z_dim"]
    vae_temporal: int = WAN2_1_VAE["temporal"]
    vae_spatial: int = WAN2_1_VAE["spatial"]
    vae_params: int = WAN2_1_VAE["params"]

    @classmethod
    def from_diffusers_config(cls, config: dict[str, Any], *, lora: Any = None,
                              vae_config: dict[str, Any] | None = None) -> WFMShape:
        """The shape of the transformer of ``config`` (``transformer/config.json``; its ``_class_name``,
        ``CosmosTransformer3DModel`` when absent), built on the meta device, trained with ``lora``
        (``[policy.lora]``: ``r x (in + out)`` per adapted linear layer, as peft adds them; None or
        disabled: every weight). ``vae_config``: ``vae/config.json`` of an ``AutoencoderKLWan``
        (None or another class: the Wan2.1 VAE's figures)."""
        import diffusers

        fields = {k: v for k, v in config.items() if not k.startswith("_")}
        model_class = getattr(diffusers, config.get("_class_name", "CosmosTransformer3DModel"))
        with torch.device("meta"):
            model = model_class.from_config(fields)
        total = sum(p.numel() for p in model.parameters())
        blocks = next(getattr(model, a) for a in ("transformer_blocks", "blocks") if hasattr(model, a))
        block_sizes = [sum(p.numel() for p in b.parameters()) for b in blocks]
        trainable, lora_video_layers = total, 0
        cfg = model.config
        hidden = cfg["num_attention_heads"] * cfg["attention_head_dim"]
        if lora is not None and getattr(lora, "enabled", True):
            adapted = [(name, m) for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)
                       and any(name == t or name.endswith("." + t) for t in lora.target_modules)]
            trainable = sum(lora.r * (m.in_features + m.out_features) for _, m in adapted)
            # the first block's adapted layers on its hidden states: not the cross-attention's keys / values (the text)
            first_block = {id(m) for m in blocks[0].modules()}
            lora_video_layers = sum(1 for name, m in adapted if id(m) in first_block and m.in_features == hidden
                                    and not name.endswith(("attn2.to_k", "attn2.to_v")))
        if cfg.get("use_crossattn_projection"):
            text_dim = cfg["crossattn_proj_in_channels"]
        else:
            text_dim = cfg.get("text_embed_dim") or cfg.get("text_dim")
        vae = dict(z_dim=WAN2_1_VAE["z_dim"], temporal=WAN2_1_VAE["temporal"], spatial=WAN2_1_VAE["spatial"],
                   params=WAN2_1_VAE["params"])
        if vae_config is not None and vae_config.get("_class_name", "AutoencoderKLWan") == "AutoencoderKLWan":
            vae_fields = {k: v for k, v in vae_config.items() if not k.startswith("_")}
            with torch.device("meta"):
                vae_model = diffusers.AutoencoderKLWan.from_config(vae_fields)
            vc = vae_model.config
            vae = dict(z_dim=vc["z_dim"], temporal=2 ** sum(bool(x) for x in vc["temperal_downsample"]),
                       spatial=2 ** (len(vc["dim_mult"]) - 1), params=sum(p.numel() for p in vae_model.parameters()))
        return cls(total_params=total, trainable_params=trainable, root_params=total - sum(block_sizes),
                   block_params=max(block_sizes), blocks=len(block_sizes),
                   hidden=hidden, patch=tuple(cfg["patch_size"]), text_dim=int(text_dim),
                   lora_video_layers=lora_video_layers, vae_z_dim=vae["z_dim"], vae_temporal=vae["temporal"],
                   vae_spatial=vae["spatial"], vae_params=vae["params"])

    def latent_shape(self, num_frames: int, height: int, width: int) -> tuple[int, int, int, int]:
        """``(C, T', H', W')`` of a clip of ``num_frames`` frames of ``height x width`` pixels."""
        return (self.vae_z_dim, (num_frames - 1) // self.vae_temporal + 1, height // self.vae_spatial,
                width // self.vae_spatial)


def read_diffusers_configs(model_name_or_path: str,
                           revision: str | None = None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``(transformer/config.json, vae/config.json or None)`` of a diffusers folder or Hub repo (fetches
    those two small files, or reads them from the local Hugging Face cache)."""
    folder = Path(model_name_or_path).expanduser()

    def read(name: str) -> dict[str, Any] | None:
        if folder.is_dir():
            path = folder / name / "config.json"
            return json.loads(path.read_text()) if path.is_file() else None
        from huggingface_hub import hf_hub_download

        try:
            return json.loads(Path(hf_hub_download(model_name_or_path, f"{name}/config.json",
                                                   revision=revision)).read_text())
        except Exception:  # the VAE is optional; a missing transformer config is reported below
            return None

    transformer = read("transformer")
    if transformer is None:
        raise FileNotFoundError(f"{model_name_or_path} holds no transformer/config.json: is [policy] "
                                "model_name_or_path a diffusers folder (transformer/, vae/, scheduler/)?")
    return transformer, read("vae")


class WFMMemoryEstimate(NamedTuple):
    """Bytes per rank of each part and moment of a world-model RL step (module docstring)."""

    weights: int  # the transformer's (sharded or not)
    gathered: int  # FSDP2 units gathered while the transformer runs
    optimizer: int  # LoRA gradients + AdamW moments
    vae: int
    text: int  # the step's text embeddings (float32)
    trajectory: int  # the rollout's recorded latents
    clips: int  # DDRL / conditioning: the prompts' clip latents
    rollout_step: int  # the rollout's guided forward over the whole batch (+ the text copy)
    train_forward: int  # one micro-batch's trained-step forward (+ its text copies)
    train_backward: int  # its backward
    optimizer_step: int
    decode: int  # the VAE decode of one micro-batch and the uint8 conversion
    evaluation: int  # the evaluation rollout's trajectory
    moments: dict[str, int]
    total: int  # the peak: the largest moment
    micro_batch: int
    tokens: int  # video tokens of one sample on this rank
    notes: tuple[str, ...]

    @property
    def train_moment(self) -> int:
        """The update's peak (its forward or its backward), everything alive then included."""
        return max(self.moments["train forward"], self.moments["train backward"])

    def report(self, device_memory: int | None = None) -> str:
        """A log block: one line per part and per moment, the peak, a warning when it exceeds ``device_memory``."""
        rows = [("transformer weights", self.weights), ("gathered FSDP units", self.gathered),
                ("LoRA gradients + AdamW", self.optimizer), ("VAE weights", self.vae),
                ("text embeddings (float32)", self.text), ("rollout trajectory (float32 latents)", self.trajectory),
                ("clip latents (DDRL / conditioning)", self.clips),
                ("rollout step (whole batch, no grad)", self.rollout_step),
                (f"trained-step forward ({self.micro_batch} x {self.tokens} tokens)", self.train_forward),
                (f"trained-step backward ({self.micro_batch} x {self.tokens} tokens)", self.train_backward),
                ("optimizer step", self.optimizer_step), ("VAE decode + uint8", self.decode),
                ("evaluation trajectory", self.evaluation)]
        lines = ["memory plan per GPU, world-model RL (peak = largest moment of a step, not the sum of the lines):"]
        lines += [f"  {name:<52} {value / GIB:8.2f} GiB" for name, value in rows]
        lines += [f"  moment: {name:<44} {value / GIB:8.2f} GiB" for name, value in self.moments.items()]
        of = f" of {device_memory / GIB:.1f} GiB" if device_memory else ""
        lines.append(f"  {'peak':<52} {self.total / GIB:8.2f} GiB{of}")
        lines += [f"  note: {n}" for n in self.notes]
        if device_memory and self.total > device_memory:
            lines.append(
                f"WARNING: the estimated peak {self.total / GIB:.1f} GiB exceeds the device's "
                f"{device_memory / GIB:.1f} GiB: expect out-of-memory. Options: [policy] "
                "model_gradient_checkpointing = true, a smaller [train.train_policy] mini_batch (samples per "
                "forward / backward; the gradients are accumulated), more ranks (dp_shard_size, cp_size), "
                "a smaller [wfm] rollout_batch_size or num_samples_per_prompt")
        return "\n".join(lines)


def _figure(moment: str, checkpointing: bool, blocks: int, tokens: int, text_tokens: int) -> float:
    """One sample's bytes at a trained-step ``moment`` (``"forward_peak"`` / ``"backward_peak"``) from
    :data:`MEASURED`, carried from its depth to ``blocks`` and from its text length to ``text_tokens``
    (at the measured width and dtype)."""
    figures = MEASURED["checkpointing" if checkpointing else "no_checkpointing"]
    fit, block = figures[moment], figures["per_block"]
    # a block's per-sample bytes are its cross-attention keys / values (and their LoRA inputs): text-long
    text_scale = text_tokens / MEASURED["text_tokens"]
    return (fit["per_sample"] + fit["per_token"] * tokens
            + (blocks - MEASURED["depth"]) * (block["per_sample"] + block["per_token"] * tokens)
            + blocks * block["per_sample"] * (text_scale - 1))


def estimate_wfm_memory(cfg: Config, shape: WFMShape, *, world_size: int, sharded: bool | None = None,
                        latent_shape: tuple[int, int, int, int] | None = None,
                        device_memory: int | None = None) -> WFMMemoryEstimate:
    """Estimate the peak bytes per rank of ``examples/wfm_rl.py`` running ``cfg`` on ``world_size`` ranks.

    Args:
        shape: :meth:`WFMShape.from_diffusers_config` of the transformer (and VAE) of ``[policy]
            model_name_or_path``, trained as ``[policy.lora]`` says.
        world_size: ranks of the job (``[policy.parallelism]`` is resolved against it).
        sharded: FSDP2 (float32 weights, computing in ``[policy] dtype``); default as the recipe does,
            ``world_size > 1``.
        latent_shape: ``(C, T', H', W')`` of one sample; default from ``[wfm.data] num_frames``,
            ``height``, ``width`` and the VAE's compression.
        device_memory: bytes of one device, for the report's warning only.
    """
    w, data = cfg.wfm, cfg.wfm.data
    sizes = resolve_sizes(cfg.policy.parallelism, world_size)
    cp_size = sizes["cp"]
    shards = sizes["dp_shard"] * cp_size
    sharded = world_size > 1 if sharded is None else sharded
    c = DTYPE_BYTES[cfg.policy.dtype]
    checkpointing = cfg.policy.model_gradient_checkpointing
    notes: list[str] = []

    latent = latent_shape or shape.latent_shape(data.num_frames, data.height, data.width)
    channels, frames, height, width = latent
    latent_bytes = 4 * channels * frames * height * width
    pt, ph, pw = shape.patch
    tokens = math.ceil((frames // pt) * (height // ph) * (width // pw) / cp_size)
    batch = w.rollout_batch_size * w.num_samples_per_prompt
    mini = math.ceil(batch / w.num_minibatches)
    micro = min(max(1, cfg.train.train_policy.mini_batch), mini)
    text_sample = data.max_tokens * shape.text_dim

    n, n_a = shape.total_params, shape.trainable_params
    if sharded:
        weights = math.ceil(4 * n / shards)
        gathered = (shape.root_params + 2 * shape.block_params) * c
        split = shards
    else:
        weights = (n - n_a) * c + 4 * n_a
        gathered, split = 0, 1
    lora = cfg.policy.lora is not None and cfg.policy.lora.enabled
    if not lora and w.kl_beta > 0:  # full fine-tuning keeps a frozen copy of the initial weights as the reference
        weights += math.ceil(4 * n / shards) if sharded else n * c
        notes.append("weights include the frozen reference copy (full fine-tuning with kl_beta > 0)")
    gradients = math.ceil(4 * n_a / split)
    optimizer = gradients + math.ceil(8 * n_a / split)
    step_temp = math.ceil(4 * n_a / split)
    vae = 4 * shape.vae_params
    text = 4 * batch * text_sample
    trajectory = batch * (w.num_inference_steps + 1) * latent_bytes
    clips = batch * latent_bytes if (w.algorithm == "ddrl" or w.conditioning != "text") else 0
    if w.algorithm == "diffusion_nft":
        trajectory += 2 * w.nft_num_timesteps * batch * latent_bytes  # x_t and v_old per forward-process point
    if w.conditioning != "text" or w.algorithm == "ddrl":
        notes.append("the VAE encode of the prompts' clips (DDRL / conditioning) is not counted")

    # the measured figures are of a 2048-wide bfloat16 stack: scale to this one
    scale = shape.hidden / MEASURED["width"] * c / 2
    if shape.hidden != MEASURED["width"] or c != 2:
        notes.append(f"activation figures scaled from the measured 2048-wide bfloat16 stack by {scale:.2f} "
                     "(width x dtype): not measured at this shape")

    # one rank without FSDP2: c weights with float32 LoRA weights, so peft computes the adapters in float32 and
    # autograd keeps a float32 copy of each adapted layer's input (per block, or the recomputed one)
    cast_copies = 0.0
    if not sharded and c < 4 and lora:
        lora_cast = MEASURED["lora_float32_inputs"]
        cast_copies = (lora_cast["per_token_per_block"] * shape.hidden / MEASURED["width"]
                       * shape.lora_video_layers / lora_cast["layers"] * (1 if checkpointing else shape.blocks))
        notes.append("one rank without FSDP2: the LoRA layers compute in float32 and keep float32 copies of their "
                     f"inputs ({cast_copies / 1024:.0f} KiB per token)")

    def figure(moment: str, samples: int) -> int:
        per_sample = scale * _figure(moment, checkpointing, shape.blocks, tokens, data.max_tokens)
        return math.ceil(samples * (per_sample + cast_copies * tokens))

    roll = MEASURED["rollout"]
    rollout_step = math.ceil(batch * (scale * (roll["per_sample"] + roll["per_token"] * tokens) + text_sample * c))
    train_forward = figure("forward_peak", micro) + micro * text_sample * c
    train_backward = figure("backward_peak", micro)
    out_frames = (frames - 1) * shape.vae_temporal + 1
    pixels = height * width * shape.vae_spatial ** 2
    dec = MEASURED["vae_decode"]
    if shape.vae_params != WAN2_1_VAE["params"]:
        notes.append("the VAE decode figures are the Wan2.1 VAE's (measured); this VAE is another")
    decode = math.ceil(micro * (dec["per_pixel"] * pixels + dec["per_pixel_frame"] * pixels * out_frames))
    evaluation = 0
    if w.eval_num_inference_steps > 0:
        evaluation = batch * (w.eval_num_inference_steps + 1) * latent_bytes

    resident = weights + optimizer + vae + text + clips
    moments = {
        "rollout": resident + gathered + trajectory + rollout_step,
        "train forward": resident + gathered + trajectory + train_forward,
        "train backward": resident + gathered + trajectory + train_backward,
        "optimizer step": resident + trajectory + step_temp,
        "VAE decode": resident + trajectory + decode,
        "evaluation": resident + gathered + evaluation + max(rollout_step, decode),
    }
    return WFMMemoryEstimate(
        weights=weights, gathered=gathered, optimizer=optimizer, vae=vae, text=text, trajectory=trajectory,
        clips=clips, rollout_step=rollout_step, train_forward=train_forward, train_backward=train_backward,
        optimizer_step=step_temp, decode=decode, evaluation=evaluation, moments=moments, total=max(moments.values()),
        micro_batch=micro, tokens=tokens, notes=tuple(notes))
