"""Evaluate a model or an exported checkpoint on an MCQ benchmark; print accuracy per dataset.

    python examples/evaluate.py --model outputs/sft/<timestamp>/safetensors/final \\
        --benchmark data/benchmark.jsonl --data-dir data --results-dir results
    python examples/evaluate.py --config examples/configs/eval_tiny.toml --model MODEL \\
        --benchmark FILE --data-dir DIR --results-dir DIR --temperature 0 eval.fps=2
    python examples/evaluate.py --results-dir results --score-only      # table from saved predictions
    python examples/evaluate.py --config robovqa.yaml --model_name MODEL --data_dir data --results_dir results
                                    # the Cosmos-Reason1 guide's command: its YAML, flags and data folder
    python examples/evaluate.py --score-only --result_dir results       # its calculate_accuracy.py

This reproduces the guide's evaluation tool (cosmos-reason1 ``examples/benchmark/tools/eval``):
its prompts, answer extraction, retries of empty answers and results layout
(``docs/evaluation.md``). The benchmark is a JSON list or JSONL of items (``question``,
``choices``, ``answer`` letter, optional ``video`` / ``image`` paths relative to --data-dir,
``dataset``, ``id``); see ``cosmos_primitives.eval.benchmark``. Without --benchmark, --data-dir is
read as the guide lays benchmarks out: ``<data-dir>/benchmark/<dataset>/<dataset>_benchmark_qa_pairs.json``
with its ``clips/``, for the datasets of --datasets / the YAML's ``datasets`` (all found when none
are named). Predictions are saved as the tool saves them,
``<results-dir>/<model folder name>/<answer_type>/<dataset>/<clip>.json``, so the tool's
``calculate_accuracy.py --result_dir <results-dir>`` reads them; running again with the same
--results-dir skips items that already have one (``[eval] skip_saved``), so an interrupted
evaluation picks up where it stopped. Settings come from the ``[eval]`` section of --config (the
defaults are the tool's), then dotted overrides, then the flags.
"""

from __future__ import annotations

import argparse
from typing import Any

import msgspec

import cosmos_primitives as cp
from cosmos_primitives.eval import (
    benchmark_root,
    calculate_accuracy,
    evaluate,
    format_accuracy_table,
    load_benchmark_dir,
)

# flag -> [eval] field
FLAGS = {"model": "model", "benchmark": "benchmark", "data_dir": "data_dir", "results_dir": "results_dir",
         "temperature": "temperature", "max_response_length": "max_response_length", "answer_type": "answer_type",
         "datasets": "datasets", "backend": "backend", "batch_size": "batch_size", "limit": "limit"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", "--config_file", dest="config",
                        help="TOML file with an [eval] section, e.g. examples/configs/eval_tiny.toml, "
                        "or the Cosmos-Reason1 evaluation YAML (datasets / model / evaluation / generation)")
    parser.add_argument("--model", "--model_name", dest="model",
                        help="exported safetensors folder, HF model folder or hub id")
    parser.add_argument("--benchmark", help="JSON / JSONL benchmark file (none: the benchmarks under --data-dir)")
    parser.add_argument("--data-dir", "--data_dir", dest="data_dir",
                        help="folder the items' media paths are relative to; without --benchmark, the guide's "
                        "data folder (<dir>/benchmark/<dataset>/<dataset>_benchmark_qa_pairs.json)")
    parser.add_argument("--results-dir", "--results_dir", "--result_dir", dest="results_dir",
                        help="where predictions are saved, under <model folder name>/<answer_type>/ (and "
                        "found on re-runs); with --score-only, every prediction below it is counted")
    parser.add_argument("--temperature", type=float, help="0 for greedy decoding")
    parser.add_argument("--max-response-length", "--max-tokens", "--max_tokens", dest="max_response_length", type=int,
                        help="new tokens per answer ([eval] max_response_length; --max-tokens: the tool's name)")
    parser.add_argument("--answer-type", choices=["reasoning", "letter"])
    parser.add_argument("--datasets", "--dataset", dest="datasets", type=lambda text: [d for d in text.split(",") if d],
                        help="only these datasets, comma-separated, e.g. robovqa,av")
    parser.add_argument("--backend", choices=["hf", "vllm"])
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--limit", type=int, help="per dataset, the first clips making at least N items "
                        "(a --benchmark file: its first N items); 0 or -1: all")
    parser.add_argument("--skip_saved", "--skip-saved", dest="skip_saved", action="store_true",
                        help="reuse saved predictions (the default here; the guide's tool needs this flag)")
    parser.add_argument("--no-skip-saved", action="store_true", help="evaluate items again even if saved")
    parser.add_argument("--score-only", action="store_true", help="only recompute the table from --results-dir")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. eval.fps=2 eval.seed=3")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, dict[str, Any]]:
    args = parse_args(argv)
    cfg = cp.load_config(args.config, overrides=args.overrides)
    changes = {field: getattr(args, flag) for flag, field in FLAGS.items() if getattr(args, flag) is not None}
    if args.skip_saved and args.no_skip_saved:
        raise SystemExit("evaluate.py: --skip_saved and --no-skip-saved contradict each other; give one")
    if args.skip_saved or args.no_skip_saved:
        changes["skip_saved"] = args.skip_saved
    settings = msgspec.structs.replace(cfg.eval, **changes)

    if args.score_only:
        table = calculate_accuracy(settings.results_dir, settings.datasets)
        print(format_accuracy_table(table))
        return table

    model = settings.model or cfg.policy.model_name_or_path
    if not model or not (settings.benchmark or settings.data_dir):
        raise SystemExit("evaluate.py needs --model (or [eval] model / [policy] model_name_or_path) and "
                         "--benchmark (or [eval] benchmark), or --data_dir holding the guide's benchmark folders")
    if settings.benchmark:
        report = evaluate(model, settings.benchmark, data_dir=settings.data_dir or None,
                          results_dir=settings.results_dir, cfg=settings)
    else:  # the guide's layout: <data_dir>/benchmark/<dataset>/<dataset>_benchmark_qa_pairs.json
        items = load_benchmark_dir(settings.data_dir, settings.datasets, settings.limit)
        report = evaluate(model, items, data_dir=benchmark_root(settings.data_dir),
                          results_dir=settings.results_dir, cfg=settings)
    print(f"{report.generated} generated, {report.skipped} reused; predictions in {report.results_dir}")
    return report.table


if __name__ == "__main__":
    main()
