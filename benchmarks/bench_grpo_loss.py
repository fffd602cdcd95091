"""Cost of ``cp.algo.grpo_loss`` and ``cp.rewards.RewardSet`` against bare baselines measured in the same run.

    .venv/bin/python benchmarks/bench_grpo_loss.py [--batch 32] [--tokens 512] [--repeats 20]

Baselines: a hand-written PPO-clip token-mean loss (forward + backward) and a plain Python loop over
the two rule-based rewards. Prints milliseconds per call and the ratio to the baseline.
"""

from __future__ import annotations

import argparse
import time

import torch

import cosmos_primitives as cp
from cosmos_primitives.config import GRPOConfig


def bare_ppo(logprobs, old, adv, mask):
    ratio = torch.exp(logprobs - old)
    a = adv.unsqueeze(1)
    loss = -torch.minimum(ratio * a, ratio.clamp(0.8, 1.2) * a)
    return (loss * mask).sum() / mask.sum()


def timed(fn, repeats: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e3


def row(label: str, ms: float, baseline_ms: float) -> None:
    print(f"  {label:<40} {ms:8.3f} ms  ratio {ms / baseline_ms:5.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    b, t = args.batch, args.tokens
    logprobs = (-torch.rand(b, t) * 3).requires_grad_()
    old = logprobs.detach() + 0.1 * torch.randn(b, t)
    ref = logprobs.detach() + 0.1 * torch.randn(b, t)
    entropy = torch.rand(b, t, requires_grad=True)
    adv = torch.randn(b)
    mask = (torch.rand(b, t) > 0.2).float()

    def step(loss_fn):
        def run():
            logprobs.grad = None
            entropy.grad = None
            loss_fn().backward()
        return run

    base = timed(step(lambda: bare_ppo(logprobs, old, adv, mask)), args.repeats)
    plain = timed(step(lambda: cp.algo.grpo_loss(logprobs, old, adv, mask, cfg=GRPOConfig())[0]), args.repeats)
    full_cfg = GRPOConfig(kl_beta=0.01, entropy_coeff=0.001)
    full = timed(step(lambda: cp.algo.grpo_loss(logprobs, old, adv, mask, cfg=full_cfg, ref_logprobs=ref,
                                                entropy=entropy)[0]), args.repeats)
    print(f"loss forward+backward, [{b}, {t}] float32, CPU threads {torch.get_num_threads()}")
    row("bare PPO-clip (baseline)", base, base)
    row("grpo_loss default (dual clip, metrics)", plain, base)
    row("grpo_loss + k3 KL + entropy bonus", full, base)

    n = 1024
    completions = ["<think>" + "reason " * 50 + f"</think>\n\n<answer>{'ABCD'[i % 4]}</answer>" for i in range(n)]
    references = ["ABCD"[i % 3] for i in range(n)]
    rewards = cp.rewards.RewardSet({"format": 1.0, "single_choice": 1.0})

    def loop():
        return [cp.rewards.format_reward(c) + cp.rewards.single_choice_reward(c, r)
                for c, r in zip(completions, references)]

    assert loop() == rewards(completions, references).totals
    base_r = timed(loop, max(args.repeats // 4, 1))
    set_r = timed(lambda: rewards(completions, references), max(args.repeats // 4, 1))
    print(f"rewards format + single_choice, {n} completions")
    row("plain loop (baseline)", base_r, base_r)
    row("RewardSet", set_r, base_r)


if __name__ == "__main__":
    main()
