"""Trainer idle time with one vs two independent rollout jobs (``examples/grpo_trainer_job.py`` +
``examples/grpo_rollout_job.py``, issue 19).

Run: ``.venv/bin/python benchmarks/bench_rollout_jobs.py [--steps 12 --warmup 2 --threads 1 --json out.json]``
(trailing ``KEY=VALUE`` overrides go to every job).

Assets: a tiny Qwen2.5-VL with random weights and generated colour-MCQ images (``ensure_demo_assets``) in a
temp dir (or ``--work-dir``); a private redis-server (``cp.queue.RedisServer``). For ``k`` in (1, 2): ``k``
rollout jobs and one trainer job (1 rank), each its own process started as users start them, the run
``--steps`` steps long. From the trainer's ``metrics.jsonl``, after dropping the first ``--warmup`` steps:
the mean ``time/wait`` (seconds the trainer waited for records: its idle time), ``time/step`` (all its
phases) and the wall time between consecutive steps, the share of wall time spent waiting, and the mean
weight lag (``rollout/max_lag``). Printed: both runs side by side and the ratios two jobs / one job.

On a CPU-only machine with few cores (2 here) the jobs share the same cores, so a second rollout job also
slows the trainer and the first job down; on separate GPUs the jobs do not compete. ``--threads`` sets
``OMP_NUM_THREADS`` for every job (default 1, as ``torchrun`` would).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import cosmos_primitives as cp
from cosmos_primitives.testing.demo_assets import ensure_demo_assets
from cosmos_primitives.testing.recipe_runs import finish, kill_tree, launch_recipe, only_run_dir

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "configs" / "grpo_tiny_jobs.toml"


def run_with(jobs: int, args: argparse.Namespace, assets: list[str], url: str, work: Path) -> dict[str, float]:
    """One run with ``jobs`` rollout jobs; the trainer's means after warm-up."""
    out = work / f"jobs_{jobs}"
    out.mkdir()
    env = {"OMP_NUM_THREADS": str(args.threads), "PYTHONUNBUFFERED": "1"}
    common = ["--run", f"bench{jobs}_{os.getpid()}", "--redis", url, *assets, f"train.max_steps={args.steps}",
              "train.ckpt.export_safetensors=false", *args.overrides]
    rollouts = [launch_recipe(REPO / "examples" / "grpo_rollout_job.py", CONFIG, common, out / f"rollout_{i}.log",
                              cwd=REPO, env=env, new_session=True) for i in range(jobs)]
    trainer = launch_recipe(REPO / "examples" / "grpo_trainer_job.py", CONFIG,
                            [*common, f"train.output_dir={out / 'trainer'}"], out / "trainer.log", cwd=REPO, env=env)
    try:
        finish(trainer, out / "trainer.log", timeout_s=args.timeout)
        for i, proc in enumerate(rollouts):
            finish(proc, out / f"rollout_{i}.log", timeout_s=120)
    finally:
        for proc in rollouts:
            if proc.poll() is None:
                kill_tree(proc)
    rows = [json.loads(line) for line in (only_run_dir(out / "trainer") / "metrics.jsonl").read_text().splitlines()]
    rows = rows[args.warmup:]
    stamps = [r["time"] for r in rows if "time" in r]
    wall = statistics.mean(b - a for a, b in itertools.pairwise(stamps)) if len(stamps) > 1 else float("nan")
    wait = statistics.mean(r["time/wait"] for r in rows)
    return {"wait_s": wait, "step_s": statistics.mean(r["time/step"] for r in rows), "wall_s": wall,
            "wait_share": wait / wall if wall == wall else float("nan"),
            "max_lag": statistics.mean(r["rollout/max_lag"] for r in rows),
            "producers": statistics.mean(r["rollout/producers"] for r in rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1200.0)
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="bench_rollout_jobs_"))
    work.mkdir(parents=True, exist_ok=True)
    paths = [f"policy.model_name_or_path={work / 'model'}",
             f"train.train_policy.dataset.name={work / 'colour_mcq' / 'train.jsonl'}"]
    ensure_demo_assets(cp.load_config(CONFIG, [p.replace("=", "=demo:", 1) for p in paths]))
    assets = [*paths, "custom={}"]

    results = {}
    with cp.queue.RedisServer(persistent=False) as redis_server:
        for jobs in (1, 2):
            t0 = time.perf_counter()
            results[jobs] = run_with(jobs, args, assets, redis_server.url, work)
            print(f"{jobs} rollout job(s): {time.perf_counter() - t0:.0f}s", file=sys.stderr)
    one, two = results[1], results[2]
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.1f}; {args.steps} steps, first {args.warmup} dropped, OMP_NUM_THREADS={args.threads}")
    print(f"{'':28}{'1 rollout job':>15}{'2 rollout jobs':>16}{'2 / 1':>8}")
    for key, label in [("wait_s", "trainer idle s/step (wait)"), ("step_s", "trainer phases s/step"),
                       ("wall_s", "wall s/step"), ("wait_share", "idle share of wall"),
                       ("max_lag", "max weight lag (steps)"), ("producers", "producers per step")]:
        ratio = two[key] / one[key] if one[key] else float("nan")
        print(f"{label:28}{one[key]:>15.3f}{two[key]:>16.3f}{ratio:>8.2f}")
    if args.json:
        args.json.write_text(json.dumps({"one": one, "two": two}, indent=2))


if __name__ == "__main__":
    main()
