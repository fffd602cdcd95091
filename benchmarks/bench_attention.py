"""Attention over packed rows: transformers' SDPA with its dense packed mask vs variable-length attention.

Forward + backward of one attention call on ``rows`` packed rows of ``seq_len`` tokens, each holding
``samples_per_row`` samples of random lengths, with grouped K / V heads. Variants:

- ``dense_mask``: ``transformers.integrations.sdpa_attention.sdpa_attention_forward`` with the
  ``[B, 1, T, T]`` bool mask that ``create_causal_mask`` builds for packed rows (the ``"sdpa"`` path:
  with a mask, SDPA copies K / V per query head and computes the whole ``T x T`` square);
- ``varlen``: ``cosmos_primitives.parallel.varlen_attention.varlen_attention_forward`` given the
  sample offsets (``packed_attention_kwargs``, computed on the host as ``token_logprobs`` does);
- ``varlen:<kernel>``: the same through each other CUDA varlen kernel this installation offers;
- ``causal_rows``: SDPA ``is_causal`` on whole rows, ignoring sample boundaries (wrong for packed rows:
  the upper bound of one flash call over the row).

Reported per variant: median milliseconds, useful TFLOP/s (causal attention within the samples only,
forward + backward = 3.5 x the forward's ``2 * L^2 * D`` per head and sample), and the top kernels of
one profiled iteration (does flash run?). On a machine without CUDA the shapes shrink to a dry run of
a few seconds.

    .venv/bin/python benchmarks/bench_attention.py               # CUDA: 2 x 4,096 tokens, 12 / 2 heads of 128
    .venv/bin/python benchmarks/bench_attention.py --seq-len 8192 --rows 1

From Python (the GPU pack): ``from bench_attention import attention_variants``.
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import json
import statistics
import time
from typing import Any

import torch

DRY_SHAPE = {"seq_len": 96, "rows": 2, "heads": 4, "kv_heads": 2, "head_dim": 16}


class _Layer(torch.nn.Module):
    """What HF attention functions read from their attention module."""

    def __init__(self, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.is_causal = True
        self.layer_idx = 0
        self.num_key_value_groups = heads // kv_heads


def sample_lengths(seq_len: int, rows: int, samples_per_row: int, seed: int = 0) -> list[list[int]]:
    """Per row, ``samples_per_row`` random sample lengths (each >= 1) that add up to ``seq_len``."""
    generator = torch.Generator().manual_seed(seed)
    lengths = []
    for _ in range(rows):
        cuts = torch.randperm(seq_len - 1, generator=generator)[:samples_per_row - 1].add(1).sort().values.tolist()
        bounds = [0, *cuts, seq_len]
        lengths.append([end - start for start, end in itertools.pairwise(bounds)])
    return lengths


def _dense_packed_mask(positions: torch.Tensor, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                       device: torch.device) -> torch.Tensor:
    """The mask ``create_causal_mask`` gives ``"sdpa"`` layers for packed ``[B, T]`` positions (its
    keyword names differ between transformers versions: read from its signature)."""
    from transformers import Qwen2Config
    from transformers.masking_utils import create_causal_mask

    config = Qwen2Config(hidden_size=heads * head_dim, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         num_hidden_layers=1, vocab_size=16)
    config._attn_implementation = "sdpa"
    rows, length = positions.shape
    params = inspect.signature(create_causal_mask).parameters
    kwargs: dict[str, Any] = {"config": config, "attention_mask": None, "position_ids": positions}
    kwargs["inputs_embeds" if "inputs_embeds" in params else "input_embeds"] = torch.empty(
        rows, length, 1, dtype=dtype, device=device)
    kwargs["cache" if "cache" in params else "past_key_values"] = None
    if "cache_position" in params:
        kwargs["cache_position"] = torch.arange(length, device=device)
    mask = create_causal_mask(**kwargs)
    if mask is None or mask.shape != (rows, 1, length, length):
        raise RuntimeError(f"transformers gave {None if mask is None else tuple(mask.shape)} for packed rows, "
                           f"not the dense [{rows}, 1, {length}, {length}] mask this benchmark measures")
    return mask


def _time_ms(step: Any, device: torch.device, iters: int, warmup: int) -> float:
    """Median milliseconds of ``step()`` (CUDA events on a GPU)."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end))
        else:
            began = time.perf_counter()
            step()
            times.append((time.perf_counter() - began) * 1e3)
    return statistics.median(times)


def _top_kernels(step: Any, device: torch.device, top: int = 5) -> list[tuple[str, float]]:
    """``(name, milliseconds)`` of the ``top`` kernels (CUDA) or ops (CPU) by self time in one step."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    rows = []
    for event in prof.key_averages():
        if device.type == "cuda":
            if event.device_type != torch.autograd.DeviceType.CUDA:
                continue
            us = getattr(event, "self_device_time_total", None)
            us = getattr(event, "self_cuda_time_total", 0.0) if us is None else us
        else:
            us = event.self_cpu_time_total
        if us > 0:
            rows.append((event.key, us / 1e3))
    return sorted(rows, key=lambda row: -row[1])[:top]


def attention_variants(seq_len: int = 4096, rows: int = 2, heads: int = 12, kv_heads: int = 2, head_dim: int = 128,
                       dtype: torch.dtype = torch.bfloat16, device: torch.device | str | None = None, *,
                       samples_per_row: int = 8, iters: int = 20, warmup: int = 5, seed: int = 0,
                       print_table: bool = True) -> dict[str, Any]:
    """Time forward + backward of the attention variants (module docstring) and profile their kernels.

    Args:
        seq_len, rows: packed rows of ``seq_len`` tokens each.
        heads, kv_heads, head_dim: query heads, K / V heads (GQA), head size.
        dtype: compute dtype of q / k / v.
        device: None = CUDA when available. Off CUDA the shapes shrink to :data:`DRY_SHAPE` in float32
            (a dry run in seconds; ``"dry_run": True`` in the result).
        samples_per_row: packed samples per row (random lengths, fixed by ``seed``).
        iters, warmup: timed and untimed steps per variant.
        print_table: print one line per variant.

    Returns:
        ``{"device", "dtype", "torch", "transformers", "dry_run", "shape", "sample_lengths",
        "varlen_kernel" (the kernel the ``varlen`` variant ran), "available_kernels", "variants": {name:
        {"ms", "useful_tflops", "vs_dense" (dense ms / this ms), "flash" (a flash / fmha kernel among the
        top ones), "top_kernels": [(name, ms), ...]} or {"error": text}}, "dense_mask_error" (None, or
        why transformers gave no dense mask to compare with)}``.
    """
    import transformers
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from cosmos_primitives.parallel.varlen_attention import (
        available_varlen_kernels,
        packed_attention_kwargs,
        register_varlen_attention,
        varlen_attention,
        varlen_attention_forward,
        varlen_kernel_name,
    )

    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    dry = device.type != "cuda"
    if dry:
        seq_len, rows, heads, kv_heads, head_dim = (DRY_SHAPE[k] for k in ("seq_len", "rows", "heads", "kv_heads",
                                                                             "head_dim"))
        dtype, iters, warmup, samples_per_row = torch.float32, 2, 1, min(samples_per_row, 4)
    register_varlen_attention()
    lengths = sample_lengths(seq_len, rows, samples_per_row, seed)
    positions = torch.stack([torch.cat([torch.arange(n) for n in row]) for row in lengths])  # [B, T] on the host
    ids = torch.zeros_like(positions)
    offsets = {k: v.to(device) if isinstance(v, torch.Tensor) else v
               for k, v in packed_attention_kwargs(ids, positions).items()}
    try:
        mask, mask_error = _dense_packed_mask(positions.to(device), heads, kv_heads, head_dim, dtype, device), None
    except RuntimeError as exc:  # a transformers that no longer builds it: measure the rest
        mask, mask_error = None, str(exc)
    layer = _Layer(heads, kv_heads)
    scale = head_dim ** -0.5
    generator = torch.Generator(device=device).manual_seed(seed)
    q, k, v = (torch.randn(rows, h, seq_len, head_dim, device=device, dtype=dtype, generator=generator)
               .requires_grad_() for h in (heads, kv_heads, kv_heads))
    grad = torch.randn(rows, seq_len, heads, head_dim, device=device, dtype=dtype, generator=generator)

    def through_kernel(kernel: str) -> Any:
        def attend() -> torch.Tensor:
            flat = [x.transpose(1, 2).reshape(rows * seq_len, x.shape[1], head_dim) for x in (q, k, v)]
            out = varlen_attention(*flat, offsets["cu_seq_lens_q"], offsets["cu_seq_lens_k"], offsets["max_length_q"],
                                   offsets["max_length_k"], scale=scale, kernel=kernel)
            return out.view(rows, seq_len, heads, head_dim)
        return attend

    variants = {
        "dense_mask": lambda: sdpa_attention_forward(layer, q, k, v, mask, scaling=scale)[0],
        "varlen": lambda: varlen_attention_forward(layer, q, k, v, None, scaling=scale, **offsets)[0],
        "causal_rows": lambda: sdpa_attention_forward(layer, q, k, v, None, scaling=scale)[0],
    }
    if mask is None:
        del variants["dense_mask"]
    default_kernel = varlen_kernel_name(q.transpose(1, 2), k.transpose(1, 2))
    for kernel in available_varlen_kernels() if not dry else []:
        if kernel != default_kernel:
            variants[f"varlen:{kernel}"] = through_kernel(kernel)

    useful = 3.5 * 2 * heads * head_dim * sum(n * n for row in lengths for n in row)
    results: dict[str, dict[str, Any]] = {}
    for name, attend in variants.items():
        def step(attend: Any = attend) -> None:
            q.grad = k.grad = v.grad = None
            attend().backward(grad)

        try:
            ms = _time_ms(step, device, iters, warmup)
            top = _top_kernels(step, device)
        except Exception as exc:  # one kernel failing (another torch's signature) must not hide the others
            results[name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            continue
        results[name] = {"ms": ms, "useful_tflops": useful / (ms * 1e-3) / 1e12, "top_kernels": top,
                         "flash": any(word in kname.lower() for kname, _ in top for word in ("flash", "fmha"))}
    dense_ms = results.get("dense_mask", {}).get("ms")
    for entry in results.values():
        if "ms" in entry:
            entry["vs_dense"] = dense_ms / entry["ms"] if dense_ms else None
    report = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(dtype).removeprefix("torch."), "torch": torch.__version__,
        "transformers": transformers.__version__, "dry_run": dry,
        "shape": {"seq_len": seq_len, "rows": rows, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim},
        "sample_lengths": lengths, "varlen_kernel": default_kernel, "available_kernels": available_varlen_kernels(),
        "variants": results, "dense_mask_error": mask_error,
    }
    if print_table:
        print(format_table(report))
    return report


def format_table(report: dict[str, Any]) -> str:
    """A few lines: the setup, then one line per variant."""
    shape = report["shape"]
    lines = [f"attention fwd+bwd: {shape['rows']} x {shape['seq_len']} tokens, {shape['heads']} / {shape['kv_heads']} "
             f"heads x {shape['head_dim']}, {report['dtype']} on {report['device']} (torch {report['torch']}, "
             f"transformers {report['transformers']}){' DRY RUN' if report['dry_run'] else ''}; varlen kernel: "
             f"{report['varlen_kernel']}",
             f"{'variant':<36} {'ms':>9} {'useful TFLOP/s':>15} {'vs dense':>9} {'flash':>6}  top kernel"]
    for name, entry in report["variants"].items():
        if "error" in entry:
            lines.append(f"{name:<36} failed: {entry['error']}")
            continue
        top = entry["top_kernels"][0][0][:70] if entry["top_kernels"] else "-"
        ratio = f"{entry['vs_dense']:>8.2f}x" if entry["vs_dense"] else f"{'-':>9}"
        lines.append(f"{name:<36} {entry['ms']:>9.3f} {entry['useful_tflops']:>15.1f} {ratio} "
                     f"{'yes' if entry['flash'] else 'no':>6}  {top}")
    if report["dense_mask_error"]:
        lines.append(f"dense_mask not measured: {report['dense_mask_error']}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--samples-per-row", type=int, default=8)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--json", action="store_true", help="also print the result as JSON")
    args = parser.parse_args()
    report = attention_variants(args.seq_len, args.rows, args.heads, args.kv_heads, args.head_dim,
                                getattr(torch, args.dtype), samples_per_row=args.samples_per_row)
    if args.json:
        print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
