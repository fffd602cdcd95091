"""Peak memory per rank of an SFT step under each memory option, against the plain run, and the
memory plan's estimate of the same runs.

Run: ``.venv/bin/python benchmarks/bench_memory.py [--layers 2 --tokens 16 --json out.json]``

Model: the Qwen2.5-0.5B shape (hidden 896, intermediate 4,864, 14 heads / 2 KV heads, vocabulary
151,936, tied embeddings) with random weights and ``--layers`` decoder layers (24 in the real model).
The defaults are scaled down for CPU time: bfloat16 GEMMs run at about 1 GFLOP/s on an AVX2 CPU
without native bfloat16 (and slower on a loaded one), so 2 layers (166 M parameters, 136 M of them
the embedding) and 16 tokens keep each run to a few minutes. At 16 tokens the activations are
negligible next to the weights and optimizer state, so activation checkpointing saves nothing
visible here; ``--layers 24 --tokens 1024`` shows it where there is CPU time (or on a GPU).

Each run: 2 gloo processes, FSDP2 over ``dp_shard = 2``, ``[policy] dtype = "bfloat16"`` (compute),
two SFT steps (AdamW, clipping) on one packed row of ``--tokens`` random tokens per rank. Runs:

- ``plain``: float32 master weights, no offload, no activation checkpointing;
- ``checkpointing``: ``[policy] model_gradient_checkpointing = true``;
- ``bf16_master``: ``[train] master_dtype = "bfloat16"``;
- ``offload``: ``[train] fsdp_offload = true``;
- ``all``: the three together.

Measure (``cosmos_primitives.testing.memory``): peak resident set size of each rank over the two
steps above its resident size just before the model is built (large allocations mmap'd so frees
leave the resident set; peak reset after the model is sharded). Printed per run: the measured peak
(max over the ranks), its ratio to ``plain`` (same run of this script), and the plan's estimate
(``cosmos_primitives.plan.estimate_memory`` with ``device = "cpu"``) with its error.

On the CPU, ``fsdp_offload`` moves nothing: the "device" is host memory already, so its row shows
what the option costs in host memory, not the GPU memory it saves (the plan's GPU figure for it is
printed beside).

``--device cuda`` measures on one GPU instead: one process per run, FSDP2 over ``dp_shard = 1``
(the mixed-precision / offload wrapping still applies), torch's ``max_memory_allocated`` above the
allocated bytes before the model is built (``measure_training_peak_cuda``), against the plan's GPU
estimate for one rank. Defaults there: the whole model (24 layers) and 4,096 tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import time
from typing import Any

import cosmos_primitives as cp
from cosmos_primitives.config.policy import ParallelismConfig, PolicyConfig
from cosmos_primitives.config.root import Config
from cosmos_primitives.config.train import TrainConfig
from cosmos_primitives.plan import ModelShape, estimate_memory
from cosmos_primitives.testing.memory import measure_training_peak, measure_training_peak_cuda

QWEN2_5_0_5B = {
    "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
    "num_attention_heads": 14, "num_key_value_heads": 2, "max_position_embeddings": 32768,
    "tie_word_embeddings": True, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
}
RUNS: dict[str, tuple[dict[str, Any], bool]] = {  # [train] options, model_gradient_checkpointing
    "plain": ({}, False),
    "checkpointing": ({}, True),
    "bf16_master": ({"master_dtype": "bfloat16"}, False),
    "offload": ({"fsdp_offload": True}, False),
    "all": ({"fsdp_offload": True, "master_dtype": "bfloat16"}, True),
}
RANKS = 2
"""gloo ranks of a CPU run (a GPU run has one rank on one GPU)."""


def run_config(name: str, tokens: int, ranks: int = RANKS) -> Config:
    """The ``Config`` of one run (``ranks`` ranks, dp_shard = ranks, bf16 compute, one packed row of ``tokens``)."""
    train_options, checkpointing = RUNS[name]
    policy = PolicyConfig(dtype="bfloat16", model_gradient_checkpointing=checkpointing,
                          parallelism=ParallelismConfig(dp_shard_size=ranks), logprob_chunk_size=1024)
    train = TrainConfig(optm_lr=1e-5, **train_options)
    train.train_policy.packing_budget = tokens
    return Config(policy=policy, train=train)


def _worker(model_config: dict[str, Any], name: str, tokens: int) -> dict[str, int]:
    cfg = run_config(name, tokens)
    return measure_training_peak(model_config, cfg.policy, cfg.train, tokens)


def _cuda_worker(model_config: dict[str, Any], name: str, tokens: int, results: Any) -> None:
    cfg = run_config(name, tokens, ranks=1)
    results.put(measure_training_peak_cuda(model_config, cfg.policy, cfg.train, tokens))


def measure_on_cuda(model_config: dict[str, Any], name: str, tokens: int) -> dict[str, int]:
    """One run in a fresh process on GPU 0 (so no earlier run's allocations count)."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    proc = ctx.Process(target=_cuda_worker, args=(model_config, name, tokens, results))
    proc.start()
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            result = results.get(timeout=2)
            proc.join(timeout=60)
            return result
        except queue.Empty:
            if not proc.is_alive():
                break
    proc.kill()
    raise RuntimeError(f"bench_memory: the {name!r} run on cuda returned nothing (exit code {proc.exitcode}); "
                       "its traceback is above")


def write_json(path: str, device: str, layers: int, tokens: int, rows: dict[str, dict[str, float]]) -> None:
    with open(path, "w") as f:
        json.dump({"device": device, "layers": layers, "tokens": tokens, "rows": rows}, f, indent=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cpu: 2 gloo ranks, host memory; cuda: one GPU, torch's allocator")
    parser.add_argument("--layers", type=int, help="decoder layers (the real 0.5B model has 24; default 2 on "
                        "cpu, 24 on cuda)")
    parser.add_argument("--tokens", type=int, help="tokens per rank and step, one packed row (default 16 on cpu, "
                        "4096 on cuda)")
    parser.add_argument("--runs", nargs="*", default=list(RUNS), choices=list(RUNS))
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    on_cuda = args.device == "cuda"
    layers = args.layers or (24 if on_cuda else 2)
    tokens = args.tokens or (4096 if on_cuda else 16)
    ranks = 1 if on_cuda else RANKS
    model_config = {**QWEN2_5_0_5B, "num_hidden_layers": layers}
    shape = ModelShape.from_hf_config(model_config)
    if on_cuda:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("bench_memory --device cuda: no CUDA device visible")
        where = f"{torch.cuda.get_device_name(0)}, one rank, FSDP2 dp_shard=1, bf16 compute"
    else:
        where = f"{RANKS} gloo ranks, FSDP2 dp_shard={RANKS}, bf16 compute"
    print(f"machine: {platform.machine()} {platform.processor() or ''}, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.1f}; {where}")
    print(f"model: Qwen2.5-0.5B shape with {layers} layers, {shape.total_params / 1e6:.1f} M parameters; "
          f"{tokens} tokens per rank and step")
    rows: dict[str, dict[str, float]] = {}
    for name in args.runs:
        if on_cuda:
            results = [measure_on_cuda(model_config, name, tokens)]
        else:
            results = cp.testing.run_distributed(_worker, RANKS, args=(model_config, name, tokens), timeout_s=900)
        peak = max(r["peak"] for r in results)
        cfg = run_config(name, tokens, ranks)
        estimate = estimate_memory(cfg, shape, world_size=ranks, device=args.device)  # of what was measured
        gpu = estimate if on_cuda else estimate_memory(cfg, shape, world_size=ranks, device="cuda")
        rows[name] = {"peak_mib": peak / 2**20, "model_mib": max(r["model"] for r in results) / 2**20,
                      "estimate_mib": estimate.total / 2**20, "gpu_estimate_mib": gpu.total / 2**20}
        print(f"  {name}: measured {peak / 2**20:.0f} MiB, plan {rows[name]['estimate_mib']:.0f} MiB", flush=True)
        if args.json:  # after every run, so a run cut short keeps the rows measured
            write_json(args.json, args.device, layers, tokens, rows)
    plain = rows.get("plain", {}).get("peak_mib")
    print(f"\n| run | measured peak / rank (MiB) | vs plain | plan estimate, {args.device.upper()} (MiB) "
          "| estimate error | plan estimate, GPU (MiB) |")
    print("|---|---|---|---|---|---|")
    for name, row in rows.items():
        ratio = f"{row['peak_mib'] / plain:.2f}" if plain else "n/a"
        error = (row["estimate_mib"] - row["peak_mib"]) / row["peak_mib"]
        row["error"] = error
        print(f"| {name} | {row['peak_mib']:.0f} | {ratio} | {row['estimate_mib']:.0f} | {error:+.1%} "
              f"| {row['gpu_estimate_mib']:.0f} |")
    if args.json:
        write_json(args.json, args.device, layers, tokens, rows)


if __name__ == "__main__":
    main()
