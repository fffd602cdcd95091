"""``[eval]``: benchmark evaluation of a model or exported checkpoint (``cp.eval``, ``examples/evaluate.py``).

Defaults are the generation settings Cosmos-Reason benchmark numbers are reported with
(REFERENCE.md section 1): temperature 0.6, 1024 new tokens, videos sampled at 4 fps, seed 1, and
``top_p = 0.95`` as the reference evaluation tool uses. ``temperature = 0`` decodes greedily.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from cosmos_primitives.config.base import AtLeastOne, Section


class EvalConfig(Section):
    """``[eval]``.

    What to run: ``model`` (an exported ``safetensors/final`` folder or a hub name; empty: the
    ``[policy] model_name_or_path``), ``benchmark`` (a JSON list or JSONL file of items),
    ``data_dir`` (media paths of the items are relative to it; empty: the benchmark's folder; with no
    ``benchmark``, the Cosmos-Reason1 guide's data folder: ``<data_dir>/benchmark/<dataset>/
    <dataset>_benchmark_qa_pairs.json``, ``cp.eval.load_benchmark_dir``),
    ``results_dir`` (one JSON per item under ``<results_dir>/<dataset>/``), ``datasets`` (only these
    dataset names; empty: all), ``limit`` (first N items after the filter; -1: all).

    How: ``answer_type`` ``"reasoning"`` asks for ``<think>..</think> <answer>..</answer>`` and
    scores the first ``<answer>``; ``"letter"`` asks for the option's letter directly (the reference
    tool decodes it greedily with 10 new tokens: ``temperature = 0``, ``max_tokens = 10``).
    ``skip_saved``: items with a saved prediction are not generated again. ``max_retries``: items
    whose extracted answer is empty are sampled again (new seed) up to this many times; only with
    ``temperature > 0`` (the reference tool's configs use 10).
    ``backend``: ``"hf"`` (transformers ``generate``) or ``"vllm"`` (optional extra, GPU), with
    ``tp_size`` and ``max_model_len`` for vLLM. ``batch_size``: prompts per ``generate`` call.

    Media: videos sampled at ``fps`` frames per second, at most ``max_frames`` frames, every frame
    and image resized to at most ``max_pixels`` pixels.
    """

    model: str = ""
    benchmark: str = ""
    data_dir: str = ""
    results_dir: str = "results"
    datasets: list[str] = msgspec.field(default_factory=list)
    limit: int = -1
    answer_type: Literal["reasoning", "letter"] = "reasoning"
    system_prompt: str = ""
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
    max_tokens: AtLeastOne = 1024
    seed: int = 1
    max_retries: int = 0
    # media
    fps: float = 4.0
    max_pixels: int = 81920
    min_pixels: int = 3136
    max_frames: int = 64
