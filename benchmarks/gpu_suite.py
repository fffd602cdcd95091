"""The GPU validation pack: every GPU check in one command, time-boxed, one JSON and one table.

    python3 benchmarks/gpu_suite.py --out "$OUT" --command 1      # on a GPU machine: one device command
    python3 benchmarks/gpu_suite.py --out "$OUT"                  # every part (about 20 minutes)
    python3 benchmarks/gpu_suite.py --out /tmp/pack --dry-run     # tiny shapes on the CPU (CI runs this)
    python3 benchmarks/gpu_suite.py --out "$OUT" --wheels .whl    # first install carried wheels

Parts (``benchmarks/gpu_suite_parts.py``): SFT throughput and MFU of a Qwen2.5-1.5B-shaped model,
chunked / fused vs naive log-prob heads, in-process sync of a 7B state dict, a colocated GRPO step
of a Qwen2.5-VL-3B-shaped model, a FlowGRPO step of a Cosmos-Predict2-2B-shaped transformer, and
each recipe's tiny config in bf16 against float32. Each runs in its own process under its own time
box, so one that fails, hangs or runs out of memory is recorded as such and the others still run.

Writes ``gpu_suite.json`` (machine, versions, every figure, each part's status and log tail),
``gpu_suite.md`` (the same as a table; both rewritten after each part) and ``gpu_suite.log`` (every
part's output, one after another) to ``--out``, and prints the table. Exit status 0 when every
part passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import json
import math
import multiprocessing
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DRY_RUN_BOX_S = 90
"""Each part's time box in a dry run (tiny shapes; the whole dry run stays under 2 minutes on 2 cores
when nothing fails)."""
PARTIAL = "partial.json"
"""A part that measures several things writes its figures so far to ``<work>/partial.json``
(``gpu_parts_speed.save_partial``) after each, so a time box or a crash still keeps them."""
DRY_RUN_PRELOAD = (
    "transformers.models.qwen2.modeling_qwen2",
    "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl",
    "cosmos_primitives",
    "cosmos_primitives.policy",
    "cosmos_primitives.testing",
    "diffusers",
)
"""What a dry run imports once, before its parts are forked, beyond ``gpu_suite_parts`` itself: a fresh
interpreter per part spent 3-5 CPU-s importing these, most of a tiny part's cost."""


def install_wheels(folder: Path) -> None:
    """``pip install --no-index --no-deps`` every wheel in ``folder`` (what a machine without an
    index needs carried: see benchmarks/RESULTS.md)."""
    wheels = sorted(folder.glob("*.whl"))
    if not wheels:
        sys.exit(f"--wheels {folder}: no .whl files there (see benchmarks/RESULTS.md for the list to carry)")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", *map(str, wheels)],
                   check=True)


def machine() -> dict[str, Any]:
    import torch
    import transformers

    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "gpu_memory_gib": (torch.cuda.get_device_properties(0).total_memory / 2**30
                           if torch.cuda.is_available() else None),
        "cpu_count": os.cpu_count(),
    }
    for name in ("diffusers", "peft"):
        try:
            info[name] = __import__(name).__version__
        except ImportError:
            info[name] = None
    return info


def _forked_part(argv: list[str], env: dict[str, str], log_path: Path) -> None:
    """The body of a dry-run part's forked process: what a fresh ``gpu_suite.py`` child would see (its
    working directory, environment, output to the part's log), then :func:`main` on ``argv``."""
    from cosmos_primitives.testing.forked_script import become_child

    become_child(REPO, env, log_path)
    sys.exit(main(argv))


def _run_forked(argv: list[str], env: dict[str, str], log_path: Path, box_s: float) -> int | None:
    """Fork a process running :func:`_forked_part`; its exit code, or None when it outran ``box_s``
    (it is killed, as ``subprocess.run`` kills a child past its timeout)."""
    proc = multiprocessing.get_context("fork").Process(target=_forked_part, args=(argv, env, log_path))
    proc.start()
    proc.join(box_s)
    if proc.is_alive():
        proc.kill()
        proc.join()
        return None
    return proc.exitcode


def part_command(name: str, result_path: Path, work: Path, dry: bool) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of one part's child process (``gpu_suite.py --part``)."""
    cmd = [sys.executable, __file__, "--part", name, "--result", str(result_path), "--work", str(work)]
    if dry:
        cmd.append("--dry-run")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    return cmd, env


def run_part(name: str, box_s: float, dry: bool, out: Path, work: Path) -> dict[str, Any]:
    """Run one part in a child process (``--part``) within ``box_s`` seconds; its record.

    On a GPU the child is a fresh interpreter. In a dry run it is forked from this process with the
    same command line (parsed by :func:`main`), so it starts with what this process imported
    (:data:`DRY_RUN_PRELOAD`) instead of importing torch and transformers again."""
    result_path, log_path = work / f"{name}.json", work / f"{name}.log"
    cmd, env = part_command(name, result_path, work / name, dry)
    start = time.perf_counter()
    with log_path.open("wb") as log:
        if dry:
            code = _run_forked(cmd[2:], env, log_path, box_s)
        else:
            try:
                code = subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      timeout=box_s).returncode
            except subprocess.TimeoutExpired:
                code = None
    if code is None:
        status = f"timed out after {box_s:.0f} s"
    else:
        status = "ok" if code == 0 and result_path.exists() else f"failed (exit {code})"
    record: dict[str, Any] = {"status": status, "seconds": round(time.perf_counter() - start, 1), "box_s": box_s}
    log = log_path.read_text(errors="replace")
    with (out / "gpu_suite.log").open("a", errors="replace") as combined:
        combined.write(f"\n===== {name}: {status} =====\n{log}")
    partial_path = work / name / PARTIAL
    if result_path.exists():
        record.update(json.loads(result_path.read_text()))
    elif partial_path.exists():  # a part cut short keeps the figures it had measured
        record.update(json.loads(partial_path.read_text()))
        record.setdefault("notes", []).append("cut short: the figures measured before it stopped")
    if status != "ok":
        record["log_tail"] = log[-2500:]
    return record


def fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [f"# GPU validation pack ({'dry run, CPU' if report['dry_run'] else m['gpu']})", "",
             f"{m['date']}, host {m['host']}, Python {m['python']}, torch {m['torch']} (CUDA {m['cuda']}), "
             f"transformers {m['transformers']}, diffusers {m['diffusers']}, peft {m['peft']}", "",
             "| part | status | seconds | figures |", "|---|---|---|---|"]
    for name, part in report["parts"].items():
        figures = ", ".join(f"{k} {fmt(v)}" for k, v in part.get("figures", {}).items())
        lines.append(f"| {name} | {part['status']} | {part['seconds']} / {part['box_s']:.0f} | {figures} |")
    for name, part in report["parts"].items():
        for note in part.get("notes", []):
            lines.append(f"- {name}: {note}")
    for name, part in report["parts"].items():
        for label, kernels in (part.get("top_kernels") or {}).items():
            listed = "; ".join(f"{kernel} {ms:.2f} ms" for kernel, ms in kernels or [])
            lines.append(f"- {name} / {label} top kernels: {listed}")
    return "\n".join(lines) + "\n"


def write_report(report: dict[str, Any], out: Path) -> str:
    """Write ``gpu_suite.json`` and ``gpu_suite.md`` to ``out``; return the table."""
    (out / "gpu_suite.json").write_text(json.dumps(report, indent=1, default=str))
    table = markdown(report)
    (out / "gpu_suite.md").write_text(table)
    return table


def child(args: argparse.Namespace) -> None:
    """Run one part in this process and write its result JSON."""
    sys.path.insert(0, str(REPO / "src"))
    sys.path.insert(0, str(REPO / "benchmarks"))
    from gpu_suite_parts import PARTS

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    result = PARTS[args.part][0](args.dry_run, work)
    Path(args.result).write_text(json.dumps(result, indent=1, default=str))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "gpu_suite",
                        help="where the JSON, table and logs go")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (CI)")
    parser.add_argument("--parts", default="", help="comma-separated subset of the parts (default: all)")
    parser.add_argument("--command", type=int, default=None,
                        help="run the parts of one device command (gpu_suite_parts.COMMANDS: 1, 2 or 3)")
    parser.add_argument("--wheels", type=Path, help="install the wheels in this folder first (no index needed)")
    parser.add_argument("--part", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.part:
        child(args)
        return 0
    if args.wheels:
        install_wheels(args.wheels)

    sys.path.insert(0, str(REPO / "src"))
    sys.path.insert(0, str(REPO / "benchmarks"))
    from gpu_suite_parts import COMMANDS, PARTS

    if args.command is not None and args.command not in COMMANDS:
        parser.error(f"--command {args.command}: the commands are {sorted(COMMANDS)}")
    chosen = [p for p in args.parts.split(",") if p] or (COMMANDS[args.command] if args.command else list(PARTS))
    unknown = sorted(set(chosen) - set(PARTS))
    if unknown:
        parser.error(f"unknown --parts {unknown}; the parts are {', '.join(PARTS)}")
    if args.dry_run:
        os.environ["COSMOS_DEVICE"] = "cpu"
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        for module in DRY_RUN_PRELOAD:
            # one not installed: the part that needs it fails with the error in its log
            with contextlib.suppress(ImportError):
                importlib.import_module(module)
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"dry_run": args.dry_run, "machine": machine(), "parts": {}}
    if not args.dry_run and report["machine"]["gpu"] is None:
        print("gpu_suite: no CUDA GPU visible; use --dry-run for the CPU smoke run", file=sys.stderr)
        return 2
    (args.out / "gpu_suite.log").write_text("")
    with tempfile.TemporaryDirectory(prefix="gpu_suite_") as tmp:
        for name in chosen:
            box = DRY_RUN_BOX_S if args.dry_run else PARTS[name][1]
            print(f"gpu_suite: {name} (time box {box} s) ...", flush=True)
            report["parts"][name] = part = run_part(name, box, args.dry_run, args.out, Path(tmp))
            print(f"gpu_suite: {name}: {part['status']} in {part['seconds']} s", flush=True)
            # after every part, so a machine taken back mid-run still leaves the parts done so far
            table = write_report(report, args.out)
    print(table)
    return 0 if all(p["status"] == "ok" for p in report["parts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
