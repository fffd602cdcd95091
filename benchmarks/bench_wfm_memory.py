"""Memory of a world-model RL step (FlowGRPO on a Cosmos-Predict2.5-2B-shaped transformer): the GPU
measurement that checks the memory plan (``cp.plan.estimate_wfm_memory``), and the CPU measurement of
the per-token figures the plan is built on.

    python benchmarks/bench_wfm_memory.py              # GPU: the 2B step at the recipe's sizes (~60 s)
    python benchmarks/bench_wfm_memory.py --dry-run    # the same code at tiny shapes, any device (seconds)
    python benchmarks/bench_wfm_memory.py --figures    # CPU: the plan's per-token figures (~5 min)

:func:`flowgrpo_memory_2b` is a part of the GPU pack (``benchmarks/gpu_suite_parts.py``'s signature).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
GIB = 1 << 30
Result = dict[str, Any]
RECIPE = REPO / "examples" / "configs" / "cosmos_predict2_5_2b_flowgrpo.toml"


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else None


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _single_rank_group(device: torch.device) -> bool:
    """A one-process group for FSDP2 (the recipe's per-rank code path on one device); True if made here."""
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0,
                            world_size=1)
    return True


def flowgrpo_memory_2b(dry: bool, work: Path | None = None, *, samples: int = 2, inference_steps: int = 2,
                       trained_steps: int = 1, micro_batch: int = 1, latent_frames: int = 24,
                       variants: tuple[str, ...] = ("checkpointing", "no_checkpointing")) -> Result:
    """One FlowGRPO step (guided SDE rollout recording log-probs, then ``cp.policy.flow_grpo_update``:
    the trained steps recomputed with guidance and the KL reference, backward, AdamW on the LoRA
    adapters) of a Cosmos-Predict2.5-2B-shaped random ``CosmosTransformer3DModel`` at the recipe's
    video size (``examples/configs/cosmos_predict2_5_2b_flowgrpo.toml``: 93 frames at 432 x 768 =
    ``16 x 24 x 54 x 96`` latents, 31,104 tokens per sample; LoRA r 32; guidance 4.5; KL 0.004), once
    per variant on the same rollout:

    - ``"checkpointing"``: the transformer's gradient checkpointing, micro-batches of ``micro_batch``
      samples (the gradients of all ``samples`` accumulated into one optimizer step);
    - ``"no_checkpointing"``: micro-batches of one sample (expected not to fit an 80 GB H100: the
      plan's estimate is reported beside it; an out-of-memory is caught and reported).

    The transformer runs as one rank of the recipe does under ``torchrun``: float32 weights under
    FSDP2 (a one-process group) computing in bfloat16, LoRA in float32 master weights. ``dry``: the
    tiny Cosmos transformer in float32 at tiny latents on whatever device is there (CI). ``work`` is
    unused (the GPU pack's part signature).

    Returns ``{"figures": {...}, "notes": [...]}``: ``rollout_s`` and ``rollout_peak_gib``, and per
    variant ``<variant>_train_s``, ``<variant>_peak_gib`` (the most allocated during its update, the
    rollout's trajectory and text included), ``<variant>_plan_gib`` (``cp.plan.estimate_wfm_memory``
    of the same settings) and ``<variant>_oom``. Seconds scale with ``samples`` x ``inference_steps``
    x 2 (guidance) forward passes for the rollout, and with ``samples`` x ``trained_steps`` x 6
    forward-pass equivalents for the update (guided policy and reference passes: 4, backward: ~2;
    7 with checkpointing's recompute); a forward pass grows with the tokens squared (attention).
    The peak with checkpointing grows with ``micro_batch`` x tokens; without it with ``micro_batch``
    x tokens x 28 blocks.
    """
    import cosmos_primitives as cp
    from cosmos_primitives.config.loader import load_config
    from cosmos_primitives.plan.wfm import WFMShape, estimate_wfm_memory

    dev = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    owns_group = _single_rank_group(dev)
    torch.manual_seed(0)
    if dry:
        transformer_config = dict(in_channels=5, out_channels=4, num_attention_heads=2, attention_head_dim=16,
                                  num_layers=2, text_embed_dim=32, adaln_lora_dim=8, max_size=(16, 32, 32),
                                  patch_size=(1, 2, 2), concat_padding_mask=True, extra_pos_embed_type=None)
        latent, text_len, text_dim, dtype = (4, 2, 4, 4), 8, 32, torch.float32
    else:
        transformer_config = dict(cp.testing.COSMOS_PREDICT2_5_2B_TRANSFORMER)
        latent, text_len, text_dim, dtype = (16, latent_frames, 54, 96), 512, 100352, torch.bfloat16
    diffusers = cp.utils.require("diffusers", "the Cosmos transformer")
    with torch.device(dev):
        transformer = diffusers.CosmosTransformer3DModel(**transformer_config)  # float32, as the recipe shards it
    overrides = ["policy.parallelism.dp_shard_size=1", f"wfm.num_samples_per_prompt={samples}",
                 "wfm.rollout_batch_size=1",
                 f"wfm.num_inference_steps={inference_steps}",
                 f"wfm.train_step_fraction={trained_steps / inference_steps}",
                 f"wfm.data.num_frames={(latent[1] - 1) * 4 + 1}", f"wfm.data.text_dim={text_dim}",
                 f"wfm.data.max_tokens={text_len}", f"policy.dtype={str(dtype).removeprefix('torch.')}"]
    if dry:
        overrides += ["wfm.data.height=32", "wfm.data.width=32"]
    cfg = load_config(RECIPE, overrides)
    w = cfg.wfm
    policy = cp.policy.DiffusionPolicy(transformer, lora=cfg.policy.lora, keep_reference=w.kl_beta > 0)
    policy.shard(param_dtype=None if dtype == torch.float32 else dtype)
    velocity = policy.velocity_fn()
    optimizer = cp.policy.build_optimizer(policy.transformer, cfg.train)
    gen = torch.Generator(device=dev).manual_seed(0)
    text = torch.randn(samples, text_len, text_dim, device=dev, generator=gen)  # float32, as the recipe holds it
    negative = torch.randn(1, text_len, text_dim, device=dev, generator=gen)
    sigmas = torch.linspace(1.0, 0.0, inference_steps + 1)
    shape = WFMShape.from_diffusers_config(transformer_config, lora=cfg.policy.lora)
    figures: dict[str, Any] = {"transformer_params_b": shape.total_params / 1e9, "latent_shape": list(latent),
                               "samples": samples, "inference_steps": inference_steps, "trained_steps": trained_steps,
                               "micro_batch": micro_batch}
    if dev.type == "cuda":
        figures["device_memory_gib"] = torch.cuda.get_device_properties(dev).total_memory / GIB

    _reset_peak(dev)
    _synchronize(dev)
    start = time.perf_counter()
    traj = cp.rollout.sample_flow(velocity, text, latent_shape=latent, sigmas=sigmas, timesteps=sigmas[:-1] * 1000,
                                  seeds=list(range(samples)), negative_text=negative, guidance_scale=w.guidance_scale,
                                  sde=cp.algo.SDEParams(noise_level=w.sampler.noise_level))
    _synchronize(dev)
    figures["rollout_s"], figures["rollout_peak_gib"] = time.perf_counter() - start, _peak_gib(dev)
    advantages = torch.randn(samples, device=dev, generator=gen)
    rng = {"train_steps": torch.Generator().manual_seed(1), "ddrl": torch.Generator(device=dev).manual_seed(2)}
    for variant in variants:
        checkpointing = variant == "checkpointing"
        micro = micro_batch if checkpointing else 1
        if checkpointing:
            policy.transformer.enable_gradient_checkpointing()
        else:
            policy.transformer.disable_gradient_checkpointing()
        plan_cfg = load_config(RECIPE, [*overrides, f"policy.model_gradient_checkpointing={str(checkpointing).lower()}",
                                        f"train.train_policy.mini_batch={micro}"])
        plan = estimate_wfm_memory(plan_cfg, shape, world_size=1, sharded=True, latent_shape=latent)
        figures[f"{variant}_plan_gib"] = (plan.train_moment - plan.vae) / GIB  # no VAE is loaded here
        _reset_peak(dev)
        _synchronize(dev)
        start = time.perf_counter()
        try:
            logged = cp.policy.flow_grpo_update(policy, velocity, optimizer, trajectory=traj, text=text,
                                                advantages=advantages, negative=negative, wfm=w, grad_clip=1.0,
                                                nonfinite="skip", micro_batch=micro, rng=rng, step=1)
            _synchronize(dev)
            figures[f"{variant}_train_s"] = time.perf_counter() - start
            figures[f"{variant}_oom"] = False
            figures[f"{variant}_policy_loss"] = logged["policy_loss"]
        except torch.OutOfMemoryError:
            figures[f"{variant}_oom"] = True
            optimizer.zero_grad(set_to_none=True)
        figures[f"{variant}_peak_gib"] = _peak_gib(dev)
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    if owns_group:
        torch.distributed.destroy_process_group()
    return {"figures": figures, "notes": [
        "random weights, random text embeddings and advantages; no VAE decode or reward",
        f"{samples} samples, {inference_steps} inference steps ({trained_steps} trained) instead of the recipe's "
        "8 and 20 (10): seconds scale with them, the update's peak does not (one micro-batch is alive at a time)",
        "<variant>_peak_gib is torch.cuda.max_memory_allocated during the update; <variant>_plan_gib the plan's "
        "estimate of the same moment (one rank of the recipe's FSDP2 code path, world size 1)"]}


# --- the plan's per-token figures, measured on the CPU -------------------------------------------------

def _linear(points: dict[int, float]) -> dict[str, float]:
    """``per_sample + per_token t`` through two points ``{tokens: bytes}``."""
    (t1, a), (t2, b) = sorted(points.items())
    per_token = (b - a) / (t2 - t1)
    return {"per_sample": a - per_token * t1, "per_token": per_token}


def measure_figures(depth: int = 28, frames: tuple[int, int] = (2, 4)) -> dict[str, Any]:
    """The world-model plan's figures (``cp.plan.wfm.MEASURED``), measured on the CPU with
    ``cp.testing.activation_memory.peak_allocated_bytes`` (every torch allocation, no allocator slack):

    - ``rollout``: the rollout's guided no-grad step (two passes, the SDE step) of one sample;
    - per gradient-checkpointing mode, a trained step of one sample as ``flow_grpo_update`` runs it
      (the guided recompute, the guided KL reference passes, the loss; then backward), with the
      LoRA gradients allocated beforehand (the plan counts them apart): ``forward_peak`` and
      ``backward_peak`` of a ``depth``-block stack, and ``per_block`` (what one more block saves,
      from 1 and 2 blocks) to carry them to other depths;
    - ``vae_decode``: the Wan2.1 VAE (float32) decoding one sample, per output pixel and pixel-frame;
    - ``lora_float32_inputs``: what float32 LoRA weights (one rank, no FSDP2) add to a block's saved
      activations per token (``cp.testing.activation_memory.SavedTensorBytes``, 1 block).

    The transformer is Cosmos-Predict2.5-2B's ``CosmosTransformer3DModel`` (2048 wide, 16 heads)
    in bfloat16 with LoRA r 32 on the attention projections computing in bfloat16 (as under FSDP2's
    mixed precision), one sample of ``frames`` x 16 x 16 latents (64 tokens per latent frame), 512
    text tokens 1,024 wide (the 100,352-wide projection's input is a formula term of the plan).
    Each moment is fitted as ``per_sample + per_token t`` through the two token counts. About 15
    minutes on 2 cores (the ``depth``-block runs take most of it).
    """
    import diffusers

    import cosmos_primitives as cp
    from cosmos_primitives.algo.flow_sde import gaussian_mean_kl
    from cosmos_primitives.config.policy import LoraConfig
    from cosmos_primitives.testing.activation_memory import SavedTensorBytes, peak_allocated_bytes

    dtype = torch.bfloat16
    lora = LoraConfig(r=32, lora_alpha=64.0, target_modules=["to_q", "to_k", "to_v", "to_out.0"])
    config = dict(cp.testing.COSMOS_PREDICT2_5_2B_TRANSFORMER, use_crossattn_projection=False)
    text, negative = torch.randn(1, 512, 1024), torch.randn(1, 512, 1024)
    sigmas = torch.tensor([1.0, 0.5, 0.0])

    def build(blocks: int, checkpointing: bool) -> Any:
        torch.manual_seed(0)
        model = diffusers.CosmosTransformer3DModel(**dict(config, num_layers=blocks)).to(dtype)
        policy = cp.policy.DiffusionPolicy(model, lora=lora, keep_reference=True, gradient_checkpointing=checkpointing)
        for p in policy.trainable_parameters():
            p.data = p.data.to(dtype)
        return policy

    def trained_step(policy: Any, latent_frames: int) -> dict[str, float]:
        velocity = policy.velocity_fn()
        traj = cp.algo.FlowTrajectory(
            latents=torch.randn(1, 2, 16, latent_frames, 16, 16), sigmas=sigmas, timesteps=sigmas[:-1] * 1000,
            sde_steps=torch.tensor([0]), log_probs=torch.zeros(1, 1), seeds=torch.tensor([0]), guidance_scale=4.5,
            sde=cp.algo.SDEParams())

        def forward() -> torch.Tensor:
            now = cp.algo.recompute_step(velocity, traj, 0, text, negative)
            with policy.reference() as reference:
                ref = cp.algo.recompute_step(reference, traj, 0, text, negative)
            return -now.log_prob.exp().mean() + 0.004 * gaussian_mean_kl(now.mean, ref.mean, now.std).mean()

        for p in policy.trainable_parameters():
            p.grad = torch.zeros_like(p)  # accumulated in place: the LoRA gradients stay out of the peaks
        forward_peak, saved, loss = peak_allocated_bytes(forward)
        backward_peak, _, _ = peak_allocated_bytes(loss.backward)
        return {"forward_peak": forward_peak, "saved": saved, "backward_peak": saved + backward_peak}

    figures: dict[str, Any] = {"source": f"benchmarks/bench_wfm_memory.py --figures, CPU, torch {torch.__version__}, "
                                         f"diffusers {diffusers.__version__}, {time.strftime('%Y-%m-%d')}",
                               "depth": depth, "width": 2048, "text_tokens": 512}
    policy = build(1, False)
    rollout = {}
    for f in frames:
        with torch.no_grad():
            rollout[f * 64], _, _ = peak_allocated_bytes(lambda f=f: cp.rollout.sample_flow(
                policy.velocity_fn(), text, latent_shape=(16, f, 16, 16), sigmas=sigmas, timesteps=sigmas[:-1] * 1000,
                seeds=[0], negative_text=negative, guidance_scale=4.5, sde=cp.algo.SDEParams(), sde_steps=[0]))
    figures["rollout"] = _linear(rollout)
    for checkpointing in (False, True):
        saved = {blocks: _linear({f * 64: trained_step(build(blocks, checkpointing), f)["saved"] for f in frames})
                 for blocks in (1, 2)}
        deep = build(depth, checkpointing)
        at_depth = {f * 64: trained_step(deep, f) for f in frames}
        figures["checkpointing" if checkpointing else "no_checkpointing"] = {
            "per_block": {k: saved[2][k] - saved[1][k] for k in ("per_sample", "per_token")},
            **{moment: _linear({t: v[moment] for t, v in at_depth.items()}) for moment in ("forward_peak",
                                                                                            "backward_peak")}}
        del deep
    saved_by_lora = {}
    for lora_dtype in (dtype, torch.float32):  # float32 adapters: one rank without FSDP2's mixed precision
        saved_by_lora[lora_dtype] = {}
        for f in frames:
            policy = build(1, False)
            for p in policy.trainable_parameters():
                p.data = p.data.to(lora_dtype)
            with SavedTensorBytes(policy.transformer) as saved:
                policy.velocity_fn()(torch.randn(1, 16, f, 16, 16), torch.tensor([500.0]), text)
            saved_by_lora[lora_dtype][f * 64] = saved.bytes
    per_token = {d: _linear(points)["per_token"] for d, points in saved_by_lora.items()}
    figures["lora_float32_inputs"] = {"per_token_per_block": per_token[torch.float32] - per_token[dtype],
                                      "layers": 6}  # to_q, to_k, to_v, to_out.0 of attn1; to_q, to_out.0 of attn2
    vae = diffusers.AutoencoderKLWan().eval().requires_grad_(False)  # the Wan2.1 VAE's config (diffusers' defaults)
    decoded = {}
    for latent in ((6, 8, 8), (4, 16, 16)):
        with torch.no_grad():
            decoded[latent], _, video = peak_allocated_bytes(
                lambda latent=latent: cp.rollout.decode_video(vae, torch.randn(1, 16, *latent)))
        decoded[latent] = (decoded[latent], video.shape[-2] * video.shape[-1], video.shape[2])
    (a, px1, f1), (b, px2, f2) = decoded.values()
    # a = px1 (per_pixel + f1 per_pixel_frame), b = px2 (per_pixel + f2 per_pixel_frame)
    per_pixel_frame = (a / px1 - b / px2) / (f1 - f2)
    figures["vae_decode"] = {"per_pixel": a / px1 - f1 * per_pixel_frame, "per_pixel_frame": per_pixel_frame}
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes (CI)")
    parser.add_argument("--figures", action="store_true", help="measure the plan's per-token figures on the CPU")
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--samples", type=int, default=2)
    args = parser.parse_args(argv)
    run: Callable[[], Any]
    if args.figures:
        run = measure_figures
    else:
        def run() -> Result:
            return flowgrpo_memory_2b(args.dry_run, samples=args.samples, micro_batch=args.micro_batch)
    print(json.dumps(run(), indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
