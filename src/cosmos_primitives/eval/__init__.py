"""MCQ / exact-match evaluation of a model or exported checkpoint on benchmark files, reproducing
the Cosmos-Reason1 guide's evaluation tool (prompts, answer extraction, retries, results layout).

::

    report = cp.eval.evaluate("outputs/sft/20260101/safetensors/final", "bench.jsonl",
                              data_dir="data", results_dir="results", cfg=cfg.eval)
    report.table["overall"]["accuracy"]
    cp.eval.calculate_accuracy("results")      # the same table, from the saved predictions alone

Names load on first use so that ``import cosmos_primitives.eval`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cosmos_primitives.utils.lazy_module import lazy_exports

_EXPORTS = {
    "BenchmarkFormatError": "benchmark",
    "BenchmarkItem": "benchmark",
    "load_benchmark": "benchmark",
    "benchmark_root": "benchmark_dir",
    "benchmark_files": "benchmark_dir",
    "load_benchmark_dir": "benchmark_dir",
    "prompt_text": "prompts",
    "extract_letter": "scoring",
    "extract_prediction": "scoring",
    "extract_reasoning": "scoring",
    "is_correct": "scoring",
    "first_sampling_params": "sampling",
    "retry_sampling_params": "sampling",
    "ResultStore": "result_store",
    "run_dir": "result_store",
    "accuracy_table": "accuracy",
    "format_accuracy_table": "accuracy",
    "calculate_accuracy": "accuracy",
    "load_eval_engine": "model_loading",
    "EvalReport": "runner",
    "evaluate": "runner",
}

__all__ = [  # the public surface (tests/test_public_surface.py); the rest by module path
    "benchmark_root", "calculate_accuracy", "evaluate", "extract_prediction", "first_sampling_params",
    "format_accuracy_table", "is_correct", "load_benchmark_dir", "load_eval_engine", "prompt_text",
    "retry_sampling_params",
]

if TYPE_CHECKING:  # pragma: no cover
    from cosmos_primitives.eval.accuracy import accuracy_table, calculate_accuracy, format_accuracy_table
    from cosmos_primitives.eval.benchmark import BenchmarkFormatError, BenchmarkItem, load_benchmark
    from cosmos_primitives.eval.benchmark_dir import benchmark_files, benchmark_root, load_benchmark_dir
    from cosmos_primitives.eval.model_loading import load_eval_engine
    from cosmos_primitives.eval.prompts import prompt_text
    from cosmos_primitives.eval.result_store import ResultStore, run_dir
    from cosmos_primitives.eval.runner import EvalReport, evaluate
    from cosmos_primitives.eval.sampling import first_sampling_params, retry_sampling_params
    from cosmos_primitives.eval.scoring import (
        extract_letter,
        extract_prediction,
        extract_reasoning,
        is_correct,
    )

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
