"""``[eval]``: benchmark evaluation of a model or exported checkpoint (``cp.eval``, ``examples/evaluate.py``).

The defaults are those of the Cosmos-Reason1 guide's evaluation tool (cosmos-reason1
``examples/benchmark/tools/eval/evaluate.py`` and its ``configs/evaluate.yaml``): answer type
``reasoning``, temperature 0.6 with top-p 0.95, 1024 new tokens, 10 retries of empty answers,
videos sampled at 4 fps, seed 1, the system prompt "Answer the questions.", and video frames sized
as qwen-vl-utils sizes a part that names no pixel bounds. ``docs/evaluation.md`` lists what matches
the tool and what this library adds.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from cosmos_primitives.config.base import AtLeastOne, Section

# the video rate a Qwen-VL processor assumes when it is told none
QWEN_VL_PROCESSOR_DEFAULT_FPS = 2.0


class EvalConfig(Section):
    """``[eval]``.

    What to run: ``model`` (an exported ``safetensors/final`` folder or a hub name; empty: the
    ``[policy] model_name_or_path``), ``benchmark`` (a JSON list or JSONL file of items),
    ``data_dir`` (media paths of the items are relative to it; empty: the benchmark's folder; with no
    ``benchmark``, the Cosmos-Reason1 guide's data folder: ``<data_dir>/benchmark/<dataset>/
    <dataset>_benchmark_qa_pairs.json``, ``cp.eval.load_benchmark_dir``),
    ``results_dir`` (predictions go to ``<results_dir>/<model folder name>/<answer_type>/<dataset>/
    <clip>.json``, the tool's layout), ``datasets`` (only these dataset names; empty: all),
    ``limit`` (> 0: per dataset, the first clips making at least N items, as the tool's ``--limit``;
    for a benchmark file, its first N items; 0 or -1: all).

    Prompt: ``answer_type`` ``"reasoning"`` asks for ``<think>..</think> <answer>..</answer>`` and
    reads the letter in the first ``<answer>``; ``"letter"`` asks for the letter directly and reads
    the first capital letter (decoded greedily, 10 new tokens, as the tool does). ``prompt``:
    ``"guide"``, the tool's wording; ``"training"``, the wording the Cosmos-Reason1 RL recipe trains
    on ("<answer> your answer </answer>"), for a model that has seen no other. ``system_prompt``: the
    system message (``""``: none; unset: the guide's "Answer the questions.", none for
    ``"training"``).

    Generation: ``temperature``, ``top_p``, ``top_k`` (-1: off), ``repetition_penalty``,
    ``max_response_length`` (new tokens; the tool's ``max_tokens``, formerly this section's too),
    ``seed`` (every generate call); ``max_retries``: items whose answer is empty are sampled again
    up to this many times, retry ``r`` with ``max_response_length + 256 r`` new tokens at
    temperature ``min(temperature + 0.05 r, 0.9)`` (``cp.eval.sampling``).
    ``skip_saved``: items with a saved prediction are not generated again.
    ``backend``: ``"hf"`` (transformers ``generate``) or ``"vllm"`` (optional extra, GPU), with
    ``tp_size`` and ``max_model_len`` for vLLM. ``batch_size``: prompts per ``generate`` call.

    Media: videos sampled at ``fps`` frames per second, at most ``max_frames`` frames, each frame
    (and image) resized to between ``min_pixels`` and ``max_pixels`` pixels, by ``cp.data``; unset
    (the default), qwen-vl-utils' own bounds for the part's kind, as the tool gets for a part that
    names none: video frames 128 to 768 tokens under its ``total_pixels`` cap and at most 768
    frames, images 4 to 16384 tokens (the sizes training saw; a video floor of 128 tokens would
    grow a small image ~36x). ``processor_fps``: the frame rate the
    model's processor is told for each video, which sets the video's time positions; 2.0, as the
    tool (it hands vLLM the sampled frames without their rate, so the processor assumes its default
    2 fps); 0: the rate the frames were sampled at.
    """

    model: str = ""
    benchmark: str = ""
    data_dir: str = ""
    results_dir: str = "results"
    datasets: list[str] = msgspec.field(default_factory=list)
    limit: int = -1
    answer_type: Literal["reasoning", "letter"] = "reasoning"
    prompt: Literal["guide", "training"] = "guide"
    system_prompt: str | None = None
    skip_saved: bool = True
    backend: Literal["hf", "vllm"] = "hf"
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    tp_size: int = 1
    max_model_len: int | None = None
    batch_size: AtLeastOne = 8
    # generation
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = -1
    repetition_penalty: float = 1.0
    max_response_length: AtLeastOne = 1024
    seed: int = 1
    max_retries: int = 10
    # media
    fps: float = 4.0
    max_pixels: int | None = None
    min_pixels: int | None = None
    max_frames: int | None = None
    processor_fps: float = QWEN_VL_PROCESSOR_DEFAULT_FPS
