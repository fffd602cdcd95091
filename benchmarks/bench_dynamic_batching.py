"""GRPO dynamic batching vs fixed micro-batches: padded tokens and update time.

A batch whose row lengths spread 10x (as video prompts do) is updated twice by ``cp.policy.grpo_update``
on a tiny Qwen2: micro-batches of ``mini_batch`` rows at the batch's full width (fixed), and micro-batches
under ``[train.train_policy] max_token_len_per_mini_batch = mini_batch x longest row`` (dynamic: the same
peak tokens per forward as the fixed split, so the same memory). Prints the padded tokens the forwards
process and the update's seconds, each ratio dynamic / fixed.

    PYTHONPATH=src python benchmarks/bench_dynamic_batching.py [--rows 32] [--min-len 32] [--spread 10]
"""

from __future__ import annotations

import argparse
import copy
import random
import time
from pathlib import Path

import torch

import cosmos_primitives as cp
from cosmos_primitives import testing as cpt
from cosmos_primitives.data.rollout_batch import RolloutBatch
from cosmos_primitives.data.token_budget import padded_tokens, token_budget_micro_batches
from cosmos_primitives.policy import CausalLMPolicy, GRPOUpdateSettings, grpo_update

CONFIG = Path(__file__).resolve().parents[1] / "examples" / "configs" / "grpo_tiny.toml"


def spread_batch(rows: int, min_len: int, spread: float, vocab: int, seed: int) -> RolloutBatch:
    """``rows`` rows of ``min_len`` .. ``spread x min_len`` tokens (uniform), a quarter of each the prompt."""
    rng = random.Random(seed)
    lengths = [rng.randint(min_len, int(min_len * spread)) for _ in range(rows)]
    lengths[0], lengths[1] = int(min_len * spread), min_len  # the spread is the batch's, whatever the draw
    width = max(lengths)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (rows, width), generator=gen)
    attention = torch.zeros(rows, width, dtype=torch.long)
    completion = torch.zeros(rows, width)
    for i, n in enumerate(lengths):
        attention[i, :n] = 1
        completion[i, n // 4 : n] = 1.0
    zeros = torch.zeros(rows, dtype=torch.long)
    return RolloutBatch(inputs={"input_ids": ids * attention, "attention_mask": attention},
                        completion_mask=completion, rollout_logprobs=-8.0 * completion,
                        group_index=torch.arange(rows) // 8, completion_lengths=completion.sum(-1).long(),
                        weight_versions=zeros, images_per_row=zeros, videos_per_row=zeros)


def timed_update(model: torch.nn.Module, batch: RolloutBatch, overrides: list[str], repeats: int) -> float:
    """Best of ``repeats`` seconds of one ``grpo_update`` (forwards, backwards, one SGD step)."""
    cfg = cp.load_config(CONFIG, ["rollout.sampling_config.temperature=1.0", "train.optm_warmup_steps=0",
                                  *overrides])
    advantages = torch.linspace(-1.0, 1.0, len(batch))
    best = float("inf")
    for _ in range(repeats):
        policy = CausalLMPolicy(copy.deepcopy(model))
        optimizer = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=1e-3)
        start = time.perf_counter()
        grpo_update(policy, None, optimizer, batch, advantages, GRPOUpdateSettings.from_config(cfg))
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--min-len", type=int, default=32)
    parser.add_argument("--spread", type=float, default=10.0)
    parser.add_argument("--mini-batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    model = cpt.tiny_qwen2(seed=args.seed)
    batch = spread_batch(args.rows, args.min_len, args.spread, model.config.vocab_size, args.seed)
    lengths = batch.lengths().tolist()
    budget = args.mini_batch * max(lengths)
    parts = token_budget_micro_batches(lengths, budget)
    fixed_tokens = len(lengths) * max(lengths)  # fixed micro-batches keep the batch's full width
    dynamic_tokens = padded_tokens(lengths, parts)
    common = [f"train.train_policy.mini_batch={args.mini_batch}"]
    fixed_s = timed_update(model, batch, common, args.repeats)
    dynamic_s = timed_update(model, batch, [*common, f"train.train_policy.max_token_len_per_mini_batch={budget}"],
                             args.repeats)
    print(f"rows {len(lengths)}, lengths {min(lengths)}..{max(lengths)} ({max(lengths) / min(lengths):.1f}x), "
          f"real tokens {sum(lengths)}, mini_batch {args.mini_batch}, budget {budget} tokens")
    print(f"fixed:   {-(-len(lengths) // args.mini_batch)} micro-batches, {fixed_tokens} padded tokens, "
          f"{fixed_s:.3f} s")
    print(f"dynamic: {len(parts)} micro-batches, {dynamic_tokens} padded tokens, {dynamic_s:.3f} s")
    print(f"ratio dynamic / fixed: padded tokens {dynamic_tokens / fixed_tokens:.3f}, time {dynamic_s / fixed_s:.3f}")


if __name__ == "__main__":
    main()
