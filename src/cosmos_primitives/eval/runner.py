"""Run a model over a benchmark file, save one prediction per item, print the accuracy table.

Items are generated in batches of ``batch_size``; each batch's predictions are written (atomically,
one file per item) before the next batch starts, so an interrupted run keeps everything finished
before the interruption and a re-run with ``skip_saved`` generates only what is missing.

Sampling seed: batch ``b`` uses ``seed + (position of its first item among the items to generate)``,
and retry ``r`` of empty answers adds ``r * 1_000_003``. Greedy decoding (``temperature = 0``) does
not depend on it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from cosmos_primitives.config.evaluation import EvalConfig
from cosmos_primitives.data.bad_samples import BadSampleError
from cosmos_primitives.data.media import MediaSettings
from cosmos_primitives.data.records import Prompt, SamplingParams
from cosmos_primitives.eval.accuracy import accuracy_table, format_accuracy_table
from cosmos_primitives.eval.benchmark import BenchmarkItem, load_benchmark
from cosmos_primitives.eval.model_loading import load_eval_engine
from cosmos_primitives.eval.prompts import check_answer_type, load_item_prompt, prompt_text
from cosmos_primitives.eval.result_store import ResultStore
from cosmos_primitives.eval.scoring import extract_prediction, is_correct
from cosmos_primitives.logging.console import get_logger
from cosmos_primitives.logging.progress import progress
from cosmos_primitives.rollout.base import RolloutEngine

RETRY_SEED_STRIDE = 1_000_003
# settings that change what a prediction is; saved with it and compared on re-runs
SETTING_KEYS = ("answer_type", "system_prompt", "temperature", "top_p", "top_k", "repetition_penalty",
                "max_tokens", "seed", "fps", "max_pixels", "max_frames")


@attrs.define
class EvalReport:
    """What :func:`evaluate` did.

    ``table``: the accuracy table of the benchmark's items (see :func:`accuracy_table`);
    ``generated``: items generated in this run; ``skipped``: items whose saved prediction was reused;
    ``failures``: items that could not be evaluated (``id``, ``dataset``, ``line``, ``path``,
    ``reason``); ``results_dir``: where the predictions are.
    """

    table: dict[str, dict[str, Any]]
    generated: int
    skipped: int
    failures: list[dict[str, Any]]
    results_dir: Path

    def format(self) -> str:
        """The table, then the failed items (one line each)."""
        text = format_accuracy_table(self.table)
        if self.failures:
            listed = "\n".join(f"  {f['dataset']}/{f['id']} (line {f['line']}): {f['path']}: {f['reason']}"
                               for f in self.failures)
            text += f"\n{len(self.failures)} item(s) could not be evaluated:\n{listed}"
        return text


def sampling_params(cfg: EvalConfig, seed: int) -> SamplingParams:
    """One completion per prompt with the ``[eval]`` generation settings."""
    return SamplingParams(n=1, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                          repetition_penalty=cfg.repetition_penalty, max_new_tokens=cfg.max_tokens, seed=seed)


def _settings(cfg: EvalConfig) -> dict[str, Any]:
    return {key: getattr(cfg, key) for key in SETTING_KEYS}


def _record(item: BenchmarkItem, cfg: EvalConfig, prompt_tokens: int, completion: Any, attempts: int,
            model_name: str) -> dict[str, Any]:
    prediction = extract_prediction(completion.text, item, cfg.answer_type)
    return {
        "id": item.id,
        "dataset": item.dataset,
        "line": item.line,
        "media": [path for _, path in item.media],
        "question": item.question,
        "choices": dict(item.choices) if item.choices is not None else None,
        "prompt": prompt_text(item, cfg.answer_type),
        "raw_output": completion.text,
        "extracted_answer": prediction,
        "ground_truth": item.answer,
        "correct": is_correct(prediction, item),
        "finish_reason": completion.finish_reason,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": len(completion.token_ids),
        "attempts": attempts,
        "model": model_name,
        "settings": _settings(cfg),
    }


def _generate_batch(engine: RolloutEngine, items: list[BenchmarkItem], prompts: list[Prompt], cfg: EvalConfig,
                    seed: int, model_name: str) -> list[dict[str, Any]]:
    groups = engine.generate(prompts, sampling_params(cfg, seed))
    if len(groups) != len(prompts):
        raise RuntimeError(f"the rollout engine returned {len(groups)} groups for {len(prompts)} prompts")
    records = [_record(item, cfg, len(g.prompt_token_ids), g.completions[0], 1, model_name)
               for item, g in zip(items, groups)]
    for attempt in range(1, cfg.max_retries + 1 if cfg.temperature > 0 else 1):
        empty = [i for i, r in enumerate(records) if not r["extracted_answer"]]
        if not empty:
            break
        retry = engine.generate([prompts[i] for i in empty], sampling_params(cfg, seed + attempt * RETRY_SEED_STRIDE))
        for i, g in zip(empty, retry):
            records[i] = _record(items[i], cfg, len(g.prompt_token_ids), g.completions[0], attempt + 1,
                                 model_name)
    return records


def evaluate(model: Any, benchmark: str | Path | Sequence[BenchmarkItem], *, results_dir: str | Path,
             data_dir: str | Path | None = None, cfg: EvalConfig | None = None, processor: Any = None,
             print_table: bool = True) -> EvalReport:
    """Evaluate ``model`` on a benchmark and return (and print) the accuracy table.

    Args:
        model: a rollout engine, an in-memory HF model (with ``processor``), or a model folder path /
            hub id (loaded per ``cfg.backend`` / ``cfg.dtype``; see :func:`load_eval_engine`).
        benchmark: a ``.json`` / ``.jsonl`` benchmark file, or items from :func:`load_benchmark`.
        results_dir: predictions go to ``<results_dir>/<dataset>/<id>.json``.
        data_dir: media paths are relative to it (default: ``cfg.data_dir``, else the benchmark
            file's folder).
        cfg: the ``[eval]`` settings (default: ``EvalConfig()``; its ``model`` / ``benchmark`` /
            ``results_dir`` fields are not read here).
        print_table: also print the table (and failed items) to stdout.

    An item whose media is missing or undecodable is logged with its id and path, listed in
    ``EvalReport.failures`` and in ``<results_dir>/<dataset>/failed.jsonl``, and left out of the
    table's totals; the run goes on. With ``cfg.skip_saved`` items that already have a saved
    prediction are not generated again (a warning counts saved predictions made with other
    settings).
    """
    cfg = cfg or EvalConfig()
    check_answer_type(cfg.answer_type)
    if cfg.batch_size < 1:
        raise ValueError(f"[eval] batch_size must be >= 1, got {cfg.batch_size}")
    log = get_logger()
    if isinstance(benchmark, (str, Path)):
        items = load_benchmark(benchmark, datasets=cfg.datasets, limit=cfg.limit)
        default_data_dir: Path | None = Path(benchmark).parent
    else:
        items = list(benchmark)
        default_data_dir = None
    data_dir = data_dir or cfg.data_dir or default_data_dir
    store = ResultStore(results_dir)
    settings = MediaSettings(fps=cfg.fps, max_pixels=cfg.max_pixels, min_pixels=cfg.min_pixels,
                             max_frames=cfg.max_frames)

    saved: dict[tuple[str, str], dict[str, Any]] = {}
    if cfg.skip_saved:
        for item in items:
            record = store.load(item.dataset, item.id)
            if record is not None:
                saved[(item.dataset, item.id)] = record
    todo = [item for item in items if (item.dataset, item.id) not in saved]
    current = _settings(cfg)
    other = [r.get("settings") or {} for r in saved.values() if r.get("settings") != current]
    if other:
        differ = {k: f"{other[0].get(k)!r} saved, {v!r} now" for k, v in current.items() if other[0].get(k) != v}
        log.warning(f"{len(other)} saved prediction(s) in {store.root} were made with other [eval] settings "
                    f"(e.g. {differ}); they are reused as they are (set skip_saved = false, or use a new "
                    f"results dir, to evaluate them again)")
    log.info(f"evaluating {len(todo)} of {len(items)} items ({len(saved)} already saved in {store.root})")

    engine = load_eval_engine(model, processor, backend=cfg.backend, dtype=cfg.dtype, tp_size=cfg.tp_size,
                              max_model_len=cfg.max_model_len, seed=cfg.seed) if todo else None
    model_name = str(model) if isinstance(model, (str, Path)) else type(model).__name__
    failures: list[dict[str, Any]] = []
    fresh: list[dict[str, Any]] = []
    start = time.perf_counter()
    batches = range(0, len(todo), cfg.batch_size)
    for first in progress(batches, total=len(batches), desc="eval"):
        batch_items, prompts = [], []
        for item in todo[first:first + cfg.batch_size]:
            try:
                prompts.append(load_item_prompt(item, cfg.answer_type, data_dir, settings, cfg.system_prompt))
                batch_items.append(item)
            except BadSampleError as exc:
                log.warning(f"item {item.id!r} of {item.dataset!r} (line {item.line}) is not evaluated: "
                            f"{exc.path}: {exc.reason}")
                failures.append({"id": item.id, "dataset": item.dataset, "line": item.line, "path": exc.path,
                                 "reason": exc.reason})
        if not prompts:
            continue
        assert engine is not None
        for record in _generate_batch(engine, batch_items, prompts, cfg, cfg.seed + first, model_name):
            store.save(record)
            fresh.append(record)
    if todo:
        log.info(f"generated {len(fresh)} predictions in {time.perf_counter() - start:.1f} s")

    for dataset in sorted({item.dataset for item in items}):
        store.write_failures(dataset, [f for f in failures if f["dataset"] == dataset])
    records = [*saved.values(), *fresh]
    report = EvalReport(table=accuracy_table(records, failures), generated=len(fresh), skipped=len(saved),
                        failures=failures, results_dir=store.root)
    if print_table:
        print(report.format())
    else:
        log.info("accuracy:\n%s", report.format())
    return report
