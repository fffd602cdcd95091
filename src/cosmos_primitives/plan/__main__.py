"""``python -m cosmos_primitives.plan CONFIG [overrides] [--gpus N] [--gpu-memory-gb 80] [--tokens T]``: the memory
plan of a config without a GPU (reads only the model's ``config.json``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cosmos_primitives.config.errors import ConfigError
from cosmos_primitives.config.loader import load_config
from cosmos_primitives.plan.startup import plan_for_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cosmos_primitives.plan", description=__doc__)
    parser.add_argument("config", help="TOML config")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.master_dtype=bfloat16")
    parser.add_argument("--gpus", type=int, default=None,
                        help="trainer GPUs (default: the product of [policy.parallelism] sizes, else 1)")
    parser.add_argument("--gpu-memory-gb", type=float, default=80.0, help="memory of one GPU in GB (default 80)")
    parser.add_argument("--mode", choices=["sft", "colocated", "disaggregated", "wfm"], default=None,
                        help="default: wfm for a diffusers folder (examples/wfm_rl.py), sft for [train.train_policy] "
                             "type = sft, else colocated")
    parser.add_argument("--transformer-config", default=None,
                        help="wfm: a diffusers transformer config.json to plan with (when [policy] "
                             "model_name_or_path is not at hand); the VAE is taken as Wan2.1's")
    parser.add_argument("--tokens", type=int, default=None,
                        help="tokens per micro-batch (default: SFT mini_batch x packing_budget; GRPO mini_batch x "
                             "model_max_length, an upper bound: real rows are prompt + response)")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    par = cfg.policy.parallelism
    fixed = par.pp_size * max(par.dp_replicate_size, 1) * par.cp_size * par.tp_size  # -1: inferred (one replica here)
    gpus = args.gpus or (fixed * par.dp_shard_size if par.dp_shard_size > 0 else fixed)
    device_memory = int(args.gpu_memory_gb * 1e9)
    try:
        hf_config = json.loads(Path(args.transformer_config).read_text()) if args.transformer_config else None
        mode = "wfm" if args.transformer_config else args.mode
        estimate = plan_for_config(cfg, gpus, mode=mode, device_memory=device_memory, tokens=args.tokens,
                                   hf_config=hf_config)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.config} on {gpus} GPU(s) of {args.gpu_memory_gb:g} GB:")
    print(estimate.report(device_memory))
    return 1 if estimate.total > device_memory else 0


if __name__ == "__main__":
    sys.exit(main())
