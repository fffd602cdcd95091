"""cp.eval end to end: an exported tiny Qwen2.5-VL checkpoint through HFRolloutEngine on image and
video items, the examples/evaluate.py script, and the vLLM backend against the stand-in."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

import cosmos_primitives as cp
from cosmos_primitives import testing as cpt
from cosmos_primitives.checkpoint.safetensors_export import export_safetensors
from cosmos_primitives.config.evaluation import EvalConfig
from cosmos_primitives.eval import (
    accuracy_table,
    calculate_accuracy,
    evaluate,
    extract_prediction,
    is_correct,
    load_benchmark,
    load_eval_engine,
)
from cosmos_primitives.rollout.hf_engine import HFRolloutEngine
from cosmos_primitives.testing.colour_mcq import write_colour_mcq
from cosmos_primitives.testing.tokenizer import IMAGE_PAD_ID, VIDEO_PAD_ID

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, tiny_vl_processor) -> Path:
    """A tiny Qwen2.5-VL exported the way training exports it: <run>/safetensors/final."""
    out = tmp_path_factory.mktemp("run") / "safetensors" / "final"
    return export_safetensors(cpt.tiny_qwen2_5_vl(seed=0), out, processor=tiny_vl_processor)


@pytest.fixture(scope="module")
def colour_bench(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two colour-MCQ image items (dataset colour_mcq) and one video item (dataset clips)."""
    data = tmp_path_factory.mktemp("data")
    path = write_colour_mcq(data, 2, seed=0, split="test")
    cpt.write_mp4(data / "clips/a.mp4", num_frames=8, fps=8.0, size=(56, 56))
    video = {"id": "v0", "dataset": "clips", "video": "clips/a.mp4", "question": "What changes?",
             "choices": ["brightness", "colour"], "answer": "A"}
    path.write_text(path.read_text() + json.dumps(video) + "\n")
    return path, data


class RecordingEngine:
    """Passes calls to a real engine and keeps the groups it returned."""

    def __init__(self, engine: HFRolloutEngine) -> None:
        self.engine = engine
        self.groups: list = []
        self.weight_version = engine.weight_version

    def generate(self, prompts, params):
        groups = self.engine.generate(prompts, params)
        self.groups.extend(groups)
        return groups

    def update_weights(self, named_tensors, version):
        self.engine.update_weights(named_tensors, version)


def test_exported_checkpoint_on_images_and_video(exported: Path, colour_bench, tmp_path: Path) -> None:
    path, data = colour_bench
    engine = load_eval_engine(exported)
    assert isinstance(engine, HFRolloutEngine)
    recording = RecordingEngine(engine)
    cfg = EvalConfig(temperature=0.0, max_response_length=4, fps=4.0, max_pixels=3136, min_pixels=3136, batch_size=3,
                     max_retries=0)
    report = evaluate(recording, path, data_dir=data, results_dir=tmp_path / "results", cfg=cfg)

    by_id = {g.prompt.prompt_id: g for g in recording.groups}
    assert sorted(by_id) == ["test-0", "test-1", "v0"]
    for item_id in ("test-0", "test-1"):
        assert IMAGE_PAD_ID in by_id[item_id].prompt_token_ids and VIDEO_PAD_ID not in by_id[item_id].prompt_token_ids
    assert VIDEO_PAD_ID in by_id["v0"].prompt_token_ids and IMAGE_PAD_ID not in by_id["v0"].prompt_token_ids

    items = {i.id: i for i in load_benchmark(path)}
    files = sorted((tmp_path / "results").rglob("*.json"))
    assert [p.relative_to(tmp_path / "results").parts[:2] for p in files] == [("RecordingEngine", "reasoning")] * 3
    records = [entry for p in files for entry in json.loads(p.read_text())]
    assert len(records) == 3
    for record in records:
        group = by_id[record["id"]]
        assert record["full_response"] == group.completions[0].text
        assert record["completion_tokens"] == len(group.completions[0].token_ids) <= 4
        prediction = extract_prediction(record["full_response"], items[record["id"]])
        assert record["answer"] == prediction
        assert record["is_correct"] == is_correct(prediction, items[record["id"]])
    assert report.table == accuracy_table(records) == calculate_accuracy(tmp_path / "results")
    assert set(report.table) == {"colour_mcq", "clips", "overall"} and report.table["overall"]["total"] == 3


def _load_example():
    spec = importlib.util.spec_from_file_location("evaluate_example", ROOT / "examples" / "evaluate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_script_with_config(exported: Path, colour_bench, tmp_path: Path,
                                    capsys: pytest.CaptureFixture) -> None:
    path, data = colour_bench
    example = _load_example()
    results = tmp_path / "results"
    argv = ["--config", str(ROOT / "examples/configs/eval_tiny.toml"), "--model", str(exported),
            "--benchmark", str(path), "--data-dir", str(data), "--results-dir", str(results),
            "--max-tokens", "3", "--datasets", "colour_mcq", "eval.max_pixels=3136"]
    table = example.main(argv)
    assert table["overall"]["total"] == 2 and set(table) == {"colour_mcq", "overall"}
    [saved] = json.loads((results / "final" / "reasoning" / "colour_mcq" / "test-0.json").read_text())
    assert saved["settings"]["temperature"] == 0.0 and saved["settings"]["max_tokens"] == 3
    assert saved["settings"]["max_pixels"] == 3136 and saved["settings"]["fps"] == 2.0  # flags, overrides, file
    out = capsys.readouterr().out
    assert "2 generated, 0 reused" in out and "colour_mcq" in out

    assert example.main(argv) == table
    assert "0 generated, 2 reused" in capsys.readouterr().out
    assert example.main(["--results-dir", str(results), "--score-only"]) == table


def test_model_arguments_and_path_errors(tmp_path: Path, qwen_tokenizer) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_eval_engine(tmp_path / "no_such_run" / "safetensors" / "final")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"has no config\.json"):
        load_eval_engine(tmp_path / "empty")
    model = cpt.tiny_qwen2(seed=0)
    with pytest.raises(ValueError, match="needs its processor"):
        load_eval_engine(model)
    with pytest.raises(ValueError, match="backend 'hf'"):
        load_eval_engine(model, qwen_tokenizer, backend="vllm")
    in_memory = load_eval_engine(model, qwen_tokenizer)
    assert isinstance(in_memory, HFRolloutEngine) and in_memory.model is model
    assert load_eval_engine(in_memory) is in_memory


def test_vllm_backend_against_standin(standin_vllm, tiny_qwen2_dir: Path, qwen_tokenizer, tmp_path: Path) -> None:
    vllm = standin_vllm
    bench = tmp_path / "text.jsonl"
    bench.write_text("".join(json.dumps({"id": str(i), "question": f"Say {w}.", "answer": w}) + "\n"
                             for i, w in enumerate(["yes", "no"])))
    # the stand-in samples only with temperature > 0
    cfg = EvalConfig(backend="vllm", tp_size=1, temperature=0.7, max_response_length=3, max_model_len=512, seed=5)
    report = evaluate(str(tiny_qwen2_dir), bench, results_dir=tmp_path / "results", cfg=cfg,
                      processor=qwen_tokenizer, print_table=False)
    llm_kwargs = next(kwargs for name, kwargs in vllm.CALLS if name == "LLM")
    assert (llm_kwargs["model"], llm_kwargs["tensor_parallel_size"], llm_kwargs["max_model_len"],
            llm_kwargs["seed"]) == (str(tiny_qwen2_dir), 1, 512, 5)
    assert llm_kwargs["gpu_memory_utilization"] == 0.9  # standalone: no trainer shares the GPU
    assert ("generate", 2) in vllm.CALLS
    assert report.table["overall"]["total"] == 2 and report.generated == 2


def test_reason1_guide_yaml_and_flags_run_on_the_tiny_model(exported: Path, colour_bench, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    """The Cosmos-Reason1 guide's evaluation YAML (datasets / model / evaluation / generation) with its
    flags (--model_name, --data_dir, --results_dir), then its scoring command (--result_dir --dataset)."""
    path, data = colour_bench
    guide = (ROOT / "tests/data/cosmos_rl_configs/cosmos-reason1/examples/benchmark/configs/evaluate.yaml").read_text()
    yaml_path = tmp_path / "evaluate.yaml"
    yaml_path.write_text(guide.replace("  - robovqa\n  - av\n", "  - colour_mcq\n")
                         .replace("max_tokens: 1024", "max_tokens: 3").replace("max_retries: 10", "max_retries: 0"))
    example = _load_example()
    results = tmp_path / "results"
    with pytest.warns(UserWarning, match=r"ignored \(no effect here\): model.tokenizer_model_name"):
        table = example.main(["--config", str(yaml_path), "--model_name", str(exported), "--benchmark", str(path),
                              "--data_dir", str(data), "--results_dir", str(results), "eval.dtype=float32"])
    assert table["overall"]["total"] == 2 and set(table) == {"colour_mcq", "overall"}
    [saved] = json.loads((results / "final" / "reasoning" / "colour_mcq" / "test-0.json").read_text())
    assert saved["settings"]["temperature"] == 0.6 and saved["settings"]["fps"] == 4  # from the YAML
    assert saved["prompt"][0] == {"role": "system", "content": "Answer the questions."}
    capsys.readouterr()
    assert example.main(["--score-only", "--result_dir", str(results), "--dataset", "colour_mcq"]) == table
    assert "colour_mcq" in capsys.readouterr().out


def test_reason1_guide_command_finds_benchmarks_under_data_dir(exported: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture) -> None:
    """The guide's command as it is, no --benchmark: the YAML's datasets (robovqa, av) are read from
    data/benchmark/<dataset>/<dataset>_benchmark_qa_pairs.json with their clips."""
    data = tmp_path / "data"
    cpt.write_reason1_benchmark(data, "robovqa", clips=2)
    cpt.write_reason1_benchmark(data, "av", clips=1)
    cpt.write_reason1_benchmark(data, "agibot", clips=1)  # downloaded, but not in the YAML's list
    guide = (ROOT / "tests/data/cosmos_rl_configs/cosmos-reason1/examples/benchmark/configs/evaluate.yaml").read_text()
    yaml_path = tmp_path / "robovqa.yaml"
    yaml_path.write_text(guide.replace("max_tokens: 1024", "max_tokens: 3")
                         .replace("max_retries: 10", "max_retries: 0"))
    results = tmp_path / "results"
    with pytest.warns(UserWarning, match="evaluation.num_processes"):
        table = _load_example().main(["--config", str(yaml_path), "--model_name", str(exported), "--data_dir",
                                      str(data), "--results_dir", str(results), "eval.dtype=float32"])
    assert set(table) == {"robovqa", "av", "overall"}
    assert (table["robovqa"]["total"], table["av"]["total"], table["overall"]["failed"]) == (3, 1, 0)
    saved = json.loads((results / "final" / "reasoning" / "robovqa" / "clip1.json").read_text())
    assert [entry["id"] for entry in saved] == ["clip1-0", "clip1-1"]  # one file per clip, as the tool writes it
    assert saved[0]["media"] == ["robovqa/clips/clip1.mp4"] and saved[0]["prompt_tokens"] > 20  # the clip's tokens too

    # the tool's own flags: --config_file, --skip_saved (the YAML says skip_saved: false), --limit (per
    # dataset, whole clips); everything is saved, so nothing is generated
    with pytest.warns(UserWarning, match="evaluation.num_processes"):
        limited = _load_example().main(["--config_file", str(yaml_path), "--model_name", str(exported), "--data_dir",
                                         str(data), "--results_dir", str(results), "--skip_saved", "--limit", "1"])
    assert (limited["robovqa"]["total"], limited["av"]["total"]) == (1, 1)
    assert "0 generated, 2 reused" in capsys.readouterr().out


def test_eval_yaml_keys_are_mapped_ignored_or_refused(tmp_path: Path) -> None:
    guide = ROOT / "tests/data/cosmos_rl_configs/cosmos-reason1/examples/benchmark/configs/evaluate.yaml"
    with pytest.warns(UserWarning, match="evaluation.num_processes"):
        cfg = cp.load_config(guide)
    assert cfg.eval.datasets == ["robovqa", "av"] and cfg.eval.model == "nvidia/Cosmos-Reason1-7B"
    assert (cfg.eval.max_model_len, cfg.eval.max_retries, cfg.eval.skip_saved) == (128000, 10, False)
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  model_nme: x\ngeneration:\n  presence_penalty: 0.5\n  max_tokns: 3\n")
    with pytest.raises(cp.ConfigError) as info:
        cp.load_config(bad)
    assert len(info.value.problems) == 2 and "unknown key 'model.model_nme'" in info.value.problems[0]
    ok = tmp_path / "ok.yaml"
    ok.write_text("generation:\n  presence_penalty: 0.5\n")
    assert "generation.presence_penalty" in cp.load_config(ok).unsupported


def test_inference_script_answers_about_one_image_or_video(exported: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    spec = importlib.util.spec_from_file_location("inference_example", ROOT / "examples" / "inference.py")
    inference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(inference)
    image = cpt.write_image(tmp_path / "red.png", cpt.color_image("red", size=(56, 56)))
    answer = inference.main(["--model_name", str(exported), "--image", str(image), "--prompt", "Which colour?",
                             "--reasoning", "--system", "", "--max-tokens", "4", "--temperature", "0"])
    assert isinstance(answer, str) and capsys.readouterr().out.strip() == answer.strip()
    frames = cpt.color_image("blue", size=(56, 56))[None].repeat(6, 0)
    video = cpt.write_mp4(tmp_path / "clip.mp4", fps=4.0, frames=frames)
    assert isinstance(inference.main(["--model", str(exported), "--video", str(video), "--prompt", "What happens?",
                                      "--max-tokens", "3", "--fps", "2"]), str)
    with pytest.raises(SystemExit, match="no such file"):
        inference.main(["--model", str(exported), "--image", str(tmp_path / "nope.png"), "--prompt", "x"])
