"""cp.eval: accuracy tables against hand-computed ones, skip-saved re-runs, interrupted runs, clear errors.

A scripted engine (implementing the RolloutEngine protocol) returns fixed completions per item, so
every number in the expected tables below is worked out by hand from the fixture. The comparison
with the guide's evaluation tool itself is in ``test_eval_reference_tool.py``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from cosmos_primitives import testing as cpt
from cosmos_primitives.config.evaluation import EvalConfig
from cosmos_primitives.data.media import MediaSettings
from cosmos_primitives.eval import (
    BenchmarkFormatError,
    benchmark_root,
    calculate_accuracy,
    evaluate,
    extract_letter,
    extract_prediction,
    extract_reasoning,
    load_benchmark,
    load_benchmark_dir,
    prompt_text,
)
from cosmos_primitives.eval.benchmark import parse_item
from cosmos_primitives.eval.prompts import system_prompt_for
from cosmos_primitives.logging.console import get_logger
from cosmos_primitives.rollout.base import RolloutEngine
from eval_scripted_engine import ScriptedEngine

GUIDE_MCQ_PROMPT = (
    "Which colour fills the image?\n(A) red\n(B) green\n(C) blue\n(D) yellow"
    "\nAnswer with the option's letter from the given choices directly."
    "\nPlease answer the question in the following format: "
    "<think> your reasoning </think> <answer> your single letter answer </answer>."
)
RUN = Path("ScriptedEngine")  # the run's folder under results: <model folder name>/<answer_type>


class WarningList(logging.Handler):
    """Keeps the messages of WARNING records (the cosmos logger does not propagate to pytest's caplog)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


COLOURS4 = ["red", "green", "blue", "yellow"]
ITEMS = [
    {"id": "av-1", "dataset": "av", "image": "av/red.png", "question": "Which colour fills the image?",
     "choices": COLOURS4, "answer": "A"},
    {"id": "av-2", "dataset": "av", "image": "av/blue.png", "question": "Which colour?",
     "choices": {"A": "red", "B": "blue"}, "answer": "B"},
    {"id": "av-3", "dataset": "av", "video": "clips/a.mp4", "question": "What happens?",
     "choices": ["stop", "go", "turn"], "answer": "(C)"},
    {"id": "rv-1", "dataset": "robovqa", "video": "clips/a.mp4", "question": "Next step?",
     "index2ans": {"A": "pick", "B": "place"}, "correct_answer": "B"},
    {"id": "rv-2", "dataset": "robovqa", "image": "rv/green.png", "question": "Colour?",
     "choices": COLOURS4, "answer": "A"},
    {"id": "rv-3", "dataset": "robovqa", "video": "clips/missing.mp4", "question": "Gone?",
     "choices": ["yes", "no"], "answer": "A"},
    {"id": "ho-1", "dataset": "holoassist", "image": "ho/yellow.png", "question": "What does the person do?",
     "answer": "Pick up the cup"},
    {"id": "ho-2", "dataset": "holoassist", "question": "Which hand?", "answer": "left"},
]
SCRIPT = {
    "av-1": "<think>It is red.</think>\n\n<answer>A</answer>",  # right
    "av-2": "<think>Looks red.</think>\n\n<answer>A</answer>",  # wrong
    "av-3": "<think>turning</think>\n\n<answer>(C) turn</answer>",  # right: the first capital in the tag
    "rv-1": "<answer>B. place</answer>",  # right
    "rv-2": "<think>maybe <answer>B</answer></think>\n\n<answer>A</answer>",  # wrong: the FIRST <answer> counts
    "rv-3": "<answer>A</answer>",  # never asked: its video is missing
    "ho-1": "<think>x</think>\n\n<answer>pick up  the CUP</answer>",  # right: open-ended, exact match
    "ho-2": "<answer>right</answer>",  # wrong
}
# by hand from the comments above; rv-3 is failed, not in the totals
EXPECTED = {
    "av": {"correct": 2, "total": 3, "accuracy": 2 / 3, "failed": 0},
    "holoassist": {"correct": 1, "total": 2, "accuracy": 1 / 2, "failed": 0},
    "robovqa": {"correct": 1, "total": 2, "accuracy": 1 / 2, "failed": 1},
    "overall": {"correct": 4, "total": 7, "accuracy": 4 / 7, "failed": 1},
}


@pytest.fixture
def bench(tmp_path: Path) -> tuple[Path, Path]:
    """(benchmark.jsonl, data dir) for ITEMS, with real PNGs and a real mp4."""
    data = tmp_path / "data"
    for path, colour in (("av/red.png", "red"), ("av/blue.png", "blue"), ("rv/green.png", "green"),
                         ("ho/yellow.png", "yellow")):
        cpt.write_image(data / path, cpt.color_image(colour))
    cpt.write_mp4(data / "clips/a.mp4", num_frames=8, fps=8.0, size=(56, 56))
    path = tmp_path / "bench.jsonl"
    path.write_text("".join(json.dumps(item) + "\n" for item in ITEMS))
    return path, data


def quiet_cfg(**changes) -> EvalConfig:
    """Small frames and no retries, so that each item is one call unless a test says otherwise."""
    return EvalConfig(**{"batch_size": 3, "min_pixels": 3136, "max_pixels": 3136, "max_retries": 0, **changes})


def saved(results: Path, dataset: str, clip: str, answer_type: str = "reasoning") -> list[dict]:
    return json.loads((results / RUN / answer_type / dataset / f"{clip}.json").read_text())


def test_accuracy_table_equals_hand_computed(bench, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path, data = bench
    engine = ScriptedEngine(SCRIPT)
    assert isinstance(engine, RolloutEngine)
    report = evaluate(engine, path, data_dir=data, results_dir=tmp_path / "results", cfg=quiet_cfg())

    assert report.table == EXPECTED
    assert (report.generated, report.skipped) == (7, 0)
    assert report.results_dir == tmp_path / "results" / RUN / "reasoning"
    assert sorted(engine.called_ids) == sorted(set(SCRIPT) - {"rv-3"})
    assert [len(c) for c in engine.calls] == [3, 2, 2]  # batch of 3, then one missing item left out of batch 2
    printed = capsys.readouterr().out
    assert "2 / 3" in printed and "66.67%" in printed and "4 / 7" in printed and "57.14%" in printed

    # the missing video names the item, its line and the path; the run went on
    [failure] = report.failures
    assert failure["id"] == "rv-3" and failure["line"] == 6 and failure["path"].endswith("clips/missing.mp4")
    assert "not found" in failure["reason"] and "rv-3" in printed and "missing.mp4" in printed

    # the engine got the media: one image, or one video sampled at 4 fps that the processor is told is
    # 2 fps, as the guide's tool tells it
    by_id = {p.prompt_id: p for p in engine.prompts}
    assert len(by_id["av-1"].images) == 1 and not by_id["av-1"].videos
    assert len(by_id["av-3"].videos) == 1 and by_id["av-3"].video_fps == [2.0]
    assert by_id["ho-2"].images == [] and by_id["ho-2"].videos == []
    assert engine.params[0].temperature == 0.6 and engine.params[0].max_response_length == 1024
    assert by_id["av-1"].conversation[0] == {"role": "system", "content": "Answer the questions."}
    assert by_id["av-1"].conversation[-1]["content"][-1]["text"] == GUIDE_MCQ_PROMPT

    [record] = saved(tmp_path / "results", "av", "av-1")
    assert record["prompt"] == [{"role": "system", "content": "Answer the questions."},
                                {"role": "user", "content": [{"type": "image", "image": "av/red.png"},
                                                             {"type": "text", "text": GUIDE_MCQ_PROMPT}]}]
    assert (record["full_response"], record["answer"], record["reasoning"], record["correct_answer"],
            record["is_correct"], record["datasource"], record["video_id"]) == (
        SCRIPT["av-1"], "A", "It is red.", "A", True, "av", "av-1")
    assert saved(tmp_path / "results", "robovqa", "rv-2")[0]["answer"] == "B"
    assert saved(tmp_path / "results", "av", "av-3")[0]["prompt"][1]["content"][0] == {
        "type": "video", "video": "clips/a.mp4", "fps": 4.0}

    assert calculate_accuracy(tmp_path / "results") == EXPECTED
    assert calculate_accuracy(tmp_path / "results", ["av"])["overall"] == EXPECTED["av"]


def test_rerun_skips_saved_items_and_recomputes_the_same_table(bench, tmp_path: Path) -> None:
    path, data = bench
    results = tmp_path / "results"
    first = evaluate(ScriptedEngine(SCRIPT), path, data_dir=data, results_dir=results, cfg=quiet_cfg())

    again = ScriptedEngine({})  # would raise KeyError if asked for anything
    warnings = WarningList()
    get_logger().addHandler(warnings)
    try:
        second = evaluate(again, path, data_dir=data, results_dir=results, cfg=quiet_cfg(temperature=0.0))
    finally:
        get_logger().removeHandler(warnings)
    assert again.calls == []
    [warning] = [m for m in warnings.messages if "saved prediction(s)" in m]
    assert warning.startswith("7 saved") and "'temperature': '0.6 saved, 0.0 now'" in warning
    assert (second.generated, second.skipped) == (0, 7)
    assert second.table == first.table == EXPECTED
    assert calculate_accuracy(results) == EXPECTED

    # once the missing clip exists, only that item is generated
    cpt.write_mp4(data / "clips/missing.mp4", num_frames=8, fps=8.0, size=(56, 56))
    third_engine = ScriptedEngine(SCRIPT)
    third = evaluate(third_engine, path, data_dir=data, results_dir=results, cfg=quiet_cfg())
    assert third_engine.called_ids == ["rv-3"] and third.failures == []
    assert third.table["robovqa"] == {"correct": 2, "total": 3, "accuracy": 2 / 3, "failed": 0}
    assert calculate_accuracy(results) == third.table

    everything = ScriptedEngine(SCRIPT)
    evaluate(everything, path, data_dir=data, results_dir=results, cfg=quiet_cfg(skip_saved=False))
    assert sorted(everything.called_ids) == sorted(SCRIPT)


def test_interrupted_run_keeps_saved_items(bench, tmp_path: Path) -> None:
    path, data = bench
    results = tmp_path / "results"
    crashing = ScriptedEngine(SCRIPT, fail_on_call=3)
    with pytest.raises(RuntimeError, match="simulated crash"):
        evaluate(crashing, path, data_dir=data, results_dir=results, cfg=quiet_cfg(batch_size=2))
    kept = sorted(p.stem for p in results.rglob("*.json"))
    assert kept == sorted(crashing.called_ids) == ["av-1", "av-2", "av-3", "rv-1"]
    assert not list(results.rglob("*.tmp"))

    resumed = ScriptedEngine(SCRIPT)
    report = evaluate(resumed, path, data_dir=data, results_dir=results, cfg=quiet_cfg(batch_size=2))
    assert sorted(resumed.called_ids) == ["ho-1", "ho-2", "rv-2"]
    assert report.skipped == 4 and report.table == EXPECTED


def test_letter_answer_type_prompt_and_extraction(bench, tmp_path: Path) -> None:
    path, data = bench
    script = {"av-1": "A", "av-2": "(B) blue", "av-3": "The answer is C.", "rv-1": "Answer: B", "rv-2": "a red one",
              "ho-1": " Pick up the cup\n", "ho-2": "Left hand"}
    engine = ScriptedEngine(script)
    cfg = quiet_cfg(answer_type="letter", datasets=["av", "robovqa", "holoassist"])
    report = evaluate(engine, path, data_dir=data, results_dir=tmp_path / "results", cfg=cfg)
    # the first capital letter of the completion: right av-1, av-2, ho-1 (open-ended: exact match);
    # wrong av-3 ("T" of "The"), rv-1 ("A" of "Answer"), rv-2 (no capital: empty), ho-2
    assert report.table["overall"] == {"correct": 3, "total": 7, "accuracy": 3 / 7, "failed": 1}
    assert report.table["av"] == {"correct": 2, "total": 3, "accuracy": 2 / 3, "failed": 0}
    assert report.table["robovqa"] == {"correct": 0, "total": 2, "accuracy": 0.0, "failed": 1}
    [record] = saved(tmp_path / "results", "av", "av-3", "letter")
    assert (record["answer"], record["is_correct"]) == ("T", False)
    assert record["prompt"][1]["content"][-1]["text"] == GUIDE_MCQ_PROMPT.split("\nPlease answer")[0].replace(
        "Which colour fills the image?", "What happens?").replace(
        "(A) red\n(B) green\n(C) blue\n(D) yellow", "(A) stop\n(B) go\n(C) turn")
    # the tool decodes letters greedily with 10 new tokens, whatever [eval] says
    assert (engine.params[0].temperature, engine.params[0].top_k, engine.params[0].max_response_length) == (0.0, 1, 10)


def test_empty_answers_are_retried_with_more_tokens_and_a_higher_temperature(bench, tmp_path: Path) -> None:
    path, data = bench
    engine = ScriptedEngine({"ho-2": ["<answer></answer>", "<answer> </answer>", "<answer>left</answer>"],
                             "av-2": ["<think>x</think>", "<answer>b</answer>", "<answer>B</answer>"],
                             "av-1": ["no tag"] * 4})
    items = [i for i in load_benchmark(path) if i.id in ("ho-2", "av-2", "av-1")]
    report = evaluate(engine, items, data_dir=data, results_dir=tmp_path / "results",
                      cfg=quiet_cfg(max_retries=3, seed=5))
    assert engine.calls == [["av-1", "av-2", "ho-2"]] * 3 + [["av-1"]]
    assert [(p.max_response_length, p.temperature, p.seed) for p in engine.params[:4]] == [
        (1024, 0.6, 5), (1280, 0.65, 5), (1536, 0.7, 5), (1792, 0.75, 5)]
    assert report.table["overall"]["correct"] == 2
    [av1] = saved(tmp_path / "results", "av", "av-1")
    [av2] = saved(tmp_path / "results", "av", "av-2")
    assert (av1["full_response"], av1["answer"], av1["attempts"]) == ("no tag", "", 4)  # the first completion kept
    assert (av2["full_response"], av2["answer"], av2["attempts"]) == ("<answer>B</answer>", "B", 3)
    assert saved(tmp_path / "results", "holoassist", "ho-2")[0]["attempts"] == 3


def test_extract_prediction_rules() -> None:
    mcq = parse_item({"question": "q", "choices": ["a", "b", "c", "d"], "answer": 2}, 1, "d")
    assert mcq.answer == "C" and mcq.letters == ["A", "B", "C", "D"]
    for text, reasoning, letter in [
            ("<answer>B</answer>", "B", "B"), ("<answer>(B)</answer>", "B", "B"),
            ("<answer>b. second</answer>", "", ""), ("B) second", "", "B"), ("The answer is C.", "", "T"),
            ("<think>t</think>\n\n<answer> B </answer><answer>C</answer>", "B", "B"),
            ("<answer>\nD\n</answer>", "D", "D"), ("no tags at all", "", ""), ("", "", "")]:
        assert extract_prediction(text, mcq) == reasoning, text
        assert extract_prediction(text, mcq, "letter") == letter == extract_letter(text), text
    assert extract_reasoning("<think> a\nb </think><answer>A</answer><think>c</think>") == "a\nb"
    assert extract_reasoning("<answer>A</answer>") == ""
    assert prompt_text(mcq) == "q\n(A) a\n(B) b\n(C) c\n(D) d" + GUIDE_MCQ_PROMPT[GUIDE_MCQ_PROMPT.index(
        "\nAnswer with"):]
    # the wording the RL recipe trains on, for a model that has seen no other; no system message
    assert prompt_text(mcq, "reasoning", "training") == "q\n(A) a\n(B) b\n(C) c\n(D) d" + (
        "\nAnswer with the option's letter from the given choices directly.\nPlease answer the question in the "
        "following format: <think> your reasoning </think> <answer> your answer </answer>.")
    assert prompt_text(mcq, "letter", "training") == prompt_text(mcq, "letter")
    assert (system_prompt_for("guide", None), system_prompt_for("training", None)) == ("Answer the questions.", "")
    assert system_prompt_for("training", "Be brief.") == "Be brief." and system_prompt_for("guide", "") == ""
    with pytest.raises(ValueError, match=r"\[eval\] prompt must be one of \('guide', 'training'\)"):
        prompt_text(mcq, "reasoning", "trained")
    open_ended = parse_item({"question": "Describe.", "answer": " Spin "}, 1, "d")
    assert open_ended.choices is None and open_ended.answer == "Spin"
    assert prompt_text(open_ended, "letter") == "Describe."
    assert prompt_text(open_ended, "reasoning") == (
        "Describe.\nPlease answer the question in the following format: <think> your reasoning </think> "
        "<answer> your answer </answer>.")
    assert extract_prediction("<answer> spin</answer>", open_ended) == "spin"


def test_malformed_items_name_line_and_key(tmp_path: Path) -> None:
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_text("\n".join([
        json.dumps({"id": "1", "question": "q", "choices": ["x", "y"], "answer": "A"}),
        json.dumps({"id": "2", "question": "q", "choices": ["x", "y"]}),
        "",
        json.dumps({"id": "4", "choices": ["x"], "answer": "A"}),
        json.dumps({"id": "5", "question": "q", "choices": ["x", "y"], "answer": "E"}),
        json.dumps({"id": "1", "question": "q", "choices": ["x", "y"], "answer": "B"}),
        json.dumps({"id": "7", "question": "q", "video": 3, "answer": "x"}),
        json.dumps({"video": "clips/1.mp4", "qa_pairs": [{"question": "q", "answer": "x"}]}),
    ]) + "\n")
    with pytest.raises(BenchmarkFormatError) as err:
        load_benchmark(jsonl)
    message = str(err.value)
    assert "6 malformed item(s)" in message
    assert "line 2: item is missing key 'answer'" in message
    assert "line 4: item is missing key 'question'" in message
    assert "line 5:" in message and "'E'" in message
    assert "line 6: id '1'" in message and "on line 1" in message
    assert "line 7: 'video' must be a path" in message
    # clip "1" of line 8 would share its results file and place with item "1" of line 1
    assert "line 8: item '1-0' would be saved as QA pair 0 of clip '1', as item '1' of line 1 is" in message

    pretty = tmp_path / "bad.json"
    pretty.write_text(json.dumps([{"question": "q", "answer": "x"}, {"question": "q"}], indent=2))
    with pytest.raises(BenchmarkFormatError, match=r"bad.json line 6: item is missing key 'answer'"):
        load_benchmark(pretty)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question": "q", "answer": "x"}\n{"question": \n')
    with pytest.raises(BenchmarkFormatError, match=r"broken.jsonl line 2: invalid JSON"):
        load_benchmark(broken)
    with pytest.raises(BenchmarkFormatError, match="does not exist"):
        load_benchmark(tmp_path / "nope.jsonl")


def test_json_list_benchmark_defaults_and_filters(tmp_path: Path) -> None:
    path = tmp_path / "mini_bench.json"
    path.write_text(json.dumps([{"question": "q1", "answer": "x"},
                                {"question": "q2", "answer": "y", "dataset": "av", "id": "k/1"}], indent=1))
    items = load_benchmark(path)
    assert [(i.id, i.dataset, i.line) for i in items] == [("line2", "mini_bench", 2), ("k/1", "av", 6)]
    assert [i.id for i in load_benchmark(path, datasets=["av"])] == ["k/1"]
    assert len(load_benchmark(path, limit=1)) == 1
    with pytest.raises(BenchmarkFormatError, match=r"no items of dataset\(s\) \['robovqa'\]"):
        load_benchmark(path, datasets=["robovqa"])
    # an id with a slash still gets its own file inside the dataset folder
    engine = ScriptedEngine({"line2": "<answer>x</answer>", "k/1": "<answer>z</answer>"})
    report = evaluate(engine, path, results_dir=tmp_path / "results", cfg=quiet_cfg(), print_table=False)
    assert report.table["overall"]["correct"] == 1
    assert [p.parent.name for p in (tmp_path / "results").rglob("*.json")].count("av") == 1
    assert calculate_accuracy(tmp_path / "results") == report.table


def test_cosmos_reason1_benchmark_file_with_qa_pairs(tmp_path: Path) -> None:
    """A downloaded ``<dataset>_benchmark_qa_pairs.json``: one row per clip, its QA pairs nested; one
    results file per clip, as the guide's tool writes it."""
    data = tmp_path / "robovqa"
    cpt.write_mp4(data / "clips/c1.mp4", num_frames=8, fps=8.0, size=(56, 56))
    cpt.write_mp4(data / "clips/c2.mp4", num_frames=8, fps=8.0, size=(56, 56))
    path = data / "robovqa_benchmark_qa_pairs.json"
    path.write_text(json.dumps([
        {"video": "clips/c1.mp4", "qa_pairs": {"question": "Done?", "index2ans": {"A": "yes", "B": "no"},
                                               "answer": "A"}},
        {"video": "clips/c2.mp4", "qa_pairs": [
            {"question": "Next?", "index2ans": {"A": "grasp", "B": "release"}, "answer": "B"},
            {"question": "Hand?", "index2ans": {"A": "left", "B": "right"}, "correct_answer": "A"}]},
    ], indent=1))
    items = load_benchmark(path)
    assert [(i.id, i.dataset, i.media, i.answer, i.clip, i.question_idx) for i in items] == [
        ("c1", "robovqa", [("video", "clips/c1.mp4")], "A", "c1", 0),
        ("c2-0", "robovqa", [("video", "clips/c2.mp4")], "B", "c2", 0),
        ("c2-1", "robovqa", [("video", "clips/c2.mp4")], "A", "c2", 1),
    ]
    engine = ScriptedEngine({"c1": "<answer>A</answer>", "c2-0": "<answer>A</answer>", "c2-1": "<answer>A</answer>"})
    results = tmp_path / "results"
    report = evaluate(engine, path, results_dir=results, cfg=quiet_cfg(batch_size=2), print_table=False)
    assert report.table["robovqa"] == {"correct": 2, "total": 3, "accuracy": 2 / 3, "failed": 0}
    # c2's pairs came in two batches; its file holds both, in QA-pair order
    assert [(e["id"], e["question_idx"], e["video_id"], e["is_correct"]) for e in saved(results, "robovqa", "c2")] == [
        ("c2-0", 0, "c2", False), ("c2-1", 1, "c2", True)]
    assert sorted(p.name for p in (results / RUN / "reasoning" / "robovqa").iterdir()) == ["c1.json", "c2.json"]


def test_results_written_by_the_tool_are_reused(tmp_path: Path) -> None:
    """A clip file the guide's tool wrote (its keys only, QA pairs by place) counts as saved."""
    data = tmp_path / "robovqa"
    cpt.write_mp4(data / "clips/c2.mp4", num_frames=8, fps=8.0, size=(56, 56))
    path = data / "robovqa_benchmark_qa_pairs.json"
    path.write_text(json.dumps([{"video": "clips/c2.mp4", "qa_pairs": [
        {"question": "Next?", "index2ans": {"A": "grasp", "B": "release"}, "answer": "B"},
        {"question": "Hand?", "index2ans": {"A": "left", "B": "right"}, "answer": "A"}]}]))
    tool_entry = {"datasource": "robovqa", "video_id": "c2", "prompt": [], "correct_answer": "B", "reasoning": "",
                  "answer": "B", "full_response": "<answer>B</answer>", "is_correct": True}
    clip_file = tmp_path / "results" / RUN / "reasoning" / "robovqa" / "c2.json"
    clip_file.parent.mkdir(parents=True)
    clip_file.write_text(json.dumps([tool_entry], indent=4))
    engine = ScriptedEngine({"c2-1": "<answer>B</answer>"})
    report = evaluate(engine, path, results_dir=tmp_path / "results", cfg=quiet_cfg(), print_table=False)
    assert engine.called_ids == ["c2-1"] and report.skipped == 1
    assert report.table["robovqa"] == {"correct": 1, "total": 2, "accuracy": 0.5, "failed": 0}
    entries = json.loads(clip_file.read_text())
    assert entries[0] == tool_entry and entries[1]["question_idx"] == 1


def test_guide_data_dir_layout_is_found_by_dataset(tmp_path: Path) -> None:
    """``--data_dir data`` as the Cosmos-Reason1 guide lays benchmarks out: data/benchmark/<dataset>/."""
    data = tmp_path / "data"
    cpt.write_reason1_benchmark(data, "robovqa", clips=2)
    cpt.write_reason1_benchmark(data, "av", clips=1)
    (data / "benchmark" / "notes").mkdir()  # a folder without a benchmark file is not a dataset
    items = load_benchmark_dir(data)
    assert [(i.dataset, i.id, i.media) for i in items] == [
        ("av", "clip0", [("video", "av/clips/clip0.mp4")]),
        ("robovqa", "clip0", [("video", "robovqa/clips/clip0.mp4")]),
        ("robovqa", "clip1-0", [("video", "robovqa/clips/clip1.mp4")]),
        ("robovqa", "clip1-1", [("video", "robovqa/clips/clip1.mp4")]),
    ]
    assert benchmark_root(data) == data / "benchmark"
    # the tool's --limit: per dataset, whole clips until at least N items
    assert [i.id for i in load_benchmark_dir(data / "benchmark", ["robovqa"], limit=1)] == ["clip0"]
    assert [i.id for i in load_benchmark_dir(data / "benchmark", ["robovqa"], limit=2)] == [
        "clip0", "clip1-0", "clip1-1"]
    assert [(i.dataset, i.id) for i in load_benchmark_dir(data, limit=1)] == [("av", "clip0"), ("robovqa", "clip0")]
    with pytest.raises(BenchmarkFormatError) as info:
        load_benchmark_dir(data, ["robovqa", "agibot"])
    assert f"dataset 'agibot': {data / 'benchmark' / 'agibot' / 'agibot_benchmark_qa_pairs.json'} does not exist" \
        in str(info.value) and "found under" in str(info.value) and "['av', 'robovqa']" in str(info.value)
    with pytest.raises(BenchmarkFormatError, match="no benchmark under"):
        load_benchmark_dir(tmp_path / "data" / "benchmark" / "notes")

    # the clips load from the root (no item fails), and each dataset gets its row of the table
    engine = ScriptedEngine({"clip0": "<answer>A</answer>", "clip1-0": "<answer>A</answer>",
                             "clip1-1": "<answer>A</answer>"})
    report = evaluate(engine, load_benchmark_dir(data, ["robovqa"]), data_dir=benchmark_root(data),
                      results_dir=tmp_path / "results", cfg=quiet_cfg(), print_table=False)
    assert report.table["robovqa"] == {"correct": 2, "total": 3, "accuracy": 2 / 3, "failed": 0}  # answers A, B, A
    assert [len(p.videos) for p in engine.prompts] == [1, 1, 1]


def test_clips_sort_by_file_name_as_the_tool_walks_them(tmp_path: Path) -> None:
    path = tmp_path / "benchmark" / "av" / "av_benchmark_qa_pairs.json"
    path.parent.mkdir(parents=True)
    rows = [{"video": f"clips/{name}.mp4", "qa_pairs": {"question": "q", "index2ans": {"A": "x"}, "answer": "A"}}
            for name in ("b", "c10", "a", "c2")]
    path.write_text(json.dumps(rows))
    assert [i.clip for i in load_benchmark_dir(tmp_path)] == ["a", "b", "c10", "c2"]


def test_bad_pixel_bounds_and_retries_are_refused(bench, tmp_path: Path) -> None:
    path, data = bench
    with pytest.raises(ValueError, match=r"\[eval\] min_pixels \(100352\) is more than max_pixels \(3136\)"):
        evaluate(ScriptedEngine({}), path, data_dir=data, results_dir=tmp_path,
                 cfg=EvalConfig(max_pixels=3136, min_pixels=100352))
    with pytest.raises(ValueError, match=r"\[eval\] max_retries must be >= 0"):
        evaluate(ScriptedEngine({}), path, data_dir=data, results_dir=tmp_path, cfg=quiet_cfg(max_retries=-1))


def test_default_media_bounds_size_images_and_videos_as_training_does(bench, tmp_path: Path) -> None:
    """Unset [eval] bounds are qwen-vl-utils' per kind, as a training dataset's unset keys: a 56 x 56 image
    keeps its size (a 128-token video floor applied to it gave 336 x 336, a prompt the quickstart's GRPO
    model never saw), and the clip's frames get the video floor, as the guide's tool leaves them."""
    path, data = bench
    engine = ScriptedEngine(SCRIPT)
    evaluate(engine, path, data_dir=data, results_dir=tmp_path, cfg=EvalConfig(max_retries=0, batch_size=8))
    by_id = {p.prompt_id: p for p in engine.prompts}
    trained = MediaSettings()
    image = np.asarray(by_id["av-1"].images[0])
    assert image.shape == trained.image(data / "av/red.png").shape == (56, 56, 3)
    video = np.asarray(by_id[next(i["id"] for i in ITEMS if "video" in i)].videos[0])
    assert video.shape[1] * video.shape[2] >= 128 * 28 * 28
