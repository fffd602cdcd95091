"""Checkpoint benchmark: how long a save stalls the training loop, sync vs async, against a plain torch.save.

Run: ``.venv/bin/python benchmarks/bench_checkpoint.py [--params-m 50 --repeats 3]``.

A model of ``params-m`` million float32 parameters with AdamW moments (3 x the weights on disk) is
saved ``repeats`` times by ``CheckpointManager`` in a one-rank process group:

1. ``save_mode = "sync"``: the loop is blocked for the whole DCP write + marker + rename.
2. ``save_mode = "async"``: the loop is blocked only while DCP stages a CPU copy; the stall is the
   time until ``save()`` returns, and the background time until the folder is complete is reported too.
3. Baseline: ``torch.save`` of the same model + optimizer state dicts into one file (what a
   non-sharded, non-atomic loop would do).

Printed ratios: async stall / sync stall, and sync DCP save / ``torch.save``; both measured in this run.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from cosmos_primitives.checkpoint import CheckpointManager
from cosmos_primitives.config import CheckpointConfig
from cosmos_primitives.parallel import destroy_distributed, init_distributed


def build(params_m: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    width = 2048
    layers = max(1, round(params_m * 1e6 / (width * width)))
    model = nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(2, width)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    return model, optimizer


def time_manager(mode: str, model: nn.Module, optimizer: torch.optim.Optimizer, root: Path,
                 repeats: int) -> tuple[list[float], list[float]]:
    cfg = CheckpointConfig(enable_checkpoint=True, save_mode=mode, max_keep=1, export_safetensors=False)
    manager = CheckpointManager(cfg, root / mode, model=model, optimizer=optimizer)
    stalls, totals = [], []
    for step in range(1, repeats + 1):
        start = time.perf_counter()
        manager.save(step)
        stalls.append(time.perf_counter() - start)
        manager.wait()
        totals.append(time.perf_counter() - start)
    manager.close()
    return stalls, totals


def time_torch_save(model: nn.Module, optimizer: torch.optim.Optimizer, root: Path, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, root / "plain.pt")
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params-m", type=int, default=50, help="model size in millions of float32 parameters")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    init_distributed(backend="gloo")
    model, optimizer = build(args.params_m)
    n_params = sum(p.numel() for p in model.parameters())
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        sync_stall, _ = time_manager("sync", model, optimizer, root, args.repeats)
        async_stall, async_total = time_manager("async", model, optimizer, root, args.repeats)
        plain = time_torch_save(model, optimizer, root, args.repeats)
        on_disk = sum(f.stat().st_size for f in (root / "sync" / "checkpoints").rglob("*") if f.is_file())
    destroy_distributed()
    med = statistics.median
    print(f"model: {n_params / 1e6:.1f} M params, checkpoint {on_disk / 1e9:.2f} GB, {args.repeats} saves each")
    print(f"sync save, loop stalled       : {med(sync_stall):7.2f} s (median)")
    print(f"async save, loop stalled      : {med(async_stall):7.2f} s (median); "
          f"complete after {med(async_total):.2f} s")
    print(f"torch.save baseline           : {med(plain):7.2f} s (median)")
    print(f"ratio async stall / sync stall: {med(async_stall) / med(sync_stall):.3f}")
    print(f"ratio sync DCP / torch.save   : {med(sync_stall) / med(plain):.3f}")


if __name__ == "__main__":
    main()
