"""One decode step of the HF engine's sampler, ``InverseCDFSampler``, against the way it sampled before.

    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=2147483647 OMP_NUM_THREADS=1 \
        .venv/bin/python benchmarks/bench_token_sampler.py [--rows 64] [--vocab 151936] [--repeats 30]

(the allocator setting is the suite's: without it each fresh ``[B, V]`` buffer is page-faulted in
again and allocation dominates both sides.) Baseline, measured in the same run: the step as it
was, a full ``[B, V]`` log-softmax, its ``exp`` and its cumulative sum searched for the uniform, the
token's log-prob read from the log-softmax. Now: one softmax, per-block sums, the cumulative sum of
one block. Variants: temperature 1 and 0.7 (no top-k / top-p), top-p 0.9, and greedy (unchanged:
a check that the baseline's share is the same). Each line prints milliseconds per step (median of
``--repeats``), the ratio to the baseline, how many rows drew the same token from the same uniform,
and the largest difference of the recorded log-probs.
"""

from __future__ import annotations

import argparse

import torch

from cosmos_primitives.algo.sampling_distribution import sampling_logprobs
from cosmos_primitives.rollout.token_sampler import InverseCDFSampler
from timing import median_seconds


def previous_step(scores: torch.Tensor, temperature: float, top_p: float,
                  u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampler's step before the change: (``[B]`` tokens, ``[B]`` log-probs), the ``[B, V]`` output made too."""
    logits = scores.float()
    if temperature == 0:
        logprobs = torch.log_softmax(logits, dim=-1)
        token = logprobs.argmax(dim=-1, keepdim=True)
    else:
        logprobs = sampling_logprobs(logits, temperature, -1, top_p)
        cdf = logprobs.exp().cumsum(dim=-1)
        token = torch.searchsorted(cdf, u * cdf[:, -1:]).clamp_max(cdf.shape[-1] - 1)
    torch.full_like(scores, float("-inf")).scatter_(-1, token, 0.0)
    return token.squeeze(-1), logprobs.gather(-1, token).squeeze(-1)


def current_step(scores: torch.Tensor, temperature: float, top_p: float,
                 seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    sampler = InverseCDFSampler(temperature, top_p=top_p, generator=torch.Generator().manual_seed(seed))
    sampler(torch.zeros(scores.shape[0], 1, dtype=torch.long), scores)
    tokens, logprobs = sampler.token_logprobs()
    return tokens[:, 0], logprobs[:, 0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch.manual_seed(0)
    scores = torch.randn(args.rows, args.vocab) * 4
    seed = 1234
    u = torch.rand(args.rows, 1, generator=torch.Generator().manual_seed(seed))  # the sampler's first uniforms
    print(f"one decode step, [{args.rows}, {args.vocab}] float32 logits, {torch.get_num_threads()} threads")
    for temperature, top_p in ((1.0, 1.0), (0.7, 1.0), (1.0, 0.9), (0.0, 1.0)):
        before = median_seconds(lambda t=temperature, p=top_p: previous_step(scores, t, p, u), args.repeats) * 1e3
        after = median_seconds(lambda t=temperature, p=top_p: current_step(scores, t, p, seed), args.repeats) * 1e3
        old_tokens, old_lp = previous_step(scores, temperature, top_p, u)
        new_tokens, new_lp = current_step(scores, temperature, top_p, seed)
        label = "greedy" if temperature == 0 else f"temperature {temperature}"
        label += f" top-p {top_p}" if top_p < 1 else ""
        print(f"  {label:<24} before {before:7.2f} ms  now {after:7.2f} ms  ratio {after / before:5.2f}  "
              f"same tokens {int((old_tokens == new_tokens).sum())}/{args.rows}  "
              f"max |log-prob diff| {float((old_lp - new_lp).abs().max()):.2e}")


if __name__ == "__main__":
    main()
