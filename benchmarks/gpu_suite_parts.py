"""The parts of the GPU validation pack (``benchmarks/gpu_suite.py``), one function each.

Each part takes ``dry`` (tiny shapes on whatever device is there, for CI's dry run) and a work
folder, and returns ``{"figures": {...}, "notes": [...]}``; ``gpu_suite.py`` runs each in its own
process under its own time box, so one part's crash, hang or out-of-memory cannot stop another.
Model shapes follow the published configs; weights are random (nothing can be downloaded there).
"""

from __future__ import annotations

import gc
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_sft_mfu import synchronize  # noqa: E402
from bench_weight_sync import module_with, qwen_like_shapes  # noqa: E402
from gpu_parts_speed import (  # noqa: E402
    attention,
    device,
    flowgrpo_memory,
    heads,
    probes,
    rollout,
    sft_ablations,
    sft_recheck,
)

Result = dict[str, Any]


def _peak_gib(dev: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None


def weight_sync_7b(dry: bool, work: Path) -> Result:
    """In-process (colocated) sync of a Qwen2.5-7B-shaped bf16 state dict: shared storage and a copy
    into preallocated engine tensors; median of 5 after a first (checked) sync."""
    from cosmos_primitives.sync import InProcessSync

    dev = device()
    if dry:
        shapes = qwen_like_shapes(hidden=64, layers=2, ffn=128, kv=16, vocab=512, tied=False)
    else:
        shapes = qwen_like_shapes(hidden=3584, layers=28, ffn=18944, kv=512, vocab=152064, tied=False)
    trainer = module_with(shapes, torch.bfloat16, str(dev), fill=True)
    nbytes = sum(p.numel() * p.element_size() for p in trainer.parameters())
    figures: dict[str, Any] = {"state_dict_gb": nbytes / 1e9, "tensors": len(shapes)}
    for share in (True, False):
        engine = module_with(shapes, torch.bfloat16, str(dev), fill=False)
        sync = InProcessSync(trainer, engine, share=share)
        first = sync.sync(version=0)
        times = sorted(sync.sync(version=v).seconds for v in range(1, 6))
        key = "shared" if share else "copy"
        figures[f"{key}_ms"] = times[2] * 1e3
        figures[f"{key}_first_verified"] = bool(first.verified)
        del engine, sync
    figures["copy_gb_per_s"] = nbytes / (figures["copy_ms"] / 1e3) / 1e9
    return {"figures": figures, "notes": ["target <= 50 ms for the 7B sync on an H100"]}


def qwen2_5_vl_3b_config() -> Any:
    """Qwen2.5-VL-3B's published shape: text 36 layers x 2048 (16 heads, 2 KV, MLP 11008, tied
    embeddings), vision 32 blocks x 1280 (16 heads, MLP 3420, full attention at 7 / 15 / 23 / 31)."""
    from cosmos_primitives.testing.models import tiny_qwen2_5_vl_config

    config = tiny_qwen2_5_vl_config(hidden_size=2048, num_layers=36, vision_depth=32)
    text, vision = config.text_config, config.vision_config
    text.intermediate_size, text.num_attention_heads, text.num_key_value_heads = 11008, 16, 2
    text.rope_parameters["mrope_section"] = [16, 24, 24]
    vision.hidden_size, vision.intermediate_size, vision.num_heads = 1280, 3420, 16
    vision.fullatt_block_indexes = [7, 15, 23, 31]
    return config


def _run_recipe(name: str, script: str, config: str, overrides: list[str], out: Path, log: Path,
                timeout_s: float, dry: bool) -> list[dict]:
    """Run one example as a user would; return its metrics rows (raises with the log tail on failure).

    A dry run forks it from this process (the part, which has imported the pack's preload) rather
    than starting an interpreter that imports torch, transformers and diffusers again."""
    from cosmos_primitives.logging.tracker import read_metrics
    from cosmos_primitives.testing.forked_script import start_script
    from cosmos_primitives.utils import latest_run_dir

    args = [str(REPO / "examples" / script), "--config", str(REPO / "examples" / "configs" / config),
            f"train.output_dir={out}", *overrides]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(
        [str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    if dry:
        log.unlink(missing_ok=True)
        proc = start_script(args, log, cwd=REPO, env=env, here=True)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
    else:
        with log.open("wb") as f:
            proc = subprocess.run([sys.executable, *args], cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT,
                                  timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} exited with {proc.returncode}; last lines of {log}:\n"
                           f"{log.read_text(errors='replace')[-3000:]}")
    run_dir = latest_run_dir(out)
    if run_dir is None:
        raise RuntimeError(f"{name} wrote no run directory under {out}")
    return read_metrics(run_dir)


def grpo_step_vl3b(dry: bool, work: Path) -> Result:
    """Colocated GRPO steps of ``examples/grpo_vlm.py`` (HF engine) on a Qwen2.5-VL-3B-shaped random
    model in bf16: the time split of the last step (rollout, reward, log-probs, update, sync)."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    from cosmos_primitives.testing.models import tiny_qwen2_5_vl_processor

    dev = device()
    model_dir = work / "qwen2_5_vl_3b_random"
    if dry:
        overrides = ["custom.demo_items=16", "grpo.rollout_batch_size=2", "grpo.num_samples_per_prompt=2",
                     "rollout.max_response_length=4", "train.max_steps=1",
                     f"policy.model_name_or_path=demo:{work / 'tiny_vl'}"]
    else:
        torch.manual_seed(0)
        with torch.device(dev):
            model = Qwen2_5_VLForConditionalGeneration(qwen2_5_vl_3b_config()).to(torch.bfloat16)
        model.generation_config.pad_token_id = 151643
        model.generation_config.eos_token_id = [151645, 151643]
        model.save_pretrained(model_dir)
        tiny_qwen2_5_vl_processor().save_pretrained(model_dir)
        del model
        gc.collect()
        torch.cuda.empty_cache()  # the recipe runs in another process: hand it this process's cached 16 GB
        overrides = ["custom.demo_items=64", "policy.dtype=bfloat16", "train.max_steps=2",
                     f"policy.model_name_or_path={model_dir}"]
    overrides += [f"train.train_policy.dataset.name=demo:{work / 'colour_mcq' / 'train.jsonl'}",
                  "train.ckpt.export_safetensors=false"]
    rows = _run_recipe("grpo_vlm.py", "grpo_vlm.py", "grpo_tiny.toml", overrides, work / "grpo_out",
                       work / "grpo.log", timeout_s=100 if not dry else 60, dry=dry)
    last = rows[-1]
    phases = {p: float(last[f"time/{p}"]) for p in ("rollout", "reward", "logprobs", "update", "sync")
              if f"time/{p}" in last}
    figures: dict[str, Any] = {"steps": len(rows), "step_s": float(last.get("time/step", sum(phases.values())))}
    figures.update({f"{p}_s": v for p, v in phases.items()})
    figures["response_length"] = float(last.get("response_length", math.nan))
    return {"figures": figures, "notes": ["figures of the last step (the first includes warm-up)"]}


def flowgrpo_step_2b(dry: bool, work: Path, dtype: torch.dtype | None = None) -> Result:
    """One FlowGRPO step (SDE rollout recording log-probs, recompute of the trained steps, loss,
    backward, AdamW on LoRA adapters) of a Cosmos-Predict2-2B-shaped random ``CosmosTransformer3DModel``
    in bf16: seconds per phase and peak memory."""
    diffusers = __import__("diffusers")
    import cosmos_primitives as cp
    from cosmos_primitives.algo.flow_grpo import flow_grpo_loss
    from cosmos_primitives.algo.flow_sde import SDEParams
    from cosmos_primitives.algo.flow_step import recompute_step
    from cosmos_primitives.config.policy import LoraConfig
    from cosmos_primitives.models.flow_transformers import cosmos_velocity_fn
    from cosmos_primitives.rollout.flow_sampler import sample_flow

    dev = device()
    torch.manual_seed(0)
    if dry:
        from cosmos_primitives.testing.models import tiny_cosmos_transformer

        transformer, channels, text_dim = tiny_cosmos_transformer(latent_channels=4, text_dim=32), 4, 32
        latent, batch, text_len, steps, trained = (4, 1, 8, 8), 2, 8, 4, [1, 2]
        dtype = dtype or torch.float32
    else:
        channels, text_dim = 16, 1024
        with torch.device(dev):
            transformer = diffusers.CosmosTransformer3DModel(
                in_channels=channels + 1, out_channels=channels, num_attention_heads=16, attention_head_dim=128,
                num_layers=28, mlp_ratio=4.0, text_embed_dim=text_dim, adaln_lora_dim=256,
                max_size=(128, 240, 240), patch_size=(1, 2, 2), rope_scale=(1.0, 3.0, 3.0),
                concat_padding_mask=True, extra_pos_embed_type=None)
        # 93 frames at 432 x 768 in the recipe are 24 x 54 x 96 latents; a quarter of the frames keeps
        # the step inside the time box
        latent, batch, text_len, steps, trained = (channels, 6, 54, 96), 4, 512, 10, [1, 2]
        dtype = torch.bfloat16
    transformer.to(device=dev, dtype=dtype)
    cp.policy.apply_lora(transformer, LoraConfig(r=16, lora_alpha=32.0,
                                                 target_modules=["to_q", "to_k", "to_v", "to_out.0"]))
    for p in transformer.parameters():
        if p.requires_grad:
            p.data = p.data.float()
    optimizer = torch.optim.AdamW([p for p in transformer.parameters() if p.requires_grad], lr=1e-4)
    velocity = cosmos_velocity_fn(transformer)
    text = torch.randn(batch, text_len, text_dim, device=dev, dtype=dtype)
    sigmas = torch.linspace(1.0, 0.0, steps + 1)
    timesteps = sigmas[:-1] * 1000.0
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    synchronize(dev)
    start = time.perf_counter()
    with torch.no_grad(), torch.autocast(dev.type, dtype=dtype, enabled=dtype != torch.float32):
        trajectory = sample_flow(velocity, text, latent_shape=latent, sigmas=sigmas, timesteps=timesteps,
                                 seeds=list(range(batch)), sde=SDEParams(), sde_steps=trained)
    synchronize(dev)
    rollout_s = time.perf_counter() - start
    advantages = torch.randn(batch, device=dev)
    start = time.perf_counter()
    losses = []
    for k, step in enumerate(trajectory.sde_steps.tolist()):
        with torch.autocast(dev.type, dtype=dtype, enabled=dtype != torch.float32):
            new = recompute_step(velocity, trajectory, step, text)
        out = flow_grpo_loss(new.log_prob, trajectory.log_probs[:, k], advantages, clip_range=1e-3)
        out.loss.backward()
        losses.append(float(out.loss.detach()))
    torch.nn.utils.clip_grad_norm_([p for p in transformer.parameters() if p.requires_grad], 1.0)
    optimizer.step()
    synchronize(dev)
    train_s = time.perf_counter() - start
    params = sum(p.numel() for p in transformer.parameters())
    return {"figures": {
        "transformer_params_b": params / 1e9, "latent_shape": list(latent), "samples": batch,
        "inference_steps": steps, "trained_steps": len(trained), "rollout_s": rollout_s, "train_s": train_s,
        "step_s": rollout_s + train_s, "peak_memory_gib": _peak_gib(dev),
        "losses_finite": all(math.isfinite(v) for v in losses)},
        "notes": ["no VAE decode or reward (random transformer); latents are a quarter of the recipe's frames"]}


RECIPES = {
    # name: (script, config, overrides for a short run, the metric compared across dtypes or None)
    "sft": ("sft.py", "sft_tiny.toml", ["train.max_steps=2", "train.ckpt.enable_checkpoint=false",
                                        "train.ckpt.export_safetensors=false"], "loss"),
    "grpo": ("grpo_vlm.py", "grpo_tiny.toml", ["train.max_steps=2", "train.ckpt.export_safetensors=false",
                                               "grpo.rollout_batch_size=2", "grpo.num_samples_per_prompt=4",
                                               "rollout.max_response_length=8", "custom.demo_items=16"], None),
    "flowgrpo": ("wfm_rl.py", "wfm_flowgrpo_tiny.toml", ["train.max_steps=2"], None),
    "ddrl": ("wfm_rl.py", "wfm_ddrl_tiny.toml", ["train.max_steps=2"], None),
}
"""GRPO and FlowGRPO sample their training data, so a low-precision run trains on other samples
than the float32 run: only finiteness is checked there. SFT's first loss is compared."""

LOSS_TOLERANCE = 0.02
"""Relative difference allowed between the bf16 and the float32 first-step loss."""


def _is_loss(metric: str) -> bool:
    """``loss`` (VLM recipes), ``policy_loss`` / ``data_loss`` (wfm_rl.py), ``loss/...``."""
    return metric == "loss" or metric.endswith("_loss") or metric.startswith("loss/")


def recipes_bf16(dry: bool, work: Path) -> Result:
    """Each recipe's tiny config for two steps (one in a dry run) in float32 and in bf16: finite losses, and the same
    first-step loss as float32 within ``LOSS_TOLERANCE`` where the first step is deterministic."""
    names = ["sft", "flowgrpo"] if dry else list(RECIPES)
    low = "float32" if dry else "bfloat16"
    figures: dict[str, Any] = {"low_precision": low}
    failures = []
    for name in names:
        script, config, overrides, compared = RECIPES[name]
        runs = {}
        for dtype in dict.fromkeys(["float32", low]):
            extra = [f"policy.dtype={dtype}"]
            if script == "grpo_vlm.py":
                extra.append(f"train.train_policy.dataset.name=demo:{work / 'colour_mcq' / 'train.jsonl'}")
            if dry:
                extra.append("train.max_steps=1")
            rows = _run_recipe(name, script, config, [*overrides, *extra], work / f"{name}_{dtype}",
                               work / f"{name}_{dtype}.log", timeout_s=60, dry=dry)
            losses = [float(v) for r in rows for k, v in r.items() if _is_loss(k)]
            runs[dtype] = rows
            finite = bool(losses) and all(math.isfinite(v) for v in losses)
            figures[f"{name}_{dtype}_losses_finite"] = finite
            if not finite:
                failures.append(f"{name} {dtype}: losses {losses}")
        if compared and low != "float32":
            ref, got = float(runs["float32"][0][compared]), float(runs[low][0][compared])
            rel = abs(got - ref) / max(abs(ref), 1e-12)
            figures[f"{name}_first_{compared}_float32"] = ref
            figures[f"{name}_first_{compared}_{low}"] = got
            figures[f"{name}_first_{compared}_rel_diff"] = rel
            if rel > LOSS_TOLERANCE:
                failures.append(f"{name}: first {compared} {got} in {low} vs {ref} in float32 "
                                f"(relative {rel:.3g} > {LOSS_TOLERANCE})")
    if failures:
        raise RuntimeError("; ".join(failures))
    notes = [f"first-step loss tolerance {LOSS_TOLERANCE:.0%} (relative) where compared"]
    if dry:
        notes.append("dry run: sft and flowgrpo in float32 only (bf16 on a CPU is too slow for the time box)")
    return {"figures": figures, "notes": notes}



PARTS = {
    "probes": (probes, 40),
    "attention": (attention, 30),
    "heads": (heads, 45),
    "sft_ablations": (sft_ablations, 210),
    "flowgrpo_memory": (flowgrpo_memory, 110),
    "rollout": (rollout, 130),
    "grpo_step_vl3b": (grpo_step_vl3b, 90),
    "weight_sync_7b": (weight_sync_7b, 30),
    "flowgrpo_step_2b": (flowgrpo_step_2b, 60),
    "recipes_bf16": (recipes_bf16, 240),
    "sft_recheck": (sft_recheck, 120),
}
"""Each part's function and its time box in seconds on a GPU. On an H200 on 2026-11-27 the older
parts took: weight_sync_7b 7 s, grpo_step_vl3b 72 s, flowgrpo_step_2b 29 s, recipes_bf16 178 s."""

COMMANDS = {
    1: ["probes", "attention", "heads", "sft_ablations"],
    2: ["flowgrpo_memory", "rollout", "grpo_step_vl3b"],
    3: ["weight_sync_7b", "flowgrpo_step_2b", "recipes_bf16"],
    4: ["sft_recheck", "flowgrpo_memory", "grpo_step_vl3b"],
}
"""The device commands of a session (``gpu_suite.py --command N``), each inside COMMAND_BOX_S: the
first holds what decides most (what the machine offers, attention, heads, the SFT ablations with
their baseline run again), the second the world-model memory, rollout and a GRPO step; the third
re-checks what earlier sessions measured (run it only with time to spare); the fourth re-measures,
after fixes, what the first two found (the first H100 run of 2026-11-27)."""

COMMAND_BOX_S = 330
"""A command's parts together, in seconds: with the wheels' install, inside 6 minutes."""
