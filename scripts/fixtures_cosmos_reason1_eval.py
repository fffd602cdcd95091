"""Write ``tests/data/cosmos_reason1_eval_reference.json``: what the Cosmos-Reason1 guide's
evaluation tool itself does, so that ``tests/test_eval_reference_tool.py`` compares ``cp.eval``
with it without the tool's environment.

Run with a Python that has qwen-vl-utils, torch, torchvision, attrs, PyAV and decord (not the
library's venv; e.g. ``/work/venvs/cosmos-rl``), on a checkout of the tool::

    git clone https://github.com/nvidia-cosmos/cosmos-reason1 && git -C cosmos-reason1 checkout 3e7f1cb
    FORCE_QWENVL_VIDEO_READER=decord python scripts/fixtures_cosmos_reason1_eval.py \\
        --tool-dir cosmos-reason1/examples/benchmark

The tool's modules are imported from ``--tool-dir`` and run as they are:

- ``scoring``: ``parse_reasoning_response`` / ``parse_letter_response`` (``tools/eval/utils/output.py``)
  and ``run_model``'s correctness rule on ``OUTPUTS``, typical model outputs against an answer letter;
- ``prompts``: ``InputStructure.from_dict``, ``get_prompt`` and ``prepare_single_model_input``
  (``tools/eval/utils/input.py``) on benchmark QA pairs: the messages the tool sends;
- ``videos``: the frames qwen-vl-utils' ``process_vision_info`` gives that prompt for generated clips
  of 1-60 s at several rates and sizes (``[T, C, H, W]``), at the tool's 4 fps;
- ``retries``: ``run_model`` (``tools/eval/evaluate.py``, its source taken out of the file, which
  imports vLLM) with a scripted model: every generate call's items and sampling settings, and the
  results it keeps.
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import sys
import tempfile
import types
from fractions import Fraction
from pathlib import Path

import numpy as np

TOOL_COMMIT = "3e7f1cb11128bb424e2a8e85a4aafc7ee9b8bb34"
OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "cosmos_reason1_eval_reference.json"

# (text, answer letter, kind); the first 13 kinds are the ones issue 26 lists as scored differently
OUTPUTS = [
    ("<think>The arm lifts the cup.</think>\n\n<answer>A</answer>", "A", "canonical"),
    ("<think>It moves.</think>\n\n<answer>(A)</answer>", "A", "letter in parentheses"),
    ("A. it moves", "A", "bare letter with the choice text"),
    ("Answer: A", "A", "Answer: letter"),
    ("<answer>A. it moves</answer>", "A", "letter and choice text in the tag"),
    ("<answer>a</answer>", "A", "lower-case letter in the tag"),
    ("The answer is A.", "A", "sentence, no tag"),
    ("<answer>The answer is A</answer>", "A", "sentence in the tag"),
    ("<think>thinking about it for a long time and", "A", "truncated, no answer tag"),
    ("", "A", "empty"),
    ("<answer>\nB\n</answer>", "B", "letter on its own line"),
    ("<think>maybe <answer>B</answer></think>\n\n<answer>A</answer>", "A", "an answer tag inside think"),
    ("<answer>it moves</answer>", "A", "choice text only, lower case"),
    ("A", "A", "bare letter"),
    ("(A)", "A", "bare letter in parentheses"),
    ("(C) it stops", "C", "letter in parentheses with the choice text"),
    ("<answer> C </answer>", "C", "spaces around the letter"),
    ("<answer>C</answer><answer>D</answer>", "C", "two answer tags"),
    ("<answer>D</answer><answer>C</answer>", "C", "two answer tags, the right one second"),
    ("<ANSWER>C</ANSWER>", "C", "upper-case tag"),
    ("<answer>C", "C", "unclosed tag"),
    ("C</answer>", "C", "closing tag only"),
    ("<answer></answer>", "C", "empty tag"),
    ("<answer> </answer>", "C", "blank tag"),
    ("<think>C is right</think>", "C", "letter in think only"),
    ("<think>C is right</think><answer>c</answer>", "C", "lower case in the tag, letter in think"),
    ("answer: c", "C", "lower-case prefix and letter"),
    ("I think the answer is B", "B", "sentence starting with I"),
    ("Option B", "B", "Option letter"),
    ("<answer>Option B</answer>", "B", "Option letter in the tag"),
    ("<answer>B)</answer>", "B", "letter and parenthesis"),
    ("<answer>[B]</answer>", "B", "letter in brackets"),
    ("<answer>**B**</answer>", "B", "markdown bold letter"),
    ("**B**", "B", "markdown bold, no tag"),
    ("<answer>\u00c9</answer>", "E", "accented capital"),
    ("<answer>E</answer>", "E", "fifth letter"),
    ("<think>\n\n</think>\n\n<answer>D</answer>", "D", "empty think"),
    ("<think>a\nb</think>\n<answer>D</answer>\n", "D", "newline after the tag"),
    ("<think>reasoning</think> <answer> D </answer>.", "D", "spaced tags, trailing period"),
    ("Final answer: <answer>D</answer>", "D", "prefix before the tag"),
    ("<answer>d. it turns</answer>", "D", "lower-case letter with text"),
    ("<answer>(d)</answer>", "D", "lower-case letter in parentheses"),
    ("<answer>1</answer>", "A", "a number"),
    ("<answer>yes</answer>", "A", "a word without capitals"),
    ("<answer>Yes</answer>", "A", "a capitalised word"),
    ("B\n", "B", "letter and newline"),
    ("  B  ", "B", "padded letter"),
    ("b", "B", "lower-case bare letter"),
    ("<think>The gripper opens.</think>\n\n<answer>B</answer>", "A", "canonical, wrong letter"),
    ("<answer>A</answer>", "B", "bare tag, wrong letter"),
]

PROMPT_ITEMS = [
    {"question": "What will the robot do next?", "index2ans": {"A": "pick", "B": "place", "C": "wait"},
     "answer": "B"},
    {"question": "Is it safe to change lanes?\n", "index2ans": {"B": "no", "A": "yes"}, "correct_answer": "A"},
    {"question": "Which hand holds the cup?", "index2ans": {"A": "left", "B": "right", "C": "both", "D": "none"},
     "answer": "D"},
]

# (num_frames, source fps, (height, width))
CLIPS = [
    (8, 8.0, (64, 64)),
    (30, 30.0, (48, 64)),
    (45, 30.0, (240, 320)),
    (75, 25.0, (36, 90)),
    (96, 24.0, (360, 640)),
    (130, 10.0, (120, 160)),
    (151, 15.0, (100, 178)),
    (313, 12.5, (64, 48)),
    (600, 30.0, (32, 32)),
    (300, 5.0, (90, 160)),
    (60, 60.0, (18, 32)),
    (599, 59.94, (16, 30)),
]


def load_tool(tool_dir: Path) -> tuple[types.ModuleType, types.ModuleType, dict]:
    """The tool's ``output`` and ``input`` modules, and ``run_model`` taken from ``evaluate.py``."""
    sys.path.insert(0, str(tool_dir))
    from tools.eval.utils import input as tool_input
    from tools.eval.utils import output as tool_output

    source = (tool_dir / "tools" / "eval" / "evaluate.py").read_text()
    [run_model] = [node for node in ast.parse(source).body
                   if isinstance(node, ast.FunctionDef) and node.name == "run_model"]
    namespace = {"log": logging, "LLM": object, "InputStructure": tool_input.InputStructure,
                 "OutputStructure": tool_output.OutputStructure, "SamplingParams": RecordedSamplingParams,
                 "parse_letter_response": tool_output.parse_letter_response,
                 "parse_reasoning_response": tool_output.parse_reasoning_response}
    exec(compile(ast.Module(body=[run_model], type_ignores=[]), str(tool_dir / "evaluate.py"), "exec"), namespace)
    return tool_output, tool_input, namespace


class RecordedSamplingParams:
    """Stands in for ``vllm.SamplingParams``: keeps what the tool sets (vLLM's defaults otherwise)."""

    def __init__(self, **kwargs) -> None:
        self.temperature, self.top_p, self.top_k, self.repetition_penalty = 1.0, 1.0, -1, 1.0
        self.max_tokens, self.seed = 16, None
        self.presence_penalty = self.frequency_penalty = 0.0
        for key, value in kwargs.items():
            setattr(self, key, value)

    def snapshot(self) -> dict:
        return {key: getattr(self, key) for key in ("temperature", "top_p", "top_k", "repetition_penalty",
                                                    "max_tokens", "seed")}


class ScriptedLLM:
    """A ``vllm.LLM`` whose inputs are item ids: returns ``script[id]``'s next text, records each call."""

    def __init__(self, script: dict[str, list[str]]) -> None:
        self.script = {key: list(texts) for key, texts in script.items()}
        self.calls: list[dict] = []

    def generate(self, inputs: list[str], params: RecordedSamplingParams) -> list:
        self.calls.append({"ids": list(inputs), **params.snapshot()})
        return [types.SimpleNamespace(outputs=[types.SimpleNamespace(text=self.script[i].pop(0))]) for i in inputs]


def scoring(tool_output) -> list[dict]:
    rows = []
    for text, letter, kind in OUTPUTS:
        row = {"kind": kind, "text": text, "correct_answer": letter}
        for answer_type, parse in (("reasoning", tool_output.parse_reasoning_response),
                                   ("letter", tool_output.parse_letter_response)):
            answer, reasoning = parse(text)
            # run_model's rule
            row[answer_type] = {"answer": answer, "reasoning": reasoning,
                                "is_correct": answer.lower() == letter.lower()}
        rows.append(row)
    return rows


def write_clip(path: Path, num_frames: int, fps: float, size: tuple[int, int]) -> None:
    """An H.264 yuv420p mp4 encoded as ``cosmos_primitives.testing.write_mp4`` encodes it."""
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1000))
        stream.width, stream.height, stream.pix_fmt = size[1], size[0], "yuv420p"
        stream.options = {"crf": "10", "preset": "ultrafast"}
        for i in range(num_frames):
            frame = np.full((size[0], size[1], 3), (i * 8) % 256, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


class TemplateOnly:
    """The processor ``prepare_single_model_input`` needs: only its chat template is called."""

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True) -> str:
        return json.dumps(messages)


def prompts_and_videos(tool_input, work: Path) -> tuple[list[dict], list[dict]]:
    data_dir = work / "benchmark"
    prompts, videos = [], []
    for answer_type in ("reasoning", "letter"):
        for k, qa in enumerate(PROMPT_ITEMS):
            task = tool_input.InputStructure.from_dict("robovqa", f"clip{k}", dict(qa), 0)
            write_clip(data_dir / "robovqa" / "clips" / f"clip{k}.mp4", 8, 8.0, (64, 64))
            task = tool_input.get_video_path_and_prompt(task, str(data_dir), answer_type)
            model_input = tool_input.prepare_single_model_input(task, TemplateOnly(), fps=4)
            messages = json.loads(model_input["prompt"])
            messages[1]["content"][0]["video"] = str(Path(messages[1]["content"][0]["video"]).relative_to(data_dir))
            prompts.append({"qa": qa, "answer_type": answer_type, "messages": messages,
                            "correct_answer": task.correct_answer})
    for k, (num_frames, fps, size) in enumerate(CLIPS):
        path = data_dir / "av" / "clips" / f"clip{k}.mp4"
        write_clip(path, num_frames, fps, size)
        task = tool_input.InputStructure.from_dict("av", f"clip{k}", dict(PROMPT_ITEMS[0]), 0)
        task = tool_input.get_video_path_and_prompt(task, str(data_dir), "reasoning")
        model_input = tool_input.prepare_single_model_input(task, TemplateOnly(), fps=4)
        [video] = model_input["multi_modal_data"]["video"]
        videos.append({"num_frames": num_frames, "fps": fps, "size": list(size), "sample_fps": 4,
                       "shape": list(video.shape)})
    return prompts, videos


RETRY_SCENARIOS = [
    {"name": "reasoning, answers found by the retries",
     "config": {"answer_type": "reasoning", "max_retries": 3, "max_tokens": 1024, "temperature": 0.6,
                "repetition_penalty": 1.0, "seed": 1},
     "items": [["q0", "A"], ["q1", "B"], ["q2", "C"], ["q3", "B"], ["q4", "C"]],
     "script": {"q0": ["<answer>A</answer>"],
                "q1": ["<think>long", "<think>x</think><answer>B</answer>"],
                "q2": ["<think>first</think>", "<answer>a</answer>", "", "<think>still none</think>"],
                "q3": ["<answer>a</answer>", "<answer>it is</answer>", "<answer>(B)</answer>"],
                "q4": ["<answer>D</answer>"]}},
    {"name": "letter: greedy first, the config's tokens and temperature after",
     "config": {"answer_type": "letter", "max_retries": 2, "max_tokens": 512, "temperature": 0.6,
                "repetition_penalty": 1.05, "seed": 7},
     "items": [["q0", "B"], ["q1", "A"], ["q2", "D"]],
     "script": {"q0": ["b", "the one", "B"], "q1": ["<think>sure</think> A"], "q2": ["", "", ""]}},
    {"name": "temperature clamped at 0.9",
     "config": {"answer_type": "reasoning", "max_retries": 4, "max_tokens": 100, "temperature": 0.8,
                "repetition_penalty": 1.0, "seed": 3},
     "items": [["q0", "A"]],
     "script": {"q0": ["", "", "", "", "<answer>A</answer>"]}},
    {"name": "greedy config: retries still sample",
     "config": {"answer_type": "reasoning", "max_retries": 2, "max_tokens": 64, "temperature": 0.0,
                "repetition_penalty": 1.0, "seed": 1},
     "items": [["q0", "A"], ["q1", "B"]],
     "script": {"q0": ["no tag", "<answer>B</answer>"], "q1": ["<answer>B</answer>"]}},
    {"name": "no retries",
     "config": {"answer_type": "reasoning", "max_retries": 0, "max_tokens": 1024, "temperature": 0.6,
                "repetition_penalty": 1.0, "seed": 1},
     "items": [["q0", "A"]],
     "script": {"q0": ["<think>only</think>"]}},
]


def retries(tool_output, tool_input, namespace) -> list[dict]:
    import attrs

    out = []
    for scenario in RETRY_SCENARIOS:
        cfg = scenario["config"]
        tasks = [tool_input.InputStructure.from_dict("robovqa", qid, {"question": "q", "answer": letter}, 0)
                 for qid, letter in scenario["items"]]
        results = [tool_output.OutputStructure(datasource="robovqa", video_id=qid, output_json_fname="",
                                               correct_answer=letter) for qid, letter in scenario["items"]]
        llm = ScriptedLLM(scenario["script"])
        namespace["run_model"](llm, [qid for qid, _ in scenario["items"]], tasks, results, 0, cfg["answer_type"],
                               cfg["max_retries"], cfg["max_tokens"], cfg["temperature"], cfg["repetition_penalty"],
                               0.0, 0.0, cfg["seed"])
        kept = [{k: v for k, v in attrs.asdict(r).items() if k in ("answer", "reasoning", "full_response",
                                                                     "is_correct")} for r in results]
        out.append({**scenario, "calls": llm.calls, "results": kept})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tool-dir", required=True, type=Path,
                        help="the examples/benchmark folder of a cosmos-reason1 checkout")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    from importlib.metadata import version

    from qwen_vl_utils import vision_process

    tool_output, tool_input, namespace = load_tool(args.tool_dir.resolve())
    with tempfile.TemporaryDirectory() as work:
        prompts, videos = prompts_and_videos(tool_input, Path(work))
    fixture = {
        "source": {"repository": "https://github.com/nvidia-cosmos/cosmos-reason1", "commit": TOOL_COMMIT,
                   "files": ["examples/benchmark/tools/eval/evaluate.py",
                             "examples/benchmark/tools/eval/utils/input.py",
                             "examples/benchmark/tools/eval/utils/output.py"],
                   "qwen_vl_utils": version("qwen-vl-utils"), "video_reader": vision_process.get_video_reader_backend(),
                   "made_by": "scripts/fixtures_cosmos_reason1_eval.py"},
        "scoring": scoring(tool_output),
        "prompts": prompts,
        "videos": videos,
        "retries": retries(tool_output, tool_input, namespace),
    }
    args.out.write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}: {len(fixture['scoring'])} outputs, {len(prompts)} prompts, {len(videos)} clips, "
          f"{len(fixture['retries'])} retry scenarios")


if __name__ == "__main__":
    main()
