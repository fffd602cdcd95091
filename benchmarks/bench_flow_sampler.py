"""Cost of recording a rollout: the flow sampler (SDE steps, per-sample noise generators, per-step
log-probs, every latent kept) against a plain Euler denoising loop on the same transformer.

    .venv/bin/python benchmarks/bench_flow_sampler.py [--repeats 5] [--threads 1]

Two models: the tiny test transformer (worst case: the forward pass costs almost nothing, so any
bookkeeping shows) and a small Wan-style transformer with realistic proportions (4 blocks of
width 256, 320 latent tokens per sample). Target: at most 1.1x on the small one.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from cosmos_primitives.algo.flow_sde import SDEParams
from cosmos_primitives.models.flow_transformers import diffusers_velocity_fn
from cosmos_primitives.rollout.flow_sampler import flow_sigmas, sample_flow
from cosmos_primitives.testing import tiny_flow_scheduler, tiny_wan_transformer
from cosmos_primitives.utils.extras import require


def small_wan(seed: int = 0) -> torch.nn.Module:
    diffusers = require("diffusers", "the benchmark model")
    torch.manual_seed(seed)
    return diffusers.WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=64, in_channels=16, out_channels=16,
        text_dim=256, freq_dim=256, ffn_dim=1024, num_layers=4, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=1024,
    ).eval()


@torch.no_grad()
def plain_loop(velocity: Callable, text: torch.Tensor, latent_shape: tuple[int, ...], sigmas: torch.Tensor,
               timesteps: torch.Tensor, seed: int) -> torch.Tensor:
    """The baseline: one batched noise draw, then Euler steps keeping only the current latents."""
    x = torch.randn((text.shape[0], *latent_shape), generator=torch.Generator().manual_seed(seed))
    for i in range(timesteps.shape[0]):
        v = velocity(x, timesteps[i].expand(text.shape[0]), text)
        x = x + v * (sigmas[i + 1] - sigmas[i])
    return x


def timed(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds per call of each function, run interleaved (a load change hits all alike)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()  # warm-up
    for r in range(repeats):
        names = list(fns)
        for name in names[r % len(names):] + names[: r % len(names)]:
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def bench(name: str, model: torch.nn.Module, batch: int, latent_shape: tuple[int, ...], text_len: int,
          text_dim: int, steps: int, repeats: int) -> None:
    velocity = diffusers_velocity_fn(model)
    text = torch.randn(batch, text_len, text_dim, generator=torch.Generator().manual_seed(0))
    sigmas, timesteps = flow_sigmas(tiny_flow_scheduler(), steps)
    seeds = list(range(batch))
    t = timed({
        "plain": lambda: plain_loop(velocity, text, latent_shape, sigmas, timesteps, 0),
        "sde": lambda: sample_flow(velocity, text, latent_shape=latent_shape, sigmas=sigmas, timesteps=timesteps,
                                   seeds=seeds, sde=SDEParams()),
        "ode": lambda: sample_flow(velocity, text, latent_shape=latent_shape, sigmas=sigmas, timesteps=timesteps,
                                   seeds=seeds),
    }, repeats)
    print(f"{name:>6}: batch {batch}, latents {latent_shape}, {steps} steps | plain loop {t['plain'] * 1e3:8.1f} ms | "
          f"sampler SDE + log-probs {t['sde'] * 1e3:8.1f} ms ({t['sde'] / t['plain']:.3f}x) | "
          f"sampler ODE {t['ode'] * 1e3:8.1f} ms ({t['ode'] / t['plain']:.3f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    bench("tiny", tiny_wan_transformer(seed=0).eval(), 8, (4, 1, 8, 8), 8, 32, 10, args.repeats)
    bench("small", small_wan(), 2, (16, 5, 16, 16), 32, 256, 10, args.repeats)


if __name__ == "__main__":
    main()
