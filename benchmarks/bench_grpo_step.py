"""GRPO step time breakdown on the tiny config: where a colocated step of ``examples/grpo_vlm.py`` goes.

Run: ``.venv/bin/python benchmarks/bench_grpo_step.py [--steps 8 --warmup 2 --json out.json]``
(trailing ``KEY=VALUE`` overrides go to the run).

Assets: a tiny Qwen2.5-VL with random weights and generated colour-MCQ images, written once into a
temp dir (or ``--work-dir``) by ``ensure_demo_assets``; random weights are fine for timing (rewards
are ~0, responses run to ``max_response_length`` or stop early at random).

1. Colocated (measured): ``python examples/grpo_vlm.py --config examples/configs/grpo_tiny.toml``
   as one plain process, ``--steps`` steps, export off. From ``<run_dir>/metrics.jsonl``, after
   dropping the first ``--warmup`` steps: per phase (``time/rollout``, ``time/reward``,
   ``time/logprobs``, which includes the collate of the batch, ``time/update``, ``time/sync``) the
   mean seconds and its share of ``time/step`` (the sum of the phases, same run), the wall time
   between consecutive metrics rows (also counts what no phase times: logging, checkpoint hook),
   and the generation throughput: prompts x samples x mean ``response_length`` / ``time/rollout``
   (completion tokens per second; prompts x samples = ``grpo.rollout_batch_size`` x
   ``grpo.num_samples_per_prompt`` of the config).
The disaggregated arm ran the one-job recipe ``examples/grpo_vlm_disaggregated.py``, removed with it (issue
33: the independent jobs are the one disaggregated design); ``benchmarks/bench_rollout_jobs.py`` times the
trainer job against its rollout jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import cosmos_primitives as cp
from cosmos_primitives.logging.tracker import read_metrics
from cosmos_primitives.testing.demo_assets import ensure_demo_assets

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "grpo_vlm.py"
COLOCATED_CONFIG = REPO / "examples" / "configs" / "grpo_tiny.toml"
COLOCATED_PHASES = ["rollout", "reward", "logprobs", "update", "sync"]
DISAGGREGATED_PHASES = ["wait", "collate", "logprobs", "update", "sync"]
# keys that legitimately differ between the two tiny configs (everything else must match)
MODE_KEYS = ("disaggregated.", "redis.", "logging.experiment_name", "train.output_dir",
             "grpo.allowed_outdated_steps")
FIRST_SYNC_LINE = re.compile(r"first weight sync ([0-9.]+)s \(([0-9.]+) MiB")
ROLLOUT_LINE = re.compile(r"\[rollout\] batch (\d+): (\d+) records with weight version (\d+), "
                          r"reward [-+0-9.e]+, ([0-9.]+)s")


def machine() -> dict[str, Any]:
    if torch.cuda.is_available():
        device = f"cuda ({torch.cuda.get_device_name(0)}, {torch.cuda.device_count()} visible)"
    else:
        device = "cpu (no CUDA device)"
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {"cpu_count": os.cpu_count(), "torch": torch.__version__, "device": device,
            "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            "load_avg_1m_at_start": round(load[0], 2)}


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_differences(a: cp.config.Config, b: cp.config.Config) -> list[str]:
    """Resolved keys (outside ``MODE_KEYS``) whose values differ between two configs."""
    fa, fb = flatten(cp.config.config_to_dict(a)), flatten(cp.config.config_to_dict(b))
    return [f"{k}: {fa.get(k)!r} vs {fb.get(k)!r}" for k in sorted(set(fa) | set(fb))
            if not k.startswith(MODE_KEYS) and fa.get(k) != fb.get(k)]


def run_example(name: str, cmd: list[str], out_dir: Path, log_path: Path, env: dict[str, str],
                timeout_s: float) -> tuple[Path, str, float]:
    """Run one recipe; return ``(run_dir, log, wall seconds)``; exit with its log tail if it fails."""
    print(f"running {name}: {' '.join(cmd)}", flush=True)
    start = time.perf_counter()
    with log_path.open("wb") as log_file:
        try:
            proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired:
            sys.exit(f"{name} ran past --timeout-s {timeout_s:.0f}; log: {log_path}")
    wall = time.perf_counter() - start
    log = log_path.read_text(errors="replace")
    if proc.returncode != 0:
        sys.exit(f"{name} exited with {proc.returncode} after {wall:.0f}s; last lines of {log_path}:\n"
                 f"{log[-4000:]}")
    run_dir = cp.utils.latest_run_dir(out_dir)
    if run_dir is None:
        sys.exit(f"{name} wrote no run directory under {out_dir}")
    print(f"  done in {wall:.0f}s (process start to exit), run dir {run_dir}", flush=True)
    return run_dir, log, wall


def kept_rows(run_dir: Path, steps: int, warmup: int) -> tuple[list[dict], list[float]]:
    """Metrics rows of the timed steps and the wall seconds between each and the row before it."""
    rows = read_metrics(run_dir)
    if len(rows) != steps or [r["step"] for r in rows] != list(range(1, steps + 1)):
        sys.exit(f"{run_dir}/metrics.jsonl has steps {[r.get('step') for r in rows]}, expected 1..{steps}")
    walls = [rows[i]["time"] - rows[i - 1]["time"] for i in range(warmup, steps)]
    return rows[warmup:], walls


def mean(rows: list[dict], key: str) -> float:
    return statistics.fmean(float(r[key]) for r in rows)


def summarise(rows: list[dict], walls: list[float], phases: list[str]) -> dict[str, Any]:
    step = mean(rows, "time/step")
    return {
        "phases_s": {p: mean(rows, f"time/{p}") for p in phases},
        "share_of_step": {p: mean(rows, f"time/{p}") / step for p in phases},
        "step_s": step,
        "step_s_per_step": [float(r["time/step"]) for r in rows],
        "wall_per_step_s": statistics.fmean(walls),
        "response_length": mean(rows, "response_length"),
    }


def fmt_s(value: float | None) -> str:
    return f"{value:9.3f}" if value is not None else f"{'-':>9}"


def fmt_share(value: float | None) -> str:
    return f"{value:7.1%}" if value is not None else f"{'-':>7}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8, help="GRPO steps per run (train.max_steps)")
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out of the figures")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="assets, run dirs and logs go here (kept); default: a temp dir, removed")
    parser.add_argument("--items", type=int, default=256, help="colour-MCQ items to generate (custom.demo_items)")
    parser.add_argument("--threads", type=int, default=None,
                        help="OMP_NUM_THREADS for both runs (default: plain python uses all cores, "
                             "torchrun sets 1 per rank)")
    parser.add_argument("--timeout-s", type=float, default=3600.0, help="limit per run")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides for both runs, e.g. "
                        "grpo.rollout_batch_size=2")
    args = parser.parse_args()
    if args.warmup < 1 or args.steps <= args.warmup:
        parser.error("need --warmup >= 1 (the first step loads and warms up) and --steps > --warmup")

    info = machine()
    print(f"machine: {info['cpu_count']} CPUs, torch {info['torch']}, device {info['device']}, "
          f"load average {info['load_avg_1m_at_start']} at start, python {info['python']}")

    tmp = None
    if args.work_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="bench_grpo_step_")
        work = Path(tmp.name)
    else:
        work = args.work_dir.resolve()
        work.mkdir(parents=True, exist_ok=True)
    try:
        report = run(args, work, info)
    finally:
        if tmp is not None:
            tmp.cleanup()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"figures written to {args.json}")


def run(args: argparse.Namespace, work: Path, info: dict[str, Any]) -> dict[str, Any]:
    # "demo:" asks for the generated assets at these paths; the runs then read them as plain paths
    demo = [f"policy.model_name_or_path=demo:{work / 'model'}",
            f"train.train_policy.dataset.name=demo:{work / 'colour_mcq' / 'train.jsonl'}"]
    assets = [a.replace("=demo:", "=", 1) for a in demo]
    colo_cfg = cp.load_config(COLOCATED_CONFIG, [*assets, *args.overrides, f"train.max_steps={args.steps}",
                                                 "train.ckpt.export_safetensors=false"])
    start = time.perf_counter()
    written = ensure_demo_assets(cp.load_config(COLOCATED_CONFIG, [*demo, f"custom.demo_items={args.items}"]))
    if written:
        print(f"demo assets written in {time.perf_counter() - start:.1f}s: {', '.join(map(str, written))}")
    grpo, rollout = colo_cfg.grpo, colo_cfg.rollout
    prompts, samples = grpo.rollout_batch_size, grpo.num_samples_per_prompt
    # the keys the disaggregated run must share with the colocated one (the rest is the same in both configs)
    shared = [f"grpo.rollout_batch_size={prompts}", f"grpo.num_samples_per_prompt={samples}",
              f"rollout.max_response_length={rollout.max_response_length}", f"train.max_steps={args.steps}"]
    common = [*assets, *args.overrides, *shared, "train.ckpt.export_safetensors=false"]
    print(f"workload: {args.steps} steps ({args.warmup} warmup dropped) x {prompts} prompts x {samples} samples, "
          f"max {rollout.max_response_length} new tokens, rollout batch {rollout.batch_size} sequences, "
          f"mini_batch {colo_cfg.train.train_policy.mini_batch}, dtype {colo_cfg.policy.dtype}")

    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COSMOS_REDIS_URL": ""}
    if args.threads is not None:
        env["OMP_NUM_THREADS"] = str(args.threads)
    threads_note = (f"OMP_NUM_THREADS={env['OMP_NUM_THREADS']}" if "OMP_NUM_THREADS" in env
                    else f"colocated: torch default ({info['torch_threads']} threads); "
                         "disaggregated: torchrun default OMP_NUM_THREADS=1 per rank")
    print(f"threads: {threads_note}")
    if args.threads is None and info["load_avg_1m_at_start"] > 0.5 * (info["cpu_count"] or 1):
        print(f"WARNING: load average {info['load_avg_1m_at_start']} on {info['cpu_count']} CPUs: other jobs share "
              "the cores, multi-threaded regions of the colocated process may stall; consider --threads 1")

    colo_out = work / "colocated"
    colo_cmd = [sys.executable, str(EXAMPLE), "--config", str(COLOCATED_CONFIG),
                f"train.output_dir={colo_out}", *common]
    colo_dir, _, colo_wall = run_example("colocated", colo_cmd, colo_out, work / "colocated.log", env,
                                         args.timeout_s)
    colo_rows, colo_walls = kept_rows(colo_dir, args.steps, args.warmup)
    colo = summarise(colo_rows, colo_walls, COLOCATED_PHASES)
    tokens = prompts * samples * colo["response_length"]
    colo["completion_tokens_per_step"] = tokens
    colo["generation_tokens_per_s"] = tokens / colo["phases_s"]["rollout"]
    colo["trained_tokens_per_wall_s"] = tokens / colo["wall_per_step_s"]
    colo["process_wall_s"] = colo_wall

    dis = None
    print_tables(args, colo, dis, prompts, samples)
    report: dict[str, Any] = {
        "machine": info, "threads": threads_note, "steps": args.steps, "warmup": args.warmup,
        "prompts_per_step": prompts, "samples_per_prompt": samples,
        "max_response_length": rollout.max_response_length, "overrides": args.overrides,
        "colocated": colo, "disaggregated": dis,
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }
    if dis is not None:
        report["ratios"] = {"disaggregated_over_colocated_step": dis["step_s"] / colo["step_s"],
                            "disaggregated_over_colocated_wall_per_step":
                                dis["wall_per_step_s"] / colo["wall_per_step_s"]}
    return report


def print_tables(args: argparse.Namespace, colo: dict, dis: dict | None, prompts: int, samples: int) -> None:
    kept = args.steps - args.warmup
    print(f"\nGRPO step time, tiny config: mean over steps {args.warmup + 1}..{args.steps} ({kept} steps), "
          f"{prompts} prompts x {samples} samples per step")
    head = f"{'phase':<34} {'colo s':>9} {'share':>7}"
    if dis is not None:
        head += f"  {'disagg s':>9} {'share':>7} {'dis/colo':>9}"
    print(head)
    print("-" * len(head))

    def line(label: str, c: float | None, c_share: float | None, d: float | None = None,
             d_share: float | None = None, compare: bool = True) -> None:
        text = f"{label:<34} {fmt_s(c)} {fmt_share(c_share)}"
        if dis is not None:
            if not compare or c is None or d is None:
                ratio = f"{'-':>9}"
            elif min(c, d) < 1e-3:  # a phase that does nothing on one side: no meaningful ratio
                ratio = f"{'n/a':>9}"
            else:
                ratio = f"{d / c:9.2f}"
            text += f"  {fmt_s(d)} {fmt_share(d_share)} {ratio}"
        print(text)

    cp_, cs = colo["phases_s"], colo["share_of_step"]
    dp_, ds = (dis["phases_s"], dis["share_of_step"]) if dis else ({}, {})
    line("rollout (generate)", cp_["rollout"], cs["rollout"])
    line("reward", cp_["reward"], cs["reward"])
    if dis is not None:
        line("wait for records (queue)", None, None, dp_["wait"], ds["wait"])
        line("collate", None, None, dp_["collate"], ds["collate"])
        line("logprobs (colo: incl. collate)", cp_["logprobs"], cs["logprobs"], dp_["logprobs"], ds["logprobs"],
             compare=False)
        line("collate + logprobs", cp_["logprobs"], cs["logprobs"], dp_["collate"] + dp_["logprobs"],
             ds["collate"] + ds["logprobs"])
    else:
        line("logprobs (incl. collate)", cp_["logprobs"], cs["logprobs"])
    line("update (fwd + bwd + optimizer)", cp_["update"], cs["update"], dp_.get("update"), ds.get("update"))
    line("weight sync", cp_["sync"], cs["sync"], dp_.get("sync"), ds.get("sync"))
    d_step = dis["step_s"] if dis else None
    d_wall = dis["wall_per_step_s"] if dis else None
    line("step (time/step, sum of phases)", colo["step_s"], 1.0, d_step, 1.0 if dis else None)
    line("wall per step (metrics timestamps)", colo["wall_per_step_s"], colo["wall_per_step_s"] / colo["step_s"],
         d_wall, d_wall / d_step if dis else None)

    print(f"\nmean response length: colocated {colo['response_length']:.1f} tokens"
          + (f", disaggregated {dis['response_length']:.1f}" if dis else ""))
    print(f"colocated generation: {colo['completion_tokens_per_step']:.0f} completion tokens / "
          f"{cp_['rollout']:.3f} s rollout = {colo['generation_tokens_per_s']:.0f} tokens/s "
          f"(rollout share of the step {cs['rollout']:.1%})")
    print(f"colocated trained completion tokens per wall second: {colo['trained_tokens_per_wall_s']:.0f}")
    print(f"process wall time (start to exit, incl. model load): colocated {colo['process_wall_s']:.0f}s"
          + (f", disaggregated {dis['process_wall_s']:.0f}s" if dis else ""))
    if dis is None:
        print("\nratio (baseline in this run): rollout time / step time = "
              f"{cs['rollout']:.3f}; run with --with-disaggregated for the disaggregated / colocated ratio")
        return
    if "generation_tokens_per_s" in dis:
        print(f"disaggregated rollout rank: {dis['rollout_batch_s']:.2f} s per batch (generate + score + put, "
              f"from its log, batches after {args.warmup}; {dis['rollout_batches']} batches in all) = "
              f"~{dis['generation_tokens_per_s']:.0f} tokens/s, "
              f"{dis['generation_tokens_per_s'] / colo['generation_tokens_per_s']:.2f}x colocated generation")
    print(f"disaggregated trained completion tokens per wall second: {dis['trained_tokens_per_wall_s']:.0f}")
    if "first_sync_s" in dis:
        print(f"disaggregated weight sync: {dp_['sync']:.3f} s per step (time/sync) against "
              f"{dis['first_sync_s']:.2f} s for the first broadcast of {dis['sync_mib']:.1f} MiB; the difference is "
              "the trainer waiting for the rollout rank to finish the generate call in flight (it joins a "
              "broadcast only between batches)")
    if dis.get("staleness_mean") is not None:
        print(f"disaggregated mean staleness/max of the trained records: {dis['staleness_mean']:.2f} steps")
    print(f"\nratio trainer step time (time/step) disaggregated / colocated: {dis['step_s'] / colo['step_s']:.3f}")
    print(f"ratio wall time per step disaggregated / colocated:            "
          f"{dis['wall_per_step_s'] / colo['wall_per_step_s']:.3f}")
    if torch.cuda.is_available():
        print("note: both ranks of the disaggregated run use the same visible GPU(s) unless CUDA_VISIBLE_DEVICES "
              "splits them")
    else:
        print(f"note: CPU only ({os.cpu_count()} cores): the rollout rank and the trainer rank share the same "
              "cores, so generating the next batch while the trainer trains cannot overlap as on separate GPUs "
              "(each rank slows the other); this ratio measures the cost of the split (queue, records, broadcast, "
              "contention) and the thread settings above, not the overlap gain disaggregation brings on GPUs")


if __name__ == "__main__":
    main()
