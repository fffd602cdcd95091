"""Materialise the small assets the tiny example configs point at (a random tiny model, generated
clips and images), so that ``examples/*.py --config examples/configs/*_tiny.toml`` runs on a fresh
machine with nothing downloaded. Driven by ``[custom]`` keys of the config:

- ``demo_model = "tiny_qwen2_5_vl"`` (or ``"tiny_qwen2"``): write that model + processor to
  ``[policy] model_name_or_path`` when the folder does not exist yet.
- ``demo_data = "video_qa"``: write a local video folder (``videos/<id>.mp4`` + ``metas/<id>.label.json``)
  at ``[train.train_policy.dataset] name``; ``"colour_mcq"``: colour-MCQ images + JSONL files.
- ``demo_items``: how many items (default 32).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from cosmos_primitives.testing.colour_mcq import write_colour_mcq, write_colour_mcq_sft
from cosmos_primitives.testing.media import COLOURS, write_mp4
from cosmos_primitives.testing.models import save_tiny_qwen2, save_tiny_qwen2_5_vl

DEMO_MODELS = {"tiny_qwen2_5_vl": save_tiny_qwen2_5_vl, "tiny_qwen2": save_tiny_qwen2}


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


def ensure_demo_assets(config: Any) -> list[Path]:
    """Create the demo model / data a config asks for in ``[custom]`` (no-op when they exist).

    Call it on one rank (e.g. rank 0) and barrier afterwards. Returns the paths written.
    """
    custom = config.custom or {}
    written: list[Path] = []
    model_kind = custom.get("demo_model")
    if model_kind:
        if model_kind not in DEMO_MODELS:
            raise ValueError(f"[custom] demo_model = {model_kind!r}: known demo models are {sorted(DEMO_MODELS)}")
        path = Path(config.policy.model_name_or_path)
        if not (path / "config.json").is_file():
            written.append(DEMO_MODELS[model_kind](path, seed=int(custom.get("demo_seed", 0))))
    data_kind = custom.get("demo_data")
    if data_kind:
        root = Path(config.train.train_policy.dataset.name)
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
        else:
            raise ValueError(f"[custom] demo_data = {data_kind!r}: known demo data are 'video_qa', 'colour_mcq'")
    return written
