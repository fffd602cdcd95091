"""Materialise the small assets the tiny example configs point at (a random tiny model, generated
clips and images), so that ``examples/*.py --config examples/configs/*_tiny.toml`` runs on a fresh
machine with nothing downloaded.

Only paths written ``demo:<path>`` are ever written to (``cp.config.paths``): a config copied from a
tiny one whose path was changed to the user's own model or data never gets a random model or
generated data there. ``[custom]`` keys say what to generate:

- ``demo_model = "tiny_qwen2_5_vl"`` (or ``"tiny_qwen3_vl"``, ``"tiny_qwen2"``, ``"tiny_qwen3"``): that model +
  processor, at
  ``[policy] model_name_or_path = "demo:<folder>"``, when the folder does not exist yet.
- ``demo_data = "video_qa"``: a local video folder (``videos/<id>.mp4`` + ``metas/<id>.label.json``)
  at ``[train.train_policy.dataset] name = "demo:<folder>"``; ``"colour_mcq"``: colour-MCQ images +
  JSONL files (``name = "demo:<folder>/train.jsonl"``); ``"arithmetic"``: plain-text sums, a JSONL
  file of ``prompt`` / ``answer`` rows (``name = "demo:<folder>/train.jsonl"``, read with
  ``prompt_column_name = "prompt"``, ``response_column_name = "answer"``).
- ``demo_items``: how many items (default 32).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from cosmos_primitives.config.paths import DEMO_PREFIX, demo_target
from cosmos_primitives.testing.colour_mcq import write_colour_mcq, write_colour_mcq_sft
from cosmos_primitives.testing.media import COLOURS, write_mp4
from cosmos_primitives.testing.models import save_tiny_qwen2, save_tiny_qwen2_5_vl, save_tiny_qwen3, save_tiny_qwen3_vl

DEMO_MODELS = {"tiny_qwen2_5_vl": save_tiny_qwen2_5_vl, "tiny_qwen3_vl": save_tiny_qwen3_vl,
               "tiny_qwen2": save_tiny_qwen2, "tiny_qwen3": save_tiny_qwen3}


def write_video_qa(root: str | Path, n: int = 32, seed: int = 0) -> Path:
    """``n`` short clips, each a solid colour drifting in brightness, with a label JSON naming the colour."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    names = list(COLOURS)
    for i in range(n):
        colour = names[int(rng.integers(len(names)))]
        frames_count = int(rng.integers(6, 13))
        base = np.array(COLOURS[colour], dtype=np.float32)
        frames = np.stack([np.clip(base * (0.8 + 0.04 * t) + rng.normal(0, 6, (56, 56, 3)), 0, 255)
                           for t in range(frames_count)]).astype(np.uint8)
        write_mp4(root / "videos" / f"clip{i:03d}.mp4", fps=4.0, frames=frames)
        label = {"caption": f"The video shows a {colour} screen that slowly gets brighter.", "colour": colour}
        (root / "metas").mkdir(parents=True, exist_ok=True)
        (root / "metas" / f"clip{i:03d}.label.json").write_text(json.dumps(label))
    return root


def write_arithmetic(root: str | Path, n: int = 32, seed: int = 0) -> Path:
    """``root/train.jsonl``: ``n`` rows ``{"id", "prompt": "12 + 7 =", "answer": "19"}`` for text-only GRPO
    (the prompt is plain text, used without a chat template). Returns the file."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    path = root / "train.jsonl"
    with path.open("w") as f:
        for i in range(n):
            a, b = (int(x) for x in rng.integers(0, 50, size=2))
            f.write(json.dumps({"id": f"sum{i:03d}", "prompt": f"{a} + {b} =", "answer": str(a + b)}) + "\n")
    return path


def _kind(custom: dict[str, Any], key: str, path_key: str, value: str) -> str:
    kind = custom.get(key)
    if not kind:
        raise ValueError(f"{path_key} = {value!r} asks for a demo asset, but [custom] {key} does not say which; "
                         f"set it, or drop the '{DEMO_PREFIX}' prefix to read your own")
    return str(kind)


def ensure_demo_assets(config: Any) -> list[Path]:
    """Create the demo model / data at the config's ``demo:<path>`` input paths (no-op when they exist).

    Call it on one rank (e.g. rank 0), barrier, then ``cp.config.check_input_paths`` on every rank
    (which drops the prefixes). Paths without the prefix are left alone. Returns the paths written.
    """
    custom = config.custom or {}
    written: list[Path] = []
    model_value = config.policy.model_name_or_path
    path = demo_target(model_value)
    if path is not None:
        model_kind = _kind(custom, "demo_model", "policy.model_name_or_path", model_value)
        if model_kind not in DEMO_MODELS:
            raise ValueError(f"[custom] demo_model = {model_kind!r}: known demo models are {sorted(DEMO_MODELS)}")
        if not (path / "config.json").is_file():
            written.append(DEMO_MODELS[model_kind](path, seed=int(custom.get("demo_seed", 0))))
    data_value = config.train.train_policy.dataset.name
    root = demo_target(data_value)
    if root is not None:
        data_kind = _kind(custom, "demo_data", "train.train_policy.dataset.name", data_value)
        n = int(custom.get("demo_items", 32))
        if data_kind == "video_qa":
            if not (root / "metas").is_dir():
                written.append(write_video_qa(root, n=n, seed=int(custom.get("demo_seed", 0))))
        elif data_kind == "colour_mcq":
            folder = root.parent if root.suffix == ".jsonl" else root
            if not (folder / "train.jsonl").is_file():
                jsonl = write_colour_mcq(folder, n, seed=int(custom.get("demo_seed", 0)), split="train")
                write_colour_mcq(folder, int(custom.get("demo_eval_items", 64)), seed=1, split="test")
                write_colour_mcq_sft(folder, jsonl)
                written.append(folder)
        elif data_kind == "arithmetic":
            folder = root.parent if root.suffix == ".jsonl" else root
            if not (folder / "train.jsonl").is_file():
                written.append(write_arithmetic(folder, n, seed=int(custom.get("demo_seed", 0))))
        else:
            raise ValueError(f"[custom] demo_data = {data_kind!r}: known demo data are 'video_qa', 'colour_mcq', "
                             "'arithmetic'")
    return written
