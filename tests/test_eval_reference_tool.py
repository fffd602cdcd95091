"""cp.eval against the Cosmos-Reason1 guide's evaluation tool itself.

Reference data: the tool's own ``output.py`` (answer extraction) and ``calculate_accuracy.py``
(scoring of a results folder), vendored unmodified under ``tests/data/cosmos_reason1_eval_tool/``
and run here; and ``tests/data/cosmos_reason1_eval_reference.json``, written by
``scripts/fixtures_cosmos_reason1_eval.py`` from the tool's ``evaluate.py`` / ``input.py`` and
qwen-vl-utils (the prompts it sends, the frames it sends, its generate calls and kept results).
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cosmos_primitives import testing as cpt
from cosmos_primitives.config.evaluation import EvalConfig
from cosmos_primitives.data.media import MediaSettings
from cosmos_primitives.data.prompt_inputs import encode_prompts
from cosmos_primitives.eval import (
    calculate_accuracy,
    evaluate,
    extract_prediction,
    extract_reasoning,
    is_correct,
    load_benchmark_dir,
)
from cosmos_primitives.eval.benchmark import parse_item
from cosmos_primitives.eval.prompts import item_conversation, load_item_prompt, system_prompt_for
from eval_scripted_engine import ScriptedEngine

DATA = Path(__file__).parent / "data"
TOOL = DATA / "cosmos_reason1_eval_tool"
REFERENCE = json.loads((DATA / "cosmos_reason1_eval_reference.json").read_text())
CHOICES = {letter: f"choice {letter}" for letter in "ABCDE"}


@pytest.fixture(scope="module")
def tool_output():
    """The tool's ``tools/eval/utils/output.py``, imported from the vendored copy."""
    spec = importlib.util.spec_from_loader("cosmos_reason1_tool_output", loader=None)
    module = importlib.util.module_from_spec(spec)
    exec(compile((TOOL / "output.py.txt").read_text(), str(TOOL / "output.py.txt"), "exec"), module.__dict__)
    return module


def mcq_item(answer: str, question_idx: int = 0, item_id: str = "q"):
    return parse_item({"id": item_id, "question": "What happens?", "index2ans": CHOICES, "answer": answer}, 1,
                      "robovqa", question_idx=question_idx)


def test_fixture_is_the_vendored_tools_output(tool_output) -> None:
    """The fixture's scoring is what the vendored parser gives today (neither drifted)."""
    for row in REFERENCE["scoring"]:
        assert tool_output.parse_reasoning_response(row["text"]) == (row["reasoning"]["answer"],
                                                                     row["reasoning"]["reasoning"])
        assert tool_output.parse_letter_response(row["text"]) == (row["letter"]["answer"], "")
    assert len(REFERENCE["scoring"]) == 50


@pytest.mark.parametrize("answer_type", ["reasoning", "letter"])
def test_scoring_equals_the_tool_on_every_fixture_output(answer_type: str) -> None:
    mismatches = []
    for row in REFERENCE["scoring"]:
        item = mcq_item(row["correct_answer"])
        answer = extract_prediction(row["text"], item, answer_type)
        ours = {"answer": answer, "is_correct": is_correct(answer, item),
                "reasoning": extract_reasoning(row["text"]) if answer_type == "reasoning" else ""}
        if ours != row[answer_type]:
            mismatches.append((row["kind"], ours, row[answer_type]))
    assert mismatches == []  # 50 of 50


def test_the_issues_examples_score_as_the_tool_scores_them() -> None:
    by_kind = {row["kind"]: row for row in REFERENCE["scoring"]}
    for kind in ("letter in parentheses", "bare letter with the choice text", "Answer: letter"):
        row = by_kind[kind]
        mode = "reasoning" if "<answer>" in row["text"] else "letter"
        assert row[mode]["is_correct"], kind
        item = mcq_item(row["correct_answer"])
        assert is_correct(extract_prediction(row["text"], item, mode), item), kind


def test_prompts_equal_the_tools_messages() -> None:
    cfg = EvalConfig()
    for k, case in enumerate(REFERENCE["prompts"]):
        item = parse_item({**case["qa"], "video": f"robovqa/clips/clip{k % 3}.mp4"}, 1, "robovqa")
        system = system_prompt_for(cfg.prompt, cfg.system_prompt)
        assert item_conversation(item, case["answer_type"], system, fps=cfg.fps) == case["messages"]
        assert item.answer == case["correct_answer"]


def test_video_frames_are_sized_as_qwen_vl_utils_sizes_them(tmp_path: Path) -> None:
    """The frames of the tool's video part, at the [eval] defaults, have the shape qwen-vl-utils
    gives it: clips of 1-60 s, 5-60 fps, odd sizes."""
    cfg = EvalConfig()
    settings = MediaSettings(fps=cfg.fps, max_pixels=cfg.max_pixels, min_pixels=cfg.min_pixels,
                             max_frames=cfg.max_frames)
    mismatches = []
    for k, clip in enumerate(REFERENCE["videos"]):
        cpt.write_mp4(tmp_path / f"clip{k}.mp4", num_frames=clip["num_frames"], fps=clip["fps"],
                      size=tuple(clip["size"]))
        item = parse_item({"id": f"c{k}", "question": "q", "index2ans": CHOICES, "answer": "A",
                           "video": f"clip{k}.mp4"}, 1, "av")
        prompt = load_item_prompt(item, "reasoning", tmp_path, settings, processor_fps=cfg.processor_fps)
        t, h, w, _ = prompt.videos[0].shape
        expected = clip["shape"]
        if [t, 3, h, w] != expected:
            mismatches.append((clip["num_frames"], clip["fps"], clip["size"], [t, 3, h, w], expected))
    assert mismatches == []


def test_the_processor_is_told_2_fps_as_the_tools_vllm_is(tiny_vl_processor, tmp_path: Path) -> None:
    """The tool hands vLLM frames sampled at 4 fps without their rate, so the Qwen2.5-VL processor
    assumes 2 fps: one temporal patch (2 frames) spans 1 s of mRoPE time. ``processor_fps = 0``
    tells the sampled rate instead (0.5 s)."""
    cpt.write_mp4(tmp_path / "clip.mp4", num_frames=16, fps=8.0, size=(56, 56))
    item = parse_item({"question": "q", "index2ans": CHOICES, "answer": "A", "video": "clip.mp4"}, 1, "av")
    settings = MediaSettings(fps=4.0, max_pixels=3136, min_pixels=3136, max_frames=768)
    told = {}
    for processor_fps in (EvalConfig().processor_fps, 0.0):
        prompt = load_item_prompt(item, "reasoning", tmp_path, settings, processor_fps=processor_fps)
        assert len(prompt.videos[0]) == 8  # 2 s sampled at 4 fps
        told[processor_fps] = encode_prompts(tiny_vl_processor, [prompt])["second_per_grid_ts"].tolist()
    assert told == {2.0: [1.0], 0.0: [0.5]}


@pytest.mark.parametrize("scenario", REFERENCE["retries"], ids=[s["name"] for s in REFERENCE["retries"]])
def test_retry_policy_equals_the_tools_run_model(scenario: dict, tmp_path: Path) -> None:
    # the scenarios spell the tool's max_tokens: [eval] max_response_length here
    ours = {"max_response_length" if key == "max_tokens" else key: value for key, value in scenario["config"].items()}
    cfg = EvalConfig(**ours, batch_size=64, max_pixels=3136, min_pixels=3136)
    items = [mcq_item(letter, item_id=qid) for qid, letter in scenario["items"]]
    engine = ScriptedEngine(scenario["script"])
    report = evaluate(engine, items, results_dir=tmp_path, cfg=cfg, print_table=False)

    calls = [{"ids": ids, "temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k,
              "repetition_penalty": p.repetition_penalty, "max_tokens": p.max_response_length, "seed": p.seed}
             for ids, p in zip(engine.calls, engine.params)]
    assert calls == scenario["calls"]
    by_id = {r["id"]: r for r in report.records}
    kept = [{key: by_id[qid][key] for key in ("answer", "reasoning", "full_response", "is_correct")}
            for qid, _ in scenario["items"]]
    assert kept == scenario["results"]


def run_calculate_accuracy(result_dir: Path) -> tuple[int, int, str]:
    """The tool's ``calculate_accuracy.py --result_dir``: (samples, correct, mean accuracy line)."""
    proc = subprocess.run([sys.executable, str(TOOL / "calculate_accuracy.py.txt"), "--result_dir", str(result_dir)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    total = int(re.search(r"Total samples processed across all files: (\d+)", proc.stdout).group(1))
    correct = int(re.search(r"Total samples counted as correct: (\d+)", proc.stdout).group(1))
    mean = re.search(r"Mean accuracy: .*", proc.stdout).group(0)
    return total, correct, mean


def test_the_tools_calculate_accuracy_reads_our_results_folder(tmp_path: Path) -> None:
    """The guide's layout evaluated by cp.eval; the tool's scorer finds every prediction and prints
    our accuracy, for the whole folder and for one dataset's folder."""
    data = tmp_path / "data"
    cpt.write_reason1_benchmark(data, "robovqa", clips=3)
    cpt.write_reason1_benchmark(data, "av", clips=2)
    items = load_benchmark_dir(data)
    script = {"clip0": "<answer>(A)</answer>", "clip1-0": "<think>t</think><answer>B. nothing</answer>",
              "clip1-1": "<answer>B</answer>", "clip2-0": "<answer>a</answer>", "clip2-1": "Answer: A"}
    results = tmp_path / "results"
    cfg = EvalConfig(max_retries=0, max_pixels=3136, min_pixels=3136)
    report = evaluate(ScriptedEngine(script), items, data_dir=data / "benchmark", results_dir=results, cfg=cfg,
                      print_table=False)
    overall = report.table["overall"]
    assert (overall["total"], overall["failed"]) == (8, 0)

    total, correct, mean = run_calculate_accuracy(results)
    assert (total, correct) == (overall["total"], overall["correct"])
    assert mean == f"Mean accuracy: {overall['accuracy']:.4f} ({overall['accuracy'] * 100:.2f}%)"
    assert calculate_accuracy(results) == report.table

    robovqa = report.results_dir / "robovqa"
    assert run_calculate_accuracy(robovqa)[:2] == (report.table["robovqa"]["total"], report.table["robovqa"]["correct"])
