"""Cost of one world-model RL step (rollout + update, the reward left out) for FlowGRPO on every SDE
step, FlowGRPO with a 3-step SDE window (MixGRPO / Flow-GRPO-Fast) and DiffusionNFT, on the same tiny
LoRA setup as ``examples/configs/wfm_flowgrpo_tiny.toml``:

    .venv/bin/python benchmarks/bench_wfm_step.py [--steps 4] [--threads 1]

Reported per variant: median seconds per step, transformer forward passes per sample per step
(rollout + training; a batched call counts once per sample in it), and both as ratios to FlowGRPO
on every step, measured in the same run with the steps of the variants interleaved.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import cosmos_primitives as cp
from cosmos_primitives.algo.flow_sde import SDEParams
from cosmos_primitives.config import WFMConfig
from cosmos_primitives.config.policy import LoraConfig
from cosmos_primitives.policy import DiffusionPolicy, diffusion_nft_update, flow_grpo_update
from cosmos_primitives.rollout.flow_sampler import flow_sigmas, sample_flow, sde_window
from cosmos_primitives.testing import tiny_flow_scheduler, tiny_wan_transformer

SAMPLES, STEPS, TEXT_DIM = 32, 10, 32
LORA = LoraConfig(r=8, lora_alpha=16.0, target_modules=["to_q", "to_k", "to_v", "to_out.0", "proj_out", "ffn.net.2"])


class Variant:
    """A policy with its optimizer, and a counter of samples seen by the transformer's forward."""

    def __init__(self, name: str, w: WFMConfig, window: int) -> None:
        self.name, self.w, self.window = name, w, window
        self.policy = DiffusionPolicy(tiny_wan_transformer(seed=0, text_dim=TEXT_DIM), lora=LORA)
        self.optimizer = torch.optim.AdamW(self.policy.trainable_parameters(), lr=1e-3)
        self.forwards = 0
        self.policy.transformer.register_forward_hook(self._count)
        self.times: list[float] = []

    def _count(self, module: torch.nn.Module, args: tuple, kwargs_or_out: object) -> None:
        self.forwards += int(module._last_batch)

    def step(self, k: int, text: torch.Tensor, sigmas: torch.Tensor, timesteps: torch.Tensor) -> None:
        nft = self.w.algorithm == "diffusion_nft"
        velocity = self.policy.velocity_fn()
        started = time.perf_counter()
        steps = None if nft else sde_window(STEPS, self.window, (0, 6) if self.window else (),
                                            torch.Generator().manual_seed(k))
        traj = sample_flow(velocity, text, latent_shape=(4, 1, 8, 8), sigmas=sigmas, timesteps=timesteps,
                           seeds=[1000 * k + i for i in range(SAMPLES)], sde=None if nft else SDEParams(),
                           sde_steps=steps)
        rewards = traj.samples.mean(dim=(1, 2, 3, 4))  # brightness-like, in-process: the same for every variant
        adv = cp.algo.flow_grpo_advantages(rewards, torch.arange(2).repeat_interleave(SAMPLES // 2))
        gen = torch.Generator().manual_seed(k)
        if nft:
            diffusion_nft_update(self.policy, velocity, self.optimizer, samples=traj.samples, text=text,
                                 advantages=adv, wfm=self.w, grad_clip=1.0, nonfinite="stop", generator=gen, step=k)
        else:
            flow_grpo_update(self.policy, velocity, self.optimizer, trajectory=traj, text=text, advantages=adv,
                             wfm=self.w, grad_clip=1.0, nonfinite="stop", rng={"train_steps": gen}, step=k)
        self.times.append(time.perf_counter() - started)


def patch_batch_counter(transformer: torch.nn.Module) -> None:
    """Record each forward call's batch size for the counting hook."""
    def pre(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        module._last_batch = kwargs["hidden_states"].shape[0]

    transformer.register_forward_pre_hook(pre, with_kwargs=True)


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4, help="measured RL steps per variant (after 1 warm-up)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    sigmas, timesteps = flow_sigmas(tiny_flow_scheduler(), STEPS)
    text = torch.randn(SAMPLES, 8, TEXT_DIM, generator=torch.Generator().manual_seed(0))
    base = dict(num_samples_per_prompt=SAMPLES // 2, num_inference_steps=STEPS, clip_range=1e-3)
    variants = [Variant("flow_grpo (all 10 steps SDE)", WFMConfig(algorithm="flow_grpo", **base), 0),
                Variant("flow_grpo + window of 3", WFMConfig(algorithm="flow_grpo", **base), 3),
                Variant("diffusion_nft", WFMConfig(algorithm="diffusion_nft", nft_num_timesteps=1, **base), 0)]
    for v in variants:
        patch_batch_counter(v.policy.transformer)
        v.step(0, text, sigmas, timesteps)  # warm-up
        v.times.clear()
        v.forwards = 0
    for k in range(1, args.steps + 1):
        for v in variants:  # interleaved: a load change hits all variants alike
            v.step(k, text, sigmas, timesteps)
    out: dict[str, dict[str, float]] = {}
    ref = variants[0]
    ref_s, ref_f = statistics.median(ref.times), ref.forwards / (args.steps * SAMPLES)
    print(f"{SAMPLES} samples per step, {STEPS} denoising steps, tiny Wan + LoRA r 8, {args.threads} thread(s)")
    print(f"{'variant':32s} {'s/step':>8s} {'ratio':>6s} {'fwd/sample':>11s} {'ratio':>6s}")
    for v in variants:
        sec, fwd = statistics.median(v.times), v.forwards / (args.steps * SAMPLES)
        out[v.name] = {"s_per_step": sec, "forwards_per_sample": fwd, "time_ratio": sec / ref_s,
                       "forward_ratio": fwd / ref_f}
        print(f"{v.name:32s} {sec:8.3f} {sec / ref_s:6.2f} {fwd:11.1f} {fwd / ref_f:6.2f}")
    return out


if __name__ == "__main__":
    main()
