"""Benchmark 4: SFT throughput and MFU of a ~1.5B Qwen2-architecture model (random weights).

bf16 compute with float32 master weights (FSDP2 mixed precision), packed rows of 4,096 tokens
(several samples per row, position ids restarting per sample, no attention across samples), the
chunked log-prob head with the fused SFT loss (gradient computed in its forward), ``sft_loss``,
AdamW, clipping: the step ``examples/sft.py`` runs.

    python benchmarks/bench_sft_mfu.py                       # one GPU
    torchrun --nproc_per_node 8 benchmarks/bench_sft_mfu.py   # FSDP2 over 8 GPUs

MFU = (6 x params x tokens + attention FLOPs) / (seconds x GPUs x dense bf16 peak), with attention
FLOPs = 6 x layers x heads x head_dim x sum over samples of len^2 (causal: QK^T and PV, forward
and backward, half of the full square). Activation-checkpoint recomputation is not counted (it is
overhead). The in-run baseline is a large bf16 matmul on the same GPU:
the ratio achieved / matmul throughput is printed beside the MFU against the spec sheet
(989 TFLOP/s for H100 / H200 SXM). Needs a CUDA GPU; on a CPU-only machine it exits with code 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

# dense bf16 peaks (TFLOP/s, no sparsity) by device-name substring
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "GH200": 989.0, "B200": 2250.0, "A100": 312.0, "L40S": 362.0}


def qwen2_1_5b_config():
    """The Qwen2.5-1.5B shape: 28 layers, hidden 1536, 12 heads (2 KV), MLP 8960, tied 151,936 vocab."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
        tie_word_embeddings=True, rope_theta=1_000_000.0, use_cache=False,
    )


def packed_row(seq_len: int, vocab: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """One row of ``seq_len`` tokens made of samples with long-tailed lengths (64 .. 2,048)."""
    lengths: list[int] = []
    while sum(lengths) < seq_len:
        n = int(min(2048, 64 + torch.empty(1).exponential_(1 / 600.0, generator=generator).item()))
        lengths.append(min(n, seq_len - sum(lengths)))
    ids = torch.randint(0, vocab, (seq_len,), generator=generator)
    positions = torch.cat([torch.arange(n) for n in lengths])
    return ids, positions, lengths


def matmul_tflops(device: torch.device, n: int = 8192, iters: int = 20, dtype: torch.dtype = torch.bfloat16) -> float:
    """Measured dense matmul throughput in TFLOP/s (the in-run baseline); any device."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    synchronize(device)
    start = time.perf_counter()
    for _ in range(iters):
        a @ b
    synchronize(device)
    return 2 * n**3 * iters / (time.perf_counter() - start) / 1e12


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work (CUDA); nothing to wait for on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_sft(config, *, seq_len: int, rows: int, steps: int, warmup_steps: int, chunk_size: int,
                activation_checkpointing: bool = False, dtype: str = "bfloat16",
                log: bool = True, policy_options: dict[str, Any] | None = None,
                train_options: dict[str, Any] | None = None, profile: bool = False,
                after_build: Callable[[torch.nn.Module], None] | None = None,
                micro_batches: int = 1) -> dict[str, Any]:
    """Run ``steps`` SFT steps of a random ``Qwen2ForCausalLM(config)`` under FSDP2 over every rank
    of the (already initialised) default group, on packed rows of ``seq_len`` tokens.

    The batch stays on the host until ``cp.policy.token_logprobs`` moves it, as in ``examples/sft.py``.
    ``policy_options`` / ``train_options`` set ``[policy]`` / ``[train]`` fields (the ablations of
    ``benchmarks/gpu_parts_speed.py``); ``after_build(policy)`` may alter the built policy (e.g. put
    back the attention implementation of a baseline). ``profile``: one more step under
    ``torch.profiler`` after the timed ones, whose top device kernels are returned.
    ``micro_batches``: forward / backward passes of ``rows`` rows accumulated into each optimizer
    step (``examples/sft.py`` accumulates every micro-batch of ``train_batch_per_replica``).

    Returns (summed over ranks, timed steps only): ``params``, ``tokens``, ``attn_flops``,
    ``seconds`` (the mean rank's), ``tokens_per_s_per_device``, ``achieved_tflops_per_device``,
    ``peak_memory_gib`` (CUDA only, else NaN), ``first_loss`` and, with ``profile``,
    ``top_kernels`` (``[(name, milliseconds)]``, the most expensive first).
    """
    from transformers import Qwen2ForCausalLM

    import cosmos_primitives as cp
    from cosmos_primitives.algo.sft_objective import sft_loss, sft_token_weights
    from cosmos_primitives.config.policy import ParallelismConfig, PolicyConfig
    from cosmos_primitives.config.train import TrainConfig

    info = cp.parallel.init_distributed()
    mesh = cp.parallel.ParallelMesh(ParallelismConfig(dp_shard_size=-1), device_type=info.device.type)
    torch.manual_seed(0)
    with torch.device(info.device):
        hf_model = Qwen2ForCausalLM(config)
    n_params = sum(p.numel() for p in hf_model.parameters())
    cfg = PolicyConfig(dtype=dtype, logprob_chunk_size=chunk_size,
                       model_gradient_checkpointing=activation_checkpointing, **(policy_options or {}))
    train = TrainConfig(optm_lr=1e-5, optm_warmup_steps=2, optm_decay_type="constant", **(train_options or {}))
    policy = cp.policy.build_policy(cfg, mesh, hf_model=hf_model, train=train)
    if after_build is not None:
        after_build(policy)
    optimizer = cp.policy.build_optimizer(policy, train)
    scheduler = cp.policy.build_lr_scheduler(optimizer, train)

    gen = torch.Generator().manual_seed(1000 + info.rank)
    heads, head_dim = config.num_attention_heads, config.hidden_size // config.num_attention_heads
    if info.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(info.device)
    timed_tokens, timed_attn_flops, timed_seconds, first_loss = 0, 0.0, 0.0, float("nan")

    def one_step() -> tuple[list, torch.Tensor, dict]:
        step_rows, step_ids = [], []
        for _ in range(micro_batches):
            batch_rows = [packed_row(seq_len, config.vocab_size, gen) for _ in range(rows)]
            ids = torch.stack([r[0] for r in batch_rows])
            positions = torch.stack([r[1] for r in batch_rows])
            labels = ids.clone()
            labels[positions == 0] = -100  # the first token of a sample has no prediction in its sample
            batch = {"input_ids": ids, "labels": labels, "position_ids": positions}
            device_labels = labels.to(info.device, non_blocking=True)
            weights = sft_token_weights(device_labels, group=mesh.group("dp"))
            out = cp.policy.token_logprobs(policy, batch, loss_weights=weights)
            loss, stats = sft_loss(out.logprobs, device_labels, group=mesh.group("dp"),
                                   weighted_sum=out.weighted_sum)
            (loss / micro_batches).backward()
            step_rows += batch_rows
            step_ids.append(ids)
        batch_rows, ids = step_rows, torch.cat(step_ids)
        cp.parallel.clip_grad_norm_(policy.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return batch_rows, ids, stats

    for step in range(steps):
        synchronize(info.device)
        start = time.perf_counter()
        batch_rows, ids, stats = one_step()
        synchronize(info.device)
        seconds = time.perf_counter() - start
        if step == 0:
            first_loss = float(stats["loss"])
        if step >= warmup_steps:
            timed_seconds += seconds
            timed_tokens += ids.numel()
            timed_attn_flops += 6.0 * config.num_hidden_layers * heads * head_dim * sum(
                n * n for r in batch_rows for n in r[2])
        if log and info.is_rank0:
            print(f"step {step}: loss {float(stats['loss']):.3f}  {ids.numel() / seconds:,.0f} tokens/s/device")
    top_kernels = profile_top_kernels(one_step, info.device) if profile else None

    totals = torch.tensor([timed_tokens, timed_attn_flops, timed_seconds], dtype=torch.float64, device=info.device)
    cp.parallel.all_reduce_sum(totals)
    world = info.world_size
    tokens, attn_flops, seconds = float(totals[0]), float(totals[1]), float(totals[2]) / world
    flops = 6.0 * n_params * tokens + attn_flops
    peak = torch.cuda.max_memory_allocated(info.device) / 2**30 if info.device.type == "cuda" else float("nan")
    return {"params": float(n_params), "tokens": tokens, "attn_flops": attn_flops, "seconds": seconds,
            "tokens_per_s_per_device": tokens / seconds / world,
            "achieved_tflops_per_device": flops / seconds / world / 1e12,
            "peak_memory_gib": peak, "first_loss": first_loss, "top_kernels": top_kernels}


def profile_top_kernels(step: Callable[[], Any], device: torch.device, top: int = 8) -> list[tuple[str, float]]:
    """Run ``step()`` once under ``torch.profiler``: the ``top`` kernels by total device time,
    ``[(name, milliseconds)]`` (CPU ops by CPU time on a machine without a GPU), after a first row
    with the sum over every event."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
        synchronize(device)
    rows = []
    for event in prof.key_averages():
        if device.type == "cuda":
            if getattr(event, "device_type", None) != torch.autograd.DeviceType.CUDA:
                continue
            us = getattr(event, "self_device_time_total", None)
            if us is None:
                us = getattr(event, "self_cuda_time_total", 0.0)
        else:
            us = event.self_cpu_time_total
        rows.append((event.key[:120], us / 1e3))
    ranked = sorted(rows, key=lambda r: -r[1])
    # the sum of every kernel (a GPU range such as Optimizer.step#... also counts its kernels again)
    return [("all device time (sum over events)", sum(ms for _, ms in ranked)), *ranked[:top]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--rows", type=int, default=2, help="packed rows per GPU per step")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup-steps", type=int, default=3, help="steps excluded from the timing")
    parser.add_argument("--chunk-size", type=int, default=2048, help="log-prob head chunk")
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--attn", default="sdpa", help="attn_implementation (sdpa, flash_attention_2)")
    parser.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak if the GPU is not known")
    args = parser.parse_args()

    if not torch.cuda.is_available():
        print("bench_sft_mfu: no CUDA GPU is visible on this machine; this benchmark needs one "
              "(no figures produced; record 'no GPU available' in benchmarks/RESULTS.md).", file=sys.stderr)
        return 2

    import cosmos_primitives as cp

    info = cp.parallel.init_distributed()
    name = torch.cuda.get_device_name(info.device)
    peak = args.peak_tflops or spec_peak_tflops(name)
    if peak is None:
        print(f"unknown GPU {name!r}: pass --peak-tflops (dense bf16)", file=sys.stderr)
        return 2
    config = qwen2_1_5b_config()
    config._attn_implementation = args.attn
    matmul = matmul_tflops(info.device)
    r = measure_sft(config, seq_len=args.seq_len, rows=args.rows, steps=args.steps,
                    warmup_steps=args.warmup_steps, chunk_size=args.chunk_size,
                    activation_checkpointing=args.activation_checkpointing)
    achieved = r["achieved_tflops_per_device"]
    if info.is_rank0:
        print(f"model: Qwen2 {r['params'] / 1e9:.2f}B params, {config.num_hidden_layers} layers, seq {args.seq_len}, "
              f"{args.rows} packed rows/GPU, {info.world_size} x {name}, attn={args.attn}, "
              f"activation checkpointing={args.activation_checkpointing}")
        print(f"throughput: {r['tokens_per_s_per_device']:,.0f} tokens/s/GPU")
        print(f"achieved {achieved:.1f} TFLOP/s/GPU; MFU vs {peak:.0f} TFLOP/s spec peak: {achieved / peak:.1%} "
              f"(target >= 40%); vs measured bf16 matmul {matmul:.0f} TFLOP/s: {achieved / matmul:.1%}")
        print(f"peak GPU memory: {r['peak_memory_gib']:.1f} GiB")
    cp.parallel.destroy_distributed()
    return 0


def spec_peak_tflops(device_name: str) -> float | None:
    """Dense bf16 spec-sheet peak of a GPU known by ``PEAK_TFLOPS``, else None."""
    return next((v for k, v in PEAK_TFLOPS.items() if k in device_name), None)


if __name__ == "__main__":
    sys.exit(main())
