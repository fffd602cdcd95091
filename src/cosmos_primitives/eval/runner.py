"""Run a model over a benchmark, save the predictions in the guide's tool's layout, print the accuracy.

Items are generated in batches of ``batch_size``: each batch is generated once, its items with
empty answers sampled again under the tool's retry policy (``cp.eval.sampling``), and its
predictions written (one file per clip, atomically) before the next batch starts, so an interrupted
run keeps everything finished before the interruption and a re-run with ``skip_saved`` generates
only what is missing. The tool generates all items in one call; batching changes nothing but
memory, as every call has the same settings and seed.
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
from cosmos_primitives.data.records import Completion, Prompt
from cosmos_primitives.eval.accuracy import accuracy_table, format_accuracy_table
from cosmos_primitives.eval.benchmark import BenchmarkItem, load_benchmark
from cosmos_primitives.eval.model_loading import load_eval_engine
from cosmos_primitives.eval.prompts import check_answer_type, item_conversation, load_item_prompt, system_prompt_for
from cosmos_primitives.eval.result_store import ResultStore, run_dir
from cosmos_primitives.eval.sampling import first_sampling_params, retry_sampling_params
from cosmos_primitives.eval.scoring import extract_prediction, extract_reasoning, is_correct
from cosmos_primitives.logging.console import get_logger
from cosmos_primitives.logging.progress_bar import progress
from cosmos_primitives.rollout.base import RolloutEngine

# settings that change what a prediction is; saved with it and compared on re-runs
SETTING_KEYS = ("answer_type", "prompt", "system_prompt", "temperature", "top_p", "top_k", "repetition_penalty",
                "max_response_length", "seed", "max_retries", "fps", "max_pixels", "min_pixels", "max_frames",
                "processor_fps")


@attrs.define
class EvalReport:
    """What :func:`evaluate` did.

    ``table``: the accuracy table of the benchmark's items (see :func:`accuracy_table`);
    ``records``: their predictions (saved and new); ``generated``: items generated in this run;
    ``skipped``: items whose saved prediction was reused; ``failures``: items that could not be
    evaluated (``id``, ``dataset``, ``line``, ``path``, ``reason``); ``results_dir``: the run's
    folder (``<results_dir>/<model>/<answer_type>``).
    """

    table: dict[str, dict[str, Any]]
    records: list[dict[str, Any]]
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


# results folders written before [eval] max_tokens became max_response_length hold the old name; saving
# under it keeps their predictions comparable (not reported as made with other settings)
SAVED_AS = {"max_response_length": "max_tokens"}


def _settings(cfg: EvalConfig) -> dict[str, Any]:
    return {SAVED_AS.get(key, key): getattr(cfg, key) for key in SETTING_KEYS}


def _record(item: BenchmarkItem, cfg: EvalConfig, prompt_tokens: int, completion: Completion, attempts: int,
            model_name: str) -> dict[str, Any]:
    """One prediction: the tool's keys first, then this library's."""
    answer = extract_prediction(completion.text, item, cfg.answer_type)
    return {
        "datasource": item.dataset,
        "video_id": item.clip,
        "prompt": item_conversation(item, cfg.answer_type, system_prompt_for(cfg.prompt, cfg.system_prompt),
                                    fps=cfg.fps, style=cfg.prompt),
        "correct_answer": item.answer,
        "reasoning": extract_reasoning(completion.text) if cfg.answer_type == "reasoning" else "",
        "answer": answer,
        "full_response": completion.text,
        "is_correct": is_correct(answer, item),
        "id": item.id,
        "question_idx": item.question_idx,
        "line": item.line,
        "question": item.question,
        "choices": dict(item.choices) if item.choices is not None else None,
        "media": [path for _, path in item.media],
        "finish_reason": completion.finish_reason,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": len(completion.token_ids),
        "attempts": attempts,
        "model": model_name,
        "settings": _settings(cfg),
    }


def _generate_batch(engine: RolloutEngine, items: list[BenchmarkItem], prompts: list[Prompt], cfg: EvalConfig,
                    model_name: str) -> list[dict[str, Any]]:
    """Generate a batch, then retry its empty answers (the tool's ``run_model``)."""
    groups = engine.generate(prompts, first_sampling_params(cfg))
    if len(groups) != len(prompts):
        raise RuntimeError(f"the rollout engine returned {len(groups)} groups for {len(prompts)} prompts")
    records = [_record(item, cfg, len(g.prompt_token_ids), g.completions[0], 1, model_name)
               for item, g in zip(items, groups)]
    empty = [i for i, record in enumerate(records) if not record["answer"]]
    for retry in range(1, cfg.max_retries + 1):
        if not empty:
            break
        again = engine.generate([prompts[i] for i in empty], retry_sampling_params(cfg, retry))
        still_empty = []
        for i, group in zip(empty, again):
            candidate = _record(items[i], cfg, len(group.prompt_token_ids), group.completions[0], retry + 1,
                                model_name)
            if candidate["answer"]:
                records[i] = candidate
            else:
                records[i]["attempts"] = retry + 1
                still_empty.append(i)
        empty = still_empty
    if empty:
        get_logger().warning(f"{len(empty)} item(s) still have no answer after {cfg.max_retries} retries: "
                             + ", ".join(f"{items[i].dataset}/{items[i].id}" for i in empty))
    return records


def evaluate(model: Any, benchmark: str | Path | Sequence[BenchmarkItem], *, results_dir: str | Path,
             data_dir: str | Path | None = None, cfg: EvalConfig | None = None, processor: Any = None,
             print_table: bool = True) -> EvalReport:
    """Evaluate ``model`` on a benchmark and return (and print) the accuracy table.

    Args:
        model: a rollout engine, an in-memory HF model (with ``processor``), or a model folder path /
            hub id (loaded per ``cfg.backend`` / ``cfg.dtype``; see :func:`load_eval_engine`).
        benchmark: a ``.json`` / ``.jsonl`` benchmark file, or items from :func:`load_benchmark`.
        results_dir: predictions go to ``<results_dir>/<model folder name>/<answer_type>/<dataset>/
            <clip>.json`` (the guide's tool's layout; ``calculate_accuracy.py --result_dir
            results_dir`` reads them).
        data_dir: media paths are relative to it (default: ``cfg.data_dir``, else the benchmark
            file's folder).
        cfg: the ``[eval]`` settings (default: ``EvalConfig()``; its ``model`` / ``benchmark`` /
            ``results_dir`` fields are not read here).
        print_table: also print the table (and failed items) to stdout.

    An item whose media is missing or undecodable is logged with its id and path, listed in
    ``EvalReport.failures`` and in ``failed.jsonl`` beside its dataset's predictions, and left out
    of the table's totals; the run goes on. With ``cfg.skip_saved`` items that already have a saved
    prediction are not generated again (a warning counts saved predictions made with other
    settings).
    """
    cfg = cfg or EvalConfig()
    check_answer_type(cfg.answer_type)
    system_prompt = system_prompt_for(cfg.prompt, cfg.system_prompt)
    if cfg.batch_size < 1:
        raise ValueError(f"[eval] batch_size must be >= 1, got {cfg.batch_size}")
    if cfg.max_retries < 0:
        raise ValueError(f"[eval] max_retries must be >= 0, got {cfg.max_retries}")
    if cfg.min_pixels is not None and cfg.max_pixels is not None and cfg.min_pixels > cfg.max_pixels:
        raise ValueError(f"[eval] min_pixels ({cfg.min_pixels}) is more than max_pixels ({cfg.max_pixels}); "
                         "lower min_pixels, or leave both unset for qwen-vl-utils' bounds")
    log = get_logger()
    if isinstance(benchmark, (str, Path)):
        items = load_benchmark(benchmark, datasets=cfg.datasets, limit=cfg.limit if cfg.limit > 0 else -1)
        default_data_dir: Path | None = Path(benchmark).parent
    else:
        items = list(benchmark)
        default_data_dir = None
    data_dir = data_dir or cfg.data_dir or default_data_dir
    model_name = str(model) if isinstance(model, (str, Path)) else type(model).__name__
    store = ResultStore(run_dir(results_dir, model_name, cfg.answer_type))
    settings = MediaSettings(fps=cfg.fps, max_pixels=cfg.max_pixels, min_pixels=cfg.min_pixels,
                             max_frames=cfg.max_frames)

    saved: dict[tuple[str, str], dict[str, Any]] = {}
    if cfg.skip_saved:
        for item in items:
            record = store.load(item.dataset, item.clip, item.question_idx, item.id)
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
    failures: list[dict[str, Any]] = []
    fresh: list[dict[str, Any]] = []
    start = time.perf_counter()
    batches = range(0, len(todo), cfg.batch_size)
    for first in progress(batches, total=len(batches), desc="eval"):
        batch_items, prompts = [], []
        for item in todo[first:first + cfg.batch_size]:
            try:
                prompts.append(load_item_prompt(item, cfg.answer_type, data_dir, settings, system_prompt,
                                                cfg.processor_fps, cfg.prompt))
                batch_items.append(item)
            except BadSampleError as exc:
                log.warning(f"item {item.id!r} of {item.dataset!r} (line {item.line}) is not evaluated: "
                            f"{exc.path}: {exc.reason}")
                failures.append({"id": item.id, "dataset": item.dataset, "line": item.line, "path": exc.path,
                                 "reason": exc.reason})
        if not prompts:
            continue
        assert engine is not None
        records = _generate_batch(engine, batch_items, prompts, cfg, model_name)
        store.save(records)
        fresh.extend(records)
    if todo:
        log.info(f"generated {len(fresh)} predictions in {time.perf_counter() - start:.1f} s")

    for dataset in sorted({item.dataset for item in items}):
        store.write_failures(dataset, [f for f in failures if f["dataset"] == dataset])
    records = [*saved.values(), *fresh]
    report = EvalReport(table=accuracy_table(records, failures), records=records, generated=len(fresh),
                        skipped=len(saved), failures=failures, results_dir=store.root)
    if print_table:
        print(report.format())
    else:
        log.info("accuracy:\n%s", report.format())
    return report
