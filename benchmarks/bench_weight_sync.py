"""Weight-sync benchmark: bucketed broadcast vs one flat buffer vs per-parameter broadcast, and
in-process sync time.

Run: ``.venv/bin/python benchmarks/bench_weight_sync.py [--mb 500 --repeats 5 --bucket-mb 256,64]``.

1. Broadcast (gloo, 2 processes on this machine, rank 0 -> rank 1): a ~``--mb`` MB bf16 state
   dict with Qwen2-style shapes (embedding, q / k / v / o, gate / up / down, norms, biases), moved
   three ways in the same run, each repeated and reported as the median:
   - flat (baseline): the same bytes already packed in one contiguous buffer, one ``broadcast``
     (no packing, no unpacking: the floor for these bytes on this transport);
   - bucketed: ``WeightBroadcaster.sync`` -> ``WeightReceiver.sync`` (gather, pack into buckets,
     send, unpack into the receiver's parameters), per bucket size, with and without overlap, and
     with ``in_place=True`` on both sides (parameters laid out in bucket order once; buckets are
     slices of them, no packing);
   - naive: one ``broadcast`` per parameter, straight into the receiver's parameters.
   The time of one method is the slowest rank's, measured from a barrier.
2. In-process (``InProcessSync``): a 7B-sized (Qwen2.5-7B shapes) bf16 state dict on CUDA, shared
   (aliasing) and copied (``share=False``); skipped with a message without CUDA. ``--cpu-inprocess``
   times the same on CPU for the ``--mb`` state dict instead.
Each ratio compares two things measured in this run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn

from cosmos_primitives.sync import InProcessSync, WeightBroadcaster, WeightReceiver, new_sync_group
from cosmos_primitives.testing import run_distributed


def qwen_like_shapes(hidden: int, layers: int, ffn: int, kv: int, vocab: int, tied: bool) -> dict[str, tuple]:
    """Parameter shapes of a Qwen2-style decoder (``model.*`` names)."""
    shapes: dict[str, tuple] = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (hidden, hidden), p + "self_attn.q_proj.bias": (hidden,),
            p + "self_attn.k_proj.weight": (kv, hidden), p + "self_attn.k_proj.bias": (kv,),
            p + "self_attn.v_proj.weight": (kv, hidden), p + "self_attn.v_proj.bias": (kv,),
            p + "self_attn.o_proj.weight": (hidden, hidden),
            p + "mlp.gate_proj.weight": (ffn, hidden), p + "mlp.up_proj.weight": (ffn, hidden),
            p + "mlp.down_proj.weight": (hidden, ffn),
            p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
        })
    shapes["model.norm.weight"] = (hidden,)
    if not tied:
        shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def shapes_of_size(total_mb: float) -> dict[str, tuple]:
    """About ``total_mb`` MB of bf16: hidden 1024, ffn 2816, vocab 32000, as many layers as fit."""
    per_layer = qwen_like_shapes(1024, 1, 2816, 256, 0, True)
    layer_bytes = 2 * sum(torch.Size(s).numel() for n, s in per_layer.items() if "layers" in n)
    layers = max(1, round((total_mb * 1e6 - 2 * 32000 * 1024) / layer_bytes))
    return qwen_like_shapes(1024, layers, 2816, 256, 32000, True)


def module_with(shapes: dict[str, tuple], dtype: torch.dtype, device: str, fill: bool) -> nn.Module:
    root = nn.Module()
    for name, shape in shapes.items():
        *path, leaf = name.split(".")
        mod = root
        for part in path:
            if not hasattr(mod, part):
                mod.add_module(part, nn.Module())
            mod = getattr(mod, part)
        value = torch.empty(shape, dtype=dtype, device=device)
        value.normal_() if fill else value.zero_()
        mod.register_parameter(leaf, nn.Parameter(value, requires_grad=False))
    return root


def _broadcast_bench(total_mb: float, repeats: int, bucket_mbs: list[int], threads: int) -> dict:
    # 2 processes on a 2-core machine: more intra-op threads per process oversubscribe the cores and
    # make large copy_ calls stall on OpenMP barriers (10x slower under load); see --threads
    torch.set_num_threads(threads)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = module_with(shapes_of_size(total_mb), torch.bfloat16, "cpu", fill=rank == 0)
    params = [p for _, p in model.named_parameters()]
    nbytes = sum(p.numel() * p.element_size() for p in params)
    group = new_sync_group(src=0, receivers=[1])
    flat = torch.empty(nbytes, dtype=torch.uint8)
    if rank == 0:  # packed once, outside the timing: the baseline moves ready-made bytes
        torch.cat([p.detach().reshape(-1).view(torch.uint8) for p in params], out=flat)

    methods = {"flat": lambda: dist.broadcast(flat, src=0, group=group.group)}

    def naive() -> None:
        for p in params:
            dist.broadcast(p.data, src=0, group=group.group)

    methods["naive"] = naive
    def add(name: str, sender_model: nn.Module, receiver_model: nn.Module, **options) -> None:
        if rank == 0:
            side = WeightBroadcaster(sender_model, group, **options)
            side.sync(version=0)  # plan exchange + first-sync check, not timed
            methods[name] = lambda: side.sync(version=1)
        else:
            options.pop("bucket_bytes")
            side = WeightReceiver(receiver_model, group, **options)
            side.sync()
            methods[name] = side.sync

    for mb in bucket_mbs:
        for overlap in (True, False):
            add(f"bucketed {mb} MB, overlap={overlap}", model, model, bucket_bytes=mb << 20, overlap=overlap)
    own_models = []
    for mb in bucket_mbs:  # in_place moves a model's storage: each variant gets its own copy
        torch.manual_seed(0)
        own = module_with(shapes_of_size(total_mb), torch.bfloat16, "cpu", fill=rank == 0)
        own_models.append(own)
        add(f"bucketed {mb} MB, in_place", own, own, bucket_bytes=mb << 20, in_place=True)

    times: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(repeats):
        for name, run in methods.items():  # interleaved so that load changes hit every method alike
            dist.barrier(group=group.group)
            start = time.perf_counter()
            run()
            elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group.group)
            times[name].append(float(elapsed))
    received_ok = True
    if rank == 1:  # the last thing each method delivered is the sender's weights
        torch.manual_seed(0)
        expected = module_with(shapes_of_size(total_mb), torch.bfloat16, "cpu", fill=True)
        received_ok = all(
            torch.equal(a, b)
            for m in (model, *own_models)
            for a, b in zip(m.parameters(), expected.parameters(), strict=True)
        )
    return {"bytes": nbytes, "tensors": len(params), "times": times, "received_ok": received_ok}


def run_broadcast(total_mb: float, repeats: int, bucket_mbs: list[int], threads: int) -> None:
    sender, receiver = run_distributed(_broadcast_bench, 2, args=(total_mb, repeats, bucket_mbs, threads),
                                       timeout_s=3600)
    nbytes, times = sender["bytes"], sender["times"]
    print(f"\n1. broadcast over gloo, 2 processes: {nbytes / 1e6:.0f} MB bf16 in {sender['tensors']} tensors, "
          f"median of {repeats}, {threads} intra-op thread(s) per process; "
          f"receiver got the sender's weights: {receiver['received_ok']}")
    print_medians(times, nbytes, "flat", "vs flat", speed=True, width=34)


def print_medians(times: dict[str, list[float]], nbytes: int, baseline: str, ratio_label: str, *, speed: bool,
                  width: int) -> None:
    """One row per method: median seconds, GB/s, the ratio to ``baseline`` (its time over the
    method's with ``speed``, else the method's time over its), and every run."""
    base = statistics.median(times[baseline])
    print(f"{'method':<{width}} {'median s':>9} {'GB/s':>7} {ratio_label:>10}   all runs (s)")
    for name, values in times.items():
        med = statistics.median(values)
        ratio = base / med if speed else med / base
        print(f"{name:<{width}} {med:9.3f} {nbytes / med / 1e9:7.2f} {ratio:10.2f}   "
              + " ".join(f"{v:.3f}" for v in values))


def run_in_process(device: str, shapes: dict[str, tuple], label: str, repeats: int) -> None:
    trainer = module_with(shapes, torch.bfloat16, device, fill=True)
    nbytes = sum(p.numel() * p.element_size() for p in trainer.parameters())
    print(f"\n2. in-process sync on {device} ({label}): {nbytes / 1e9:.2f} GB bf16 in {len(shapes)} tensors, "
          f"median of {repeats}")
    rows = []
    for share in (True, False):
        engine = module_with(shapes, torch.bfloat16, device, fill=False)
        sync = InProcessSync(trainer, engine, share=share)
        sync.sync(version=0)  # first sync: aliasing / first copy + bitwise check, not timed
        times = [sync.sync(version=v).seconds for v in range(1, repeats + 1)]
        med = statistics.median(times)
        rows.append(med)
        if share:
            print(f"   {'shared storage (aliasing)':<32} {med * 1e3:9.2f} ms   (no bytes move: data_ptr checks)")
        else:
            print(f"   {'copy into preallocated tensors':<32} {med * 1e3:9.2f} ms   {nbytes / med / 1e9:9.1f} GB/s")
        del engine, sync
    print(f"   copy / share time ratio: {rows[1] / max(rows[0], 1e-9):.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=500.0, help="size of the broadcast state dict (MB)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bucket-mb", default="256,64", help="bucket sizes to time (MB, comma-separated)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads per broadcast process and for --cpu-inprocess")
    parser.add_argument("--skip-broadcast", action="store_true")
    parser.add_argument("--cpu-inprocess", action="store_true", help="also time in-process sync on CPU")
    args = parser.parse_args()
    if not args.skip_broadcast:
        run_broadcast(args.mb, args.repeats, [int(x) for x in args.bucket_mb.split(",")], args.threads)
    if torch.cuda.is_available():
        # Qwen2.5-7B: hidden 3584, 28 layers, ffn 18944, 4 KV heads of 128, vocab 152064, untied head
        run_in_process("cuda", qwen_like_shapes(3584, 28, 18944, 512, 152064, tied=False), "Qwen2.5-7B shapes",
                       args.repeats)
    else:
        print("\n2. in-process sync of a 7B bf16 state dict on CUDA: SKIPPED, no CUDA device on this machine "
              "(target: <= 50 ms on an H100)")
    if args.cpu_inprocess:
        torch.set_num_threads(args.threads)
        run_in_process("cpu", shapes_of_size(args.mb),
                       f"{args.mb:.0f} MB, Qwen2-style shapes, {args.threads} intra-op thread(s)", args.repeats)


if __name__ == "__main__":
    main()
