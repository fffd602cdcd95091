"""Benchmark 1: chunked log-prob heads vs naive ``log_softmax`` of full float32 logits.

Forward + backward of ``sum(logprobs * g)`` w.r.t. hidden states and the LM-head weight, at Qwen's
151,936-token vocabulary. Variants:

- ``naive``: ``log_softmax`` of the full float32 ``[tokens, vocab]`` logits, then ``gather``;
- ``chunked``: ``token_logprobs_from_hidden`` (any upstream gradient; the backward recomputes each
  chunk's logits: 4 LM-head GEMMs), what GRPO uses;
- ``fused``: ``weighted_logprobs_from_hidden`` with ``g`` as the loss weights (the gradient is
  computed in the forward: 3 GEMMs), what SFT uses (``g = sft_token_weights(labels)``).

Each variant runs in a fresh subprocess so that its peak resident memory (``ru_maxrss``) minus the
resident memory after building the inputs is its own working memory.

    .venv/bin/python benchmarks/bench_logprobs.py                      # 8,192 tokens, hidden 896
    .venv/bin/python benchmarks/bench_logprobs.py --tokens 2048 --rounds 1

Prints one line per variant and the ratios variant / naive (targets: memory <= 1/8, time <= 1.1x).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def variant_loss(variant: str, hidden, weight, input_ids, grad_out, chunk_size: int):
    """``sum(logprobs * grad_out)`` through one head: ``naive``, ``chunked`` or ``fused``.

    hidden ``[1, T, H]``, weight ``[V, H]``, input_ids ``[1, T]``, grad_out ``[1, T]``; a scalar."""
    from cosmos_primitives.algo.fused_logprob_loss import weighted_logprobs_from_hidden
    from cosmos_primitives.algo.logprobs import naive_token_logprobs, token_logprobs_from_hidden

    if variant == "naive":
        return (naive_token_logprobs(hidden, weight, input_ids) * grad_out).sum()
    if variant == "chunked":
        return (token_logprobs_from_hidden(hidden, weight, input_ids, chunk_size=chunk_size).logprobs
                * grad_out).sum()
    return weighted_logprobs_from_hidden(hidden, weight, input_ids, grad_out, chunk_size=chunk_size).weighted_sum


def run_variant(variant: str, tokens: int, vocab: int, hidden_size: int, chunk_size: int, dtype_name: str,
                repeats: int) -> dict[str, float]:
    """One variant in this process: ``{"peak_mb", "seconds", "cpu_seconds"}`` (min over repeats).

    ``cpu_seconds`` (user + system time of all threads) is less sensitive than wall time to other
    jobs on a shared machine."""
    import torch

    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    hidden = (torch.randn(1, tokens, hidden_size) * 0.5).to(dtype).requires_grad_(True)
    weight = (torch.randn(vocab, hidden_size) * 0.05).to(dtype).requires_grad_(True)
    input_ids = torch.randint(0, vocab, (1, tokens))
    grad_out = torch.rand(1, tokens)
    baseline = _rss_bytes()
    best, best_cpu = float("inf"), float("inf")
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), _cpu_seconds()
        loss = variant_loss(variant, hidden, weight, input_ids, grad_out, chunk_size)
        loss.backward()
        hidden.grad = weight.grad = None
        best = min(best, time.perf_counter() - start)
        best_cpu = min(best_cpu, _cpu_seconds() - start_cpu)
        del loss
    return {"peak_mb": (_maxrss_bytes() - baseline) / 2**20, "seconds": best, "cpu_seconds": best_cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden-size", type=int, default=896)
    parser.add_argument("--chunk-size", type=int, default=1024)
    parser.add_argument("--dtype", default="float32",
                        help="hidden / weight dtype (float32 on CPU: bf16 GEMMs are slow there)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="naive / chunked subprocess pairs, interleaved so that load changes hit both alike")
    parser.add_argument("--variants", default="naive,chunked,fused",
                        help="comma-separated subset of naive, chunked, fused (naive is the baseline)")
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        result = run_variant(args.variant, args.tokens, args.vocab, args.hidden_size, args.chunk_size, args.dtype, 1)
        print(json.dumps(result))
        return
    print(f"tokens={args.tokens} vocab={args.vocab} hidden={args.hidden_size} chunk={args.chunk_size} "
          f"dtype={args.dtype} rounds={args.rounds} (fresh process per run; time = min, memory = max over rounds)")
    results: dict[str, dict[str, float]] = {}
    variants = ["naive"] + [v for v in args.variants.split(",") if v != "naive"]
    unknown = set(variants) - {"naive", "chunked", "fused"}
    if unknown:
        parser.error(f"unknown --variants {sorted(unknown)}; choose from naive, chunked, fused")
    for round_ in range(args.rounds):
        for variant in variants:
            cmd = [sys.executable, __file__, "--variant", variant, "--tokens", str(args.tokens), "--vocab",
                   str(args.vocab), "--hidden-size", str(args.hidden_size), "--chunk-size", str(args.chunk_size),
                   "--dtype", args.dtype]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            print(f"round {round_}: {variant:8s} peak working memory {r['peak_mb']:9.1f} MB   "
                  f"fwd+bwd {r['seconds']:8.2f} s wall, {r['cpu_seconds']:8.2f} s CPU", flush=True)
            best = results.setdefault(variant, {"peak_mb": 0.0, "seconds": float("inf"), "cpu_seconds": float("inf")})
            best["peak_mb"] = max(best["peak_mb"], r["peak_mb"])
            best["seconds"] = min(best["seconds"], r["seconds"])
            best["cpu_seconds"] = min(best["cpu_seconds"], r["cpu_seconds"])
    for variant, r in results.items():
        print(f"{variant:8s} peak working memory {r['peak_mb']:9.1f} MB   fwd+bwd {r['seconds']:8.2f} s wall, "
              f"{r['cpu_seconds']:8.2f} s CPU")
    naive = results["naive"]
    for variant in variants[1:]:
        r = results[variant]
        mem_ratio = r["peak_mb"] / naive["peak_mb"]
        print(f"{variant} / naive: memory {mem_ratio:.3f} (1/{1 / mem_ratio:.1f}; target <= 1/8), "
              f"wall time {r['seconds'] / naive['seconds']:.2f}x, CPU time "
              f"{r['cpu_seconds'] / naive['cpu_seconds']:.2f}x (target <= 1.1x)")


if __name__ == "__main__":
    main()
