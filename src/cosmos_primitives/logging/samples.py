"""Sample videos a person looks at: H.264 mp4 files of generated clips with their rewards in the file
name and in a JSON beside them, and on W&B when it is on.

Layout, one folder per evaluation::

    <run_dir>/samples/step_20/p01_s00_reward0.5123.mp4     # prompt 1, its sample 0, rank 0
    <run_dir>/samples/step_20/rewards.json                  # every sample: prompt, caption, seed, reward, file

``step_<N>`` as the checkpoint of the same step (``checkpoints/step_20``). A sample without a video
(beyond ``videos_per_prompt``) has ``"file": null`` and a ``"reason"``.

Under several ranks each writes its own samples (``r<rank>_`` before the name, ``rewards_rank<r>.json``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from cosmos_primitives.utils.extras import require

SAMPLES_DIR = "samples"


def write_mp4(path: str | Path, frames: np.ndarray, fps: float = 16.0, *, crf: int = 18) -> Path:
    """Encode ``frames`` ``[T, H, W, 3]`` uint8 RGB as an H.264 (yuv420p) mp4 with PyAV.

    Odd ``H`` / ``W`` are padded by one edge pixel (yuv420p needs even sizes).
    """
    av = require("av", "writing mp4 videos")
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"write_mp4 wants [T, H, W, 3] uint8 frames, got {frames.shape} {frames.dtype}")
    _, h, w, _ = frames.shape
    if h % 2 or w % 2:
        frames = np.pad(frames, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)), mode="edge")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1000))
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        stream.options = {"crf": str(crf), "preset": "ultrafast"}
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def save_video_samples(run_dir: str | Path, step: int, videos: Any, *, prompt_ids: Sequence[int],
                       captions: Sequence[str], seeds: Sequence[int], rewards: Sequence[float], fps: float,
                       videos_per_prompt: int = 2, rank: int = 0, tracker: Any = None) -> list[Path]:
    """Write evaluation samples of ``step`` under ``<run_dir>/samples/step_<step>/`` (module docstring).

    Args:
        videos: ``[B, 3, T, H, W]`` uint8 (tensor or array), e.g. ``cp.rollout.video_to_uint8(decoded)``.
        prompt_ids, captions, seeds, rewards: one per sample (``B``); samples of a prompt are consecutive.
        videos_per_prompt: the first this many samples of each prompt become mp4 files; the JSON lists all.
        tracker: a ``MetricsTracker``; with W&B on, the videos go to ``eval/videos`` at ``step``.

    Returns:
        The mp4 paths written.
    """
    array = videos.detach().cpu().numpy() if hasattr(videos, "detach") else np.asarray(videos)
    if not len(array) == len(prompt_ids) == len(captions) == len(seeds) == len(rewards):
        raise ValueError(f"save_video_samples: {len(array)} videos but {len(prompt_ids)} prompt ids, "
                         f"{len(captions)} captions, {len(seeds)} seeds, {len(rewards)} rewards")
    folder = Path(run_dir) / SAMPLES_DIR / f"step_{step}"
    tag = f"r{rank}_" if rank else ""
    written: list[Path] = []
    records = []
    counts: dict[int, int] = {}
    for i, (prompt, caption, seed, reward) in enumerate(zip(prompt_ids, captions, seeds, rewards)):
        nth = counts[prompt] = counts.get(prompt, -1) + 1
        name = None
        if nth < videos_per_prompt:
            name = f"{tag}p{prompt:02d}_s{nth:02d}_reward{float(reward):.4f}.mp4"
            written.append(write_mp4(folder / name, array[i].transpose(1, 2, 3, 0), fps))
        record = {"prompt": int(prompt), "sample": nth, "caption": caption, "seed": int(seed),
                  "reward": float(reward), "file": name}
        if name is None:
            record["reason"] = (f"videos_per_prompt = {videos_per_prompt}: only the first {videos_per_prompt} "
                                "samples of a prompt are written")
        records.append(record)
    folder.mkdir(parents=True, exist_ok=True)
    summary = {"step": step, "reward_mean": float(np.mean([r["reward"] for r in records])), "samples": records}
    (folder / (f"rewards_rank{rank}.json" if rank else "rewards.json")).write_text(json.dumps(summary, indent=2) + "\n")
    if tracker is not None and written:
        tracker.log_videos("eval/videos", written, [f"{r['caption']} | reward {r['reward']:.4f}"
                                                    for r in records if r["file"]], step)
    return written
