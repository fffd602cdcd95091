"""Benchmark 1: chunked log-prob heads vs naive ``log_softmax`` of full float32 logits.

Forward + backward of a loss over the per-token log-probs w.r.t. hidden states and the LM-head
weight, at Qwen's 151,936-token vocabulary. Variants (:data:`VARIANTS`):

- ``naive``: ``log_softmax`` of the full float32 ``[tokens, vocab]`` logits, then ``gather``;
  loss ``sum(logprobs * g)``;
- ``chunked``: ``token_logprobs_from_hidden`` (any upstream gradient; the backward recomputes each
  chunk's logits: 4 LM-head GEMMs), loss ``sum(logprobs * g)``: the rollout / evaluation log-probs,
  context parallel, GSPO;
- ``fused``: ``weighted_logprobs_from_hidden`` with ``g`` as the loss weights (the gradient is
  computed in the forward: 3 GEMMs), what SFT uses (``g = sft_token_weights(labels)``);
- ``grpo_chunked``: the general head with entropy, then ``grpo_loss`` (PPO-clip, k3 KL 0.01,
  entropy bonus 0.001; on-policy ratio, advantages and reference log-probs made from ``g``): GRPO
  before the fused head, and still the path of losses that are not per-token sums;
- ``grpo_fused``: the same loss through ``grpo_token_loss`` and the fused head (3 GEMMs).

Each head variant also comes as ``<variant>_eager`` and ``<variant>_compiled``: the epilogue
(softmax statistics and logits gradient from the bf16 logits buffer) as column-blocked torch ops,
or ``torch.compile``d. The plain name is the library default (``"auto"``: compiled on CUDA with
Triton, eager elsewhere); :data:`LIBRARY_DEFAULTS` says which variant each loop runs.

Each variant runs in a fresh subprocess so that its peak resident memory (``ru_maxrss``) minus the
resident memory after building the inputs is its own working memory.

    .venv/bin/python benchmarks/bench_logprobs.py                      # 8,192 tokens, hidden 896
    .venv/bin/python benchmarks/bench_logprobs.py --tokens 2048 --rounds 1 --dtype bfloat16

Prints one line per variant and the ratios variant / naive (targets: memory <= 1/10, time <= 1.0x).
"""

from __future__ import annotations

import argparse
import json
import re
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


HEADS = ("chunked", "fused", "grpo_chunked", "grpo_fused")
EAGER_BLOCKS = (2048, 32768)
"""Other column blocks of the eager epilogue to try (``fused_eager2048``; the default is
``lm_head_chunk.BLOCK_COLUMNS``, 8,192): float32 scratch that stays in L2 vs fewer kernel launches."""
VARIANTS = ("naive", *(f"{head}{suffix}" for head in HEADS for suffix in ("", "_eager", "_compiled")),
            *(f"{head}_eager{block}" for head in ("chunked", "fused") for block in EAGER_BLOCKS))
"""Every name :func:`variant_loss` takes."""

LIBRARY_DEFAULTS = {"sft": "fused", "grpo": "grpo_fused", "general": "chunked"}
"""What the library runs: SFT (``token_logprobs(..., loss_weights=...)``), GRPO (``grpo_update`` with
a per-token loss: PPO-clip / AIPO, any KL / entropy / behaviour weights, built-in aggregations), and
every other log-prob (rollout / reference / evaluation, context parallel, GSPO / off-policy masking:
``grpo_chunked``'s head)."""


def _all_positions(input_ids):
    """Every position t >= 1 of ``input_ids`` [B, T] scored, built on its device without a host sync."""
    import torch

    from cosmos_primitives.algo.logprobs import ScoredPositions

    batch, length = input_ids.shape
    starts = torch.arange(batch, device=input_ids.device)[:, None] * length
    index = (starts + torch.arange(1, length, device=input_ids.device)[None]).flatten()
    return ScoredPositions(index, index - 1, input_ids[:, 1:].flatten(), (batch, length))


def variant_loss(variant: str, hidden, weight, input_ids, grad_out, chunk_size: int):
    """The scalar loss of one variant of :data:`VARIANTS`, to call ``backward()`` on.

    hidden ``[1, T, H]``, weight ``[V, H]``, input_ids ``[1, T]``, grad_out ``[1, T]`` float32 in
    [0, 1) (the loss weights of ``naive`` / ``chunked`` / ``fused``; GRPO builds its inputs from it)."""
    from cosmos_primitives.algo import lm_head_chunk
    from cosmos_primitives.algo.logprobs import naive_token_logprobs

    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
    if variant == "naive":
        return (naive_token_logprobs(hidden, weight, input_ids) * grad_out).sum()
    head, epilogue, block = re.fullmatch(r"(.+?)(?:_(eager|compiled)(\d*))?", variant).groups()
    default_block = lm_head_chunk.BLOCK_COLUMNS
    lm_head_chunk.BLOCK_COLUMNS = int(block) if block else default_block  # the backward keeps the forward's
    try:
        return _head_loss(head, epilogue or "auto", hidden, weight, input_ids, grad_out, chunk_size)
    finally:
        lm_head_chunk.BLOCK_COLUMNS = default_block


def _head_loss(head: str, epilogue: str, hidden, weight, input_ids, grad_out, chunk_size: int):
    from cosmos_primitives.algo.fused_logprob_loss import token_loss_from_hidden, weighted_logprobs_from_hidden
    from cosmos_primitives.algo.grpo_objective import grpo_loss, grpo_token_loss
    from cosmos_primitives.algo.logprobs import token_logprobs_from_hidden
    from cosmos_primitives.config.grpo import GRPOConfig

    positions = _all_positions(input_ids)
    common = dict(positions=positions, chunk_size=chunk_size, epilogue=epilogue)
    if head == "chunked":
        return (token_logprobs_from_hidden(hidden, weight, input_ids, **common).logprobs * grad_out).sum()
    if head == "fused":
        return weighted_logprobs_from_hidden(hidden, weight, input_ids, grad_out, **common).weighted_sum
    cfg = GRPOConfig(kl_beta=0.01, entropy_coeff=0.001)
    mask, ref, advantages = grad_out.new_ones(grad_out.shape), -10.0 * grad_out, grad_out.mean(dim=1) - 0.5
    if head == "grpo_chunked":
        out = token_logprobs_from_hidden(hidden, weight, input_ids, with_entropy=True, **common)
        return grpo_loss(out.logprobs, out.logprobs.detach(), advantages, mask, cfg=cfg, ref_logprobs=ref,
                         entropy=out.entropy)[0]
    token_loss = grpo_token_loss(None, advantages, mask, positions, cfg=cfg, ref_logprobs=ref)
    out = token_loss_from_hidden(hidden, weight, input_ids, token_loss, with_entropy=True, **common)
    return grpo_loss(out.logprobs, out.logprobs, advantages, mask, cfg=cfg, ref_logprobs=ref, entropy=out.entropy,
                     weighted_sum=out.weighted_sum)[0]


def run_variant(variant: str, tokens: int, vocab: int, hidden_size: int, chunk_size: int, dtype_name: str,
                repeats: int) -> dict[str, float]:
    """One variant in this process: ``{"peak_mb", "seconds", "cpu_seconds"}`` (min over repeats).

    ``cpu_seconds`` (user + system time of all threads) is less sensitive than wall time to other
    jobs on a shared machine. A ``_compiled`` variant first runs once untimed (compilation); its
    ``peak_mb`` then also holds the compiler's own memory: read its time only on a CPU."""
    import torch

    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    hidden = (torch.randn(1, tokens, hidden_size) * 0.5).to(dtype).requires_grad_(True)
    weight = (torch.randn(vocab, hidden_size) * 0.05).to(dtype).requires_grad_(True)
    input_ids = torch.randint(0, vocab, (1, tokens))
    grad_out = torch.rand(1, tokens)
    if variant.endswith("_compiled"):
        variant_loss(variant, hidden, weight, input_ids, grad_out, chunk_size).backward()
        hidden.grad = weight.grad = None
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
    parser.add_argument("--variants", default="naive,chunked,fused,grpo_chunked,grpo_fused",
                        help=f"comma-separated subset of {', '.join(VARIANTS)} (naive is the baseline)")
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
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown --variants {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    for round_ in range(args.rounds):
        for variant in variants:
            cmd = [sys.executable, __file__, "--variant", variant, "--tokens", str(args.tokens), "--vocab",
                   str(args.vocab), "--hidden-size", str(args.hidden_size), "--chunk-size", str(args.chunk_size),
                   "--dtype", args.dtype]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            print(f"round {round_}: {variant:20s} peak working memory {r['peak_mb']:9.1f} MB   "
                  f"fwd+bwd {r['seconds']:8.2f} s wall, {r['cpu_seconds']:8.2f} s CPU", flush=True)
            best = results.setdefault(variant, {"peak_mb": 0.0, "seconds": float("inf"), "cpu_seconds": float("inf")})
            best["peak_mb"] = max(best["peak_mb"], r["peak_mb"])
            best["seconds"] = min(best["seconds"], r["seconds"])
            best["cpu_seconds"] = min(best["cpu_seconds"], r["cpu_seconds"])
    for variant, r in results.items():
        print(f"{variant:20s} peak working memory {r['peak_mb']:9.1f} MB   fwd+bwd {r['seconds']:8.2f} s wall, "
              f"{r['cpu_seconds']:8.2f} s CPU")
    naive = results["naive"]
    for variant in variants[1:]:
        r = results[variant]
        mem_ratio = r["peak_mb"] / naive["peak_mb"]
        print(f"{variant} / naive: memory {mem_ratio:.3f} (1/{1 / mem_ratio:.1f}; target <= 1/10), "
              f"wall time {r['seconds'] / naive['seconds']:.2f}x, CPU time "
              f"{r['cpu_seconds'] / naive['cpu_seconds']:.2f}x (target <= 1.0x)")


if __name__ == "__main__":
    main()
