"""What a person looks at after a world-model RL run: sample mp4s with their rewards (file name and
JSON), the reward curves PNG, the W&B media, and the exported weights, in the tiny recipe's run folder."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from cosmos_primitives.logging import save_video_samples
from cosmos_primitives.logging.samples import write_mp4

av = pytest.importorskip("av")
ROOT = Path(__file__).resolve().parents[1]


def decode(path: Path) -> np.ndarray:
    """Every frame of an mp4 as ``[T, H, W, 3]`` uint8 (PyAV)."""
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def test_write_mp4_round_trips_frames_and_pads_odd_sizes(tmp_path):
    frames = np.zeros((5, 15, 16, 3), dtype=np.uint8)
    for t in range(5):
        frames[t] = 40 * t  # a brightness ramp, one level per frame
    decoded = decode(write_mp4(tmp_path / "a.mp4", frames, fps=8.0))
    assert decoded.shape == (5, 16, 16, 3)  # one edge row added: yuv420p wants even sizes
    assert np.abs(decoded[:, :15].astype(int) - frames.astype(int)).max() <= 3  # H.264 at crf 18
    with pytest.raises(ValueError, match=r"\[T, H, W, 3\] uint8"):
        write_mp4(tmp_path / "b.mp4", frames.astype(np.float32))


def test_save_video_samples_names_files_by_reward_and_lists_every_sample(tmp_path):
    videos = torch.randint(0, 255, (6, 3, 5, 16, 16), dtype=torch.uint8)  # [B, 3, T, H, W]
    rewards = [0.1, 0.25, 0.3, 0.4, 0.5, 0.625]
    written = save_video_samples(tmp_path, 20, videos, prompt_ids=[0, 0, 0, 7, 7, 7], captions=["a"] * 3 + ["b"] * 3,
                                 seeds=list(range(6)), rewards=rewards, fps=16.0, videos_per_prompt=2)
    folder = tmp_path / "samples" / "step_20"  # named as the checkpoint of that step, checkpoints/step_20
    assert [p.name for p in written] == ["p00_s00_reward0.1000.mp4", "p00_s01_reward0.2500.mp4",
                                         "p07_s00_reward0.4000.mp4", "p07_s01_reward0.5000.mp4"]
    assert all(decode(p).shape == (5, 16, 16, 3) for p in written)
    summary = json.loads((folder / "rewards.json").read_text())
    assert summary["step"] == 20 and summary["reward_mean"] == pytest.approx(np.mean(rewards))
    assert [(s["prompt"], s["sample"], s["seed"], s["file"]) for s in summary["samples"]][2:4] == [
        (0, 2, 2, None), (7, 0, 3, "p07_s00_reward0.4000.mp4")]
    # a sample without a video says why
    assert summary["samples"][2]["reason"] == "videos_per_prompt = 2: only the first 2 samples of a prompt are written"
    assert "reason" not in summary["samples"][3]
    with pytest.raises(ValueError, match="6 videos but 5 prompt ids"):
        save_video_samples(tmp_path, 1, videos, prompt_ids=[0] * 5, captions=["a"] * 6, seeds=[0] * 6,
                           rewards=rewards, fps=16.0)


@pytest.mark.slow
def test_tiny_recipe_run_folder_holds_weights_videos_rewards_and_curves(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    spec = importlib.util.spec_from_file_location("wfm_rl_example", ROOT / "examples" / "wfm_rl.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    threads = torch.get_num_threads()
    try:
        run_dir = example.main([
            "--config", str(ROOT / "examples" / "configs" / "wfm_flowgrpo_tiny.toml"),
            f"train.output_dir={tmp_path}", 'logging.logger=["console", "wandb"]', "train.max_steps=2",
            "wfm.eval_freq=1", "wfm.num_samples_per_prompt=3", "wfm.num_inference_steps=4",
            "wfm.eval_num_inference_steps=4", "wfm.sampler.sde_window_range=[0, 4]", "wfm.data.num_frames=5",
            "train.ckpt.save_freq=1",
        ])
    finally:
        torch.set_num_threads(threads)
    files = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file() and "wandb" not in p.parts)
    print("\n".join(files))  # the listing for the report

    # weights: the adapters, and diffusers folders at each save and at the end
    assert (run_dir / "trained_weights.safetensors").is_file()
    for export in ("step_1", "step_2", "final"):
        assert (run_dir / "safetensors" / export / "transformer" / "config.json").is_file()
        assert (run_dir / "safetensors" / export / "lora" / "pytorch_lora_weights.safetensors").is_file()
    # videos: before the first step and after each (eval_freq = 1), 2 of the 3 samples of each of 2 prompts
    for step in (0, 1, 2):
        folder = run_dir / "samples" / f"step_{step}"
        summary = json.loads((folder / "rewards.json").read_text())
        assert len(summary["samples"]) == 6 and summary["step"] == step
        named = [s for s in summary["samples"] if s["file"]]
        assert sorted(s["file"] for s in named) == sorted(p.name for p in folder.glob("*.mp4")) and len(named) == 4
        for sample in named:
            assert sample["file"].endswith(f"_reward{sample['reward']:.4f}.mp4")
            assert decode(folder / sample["file"]).shape == (5, 16, 16, 3)  # 5 frames of 16 x 16
    # the same eval prompts and seeds every time
    seeds = [[s["seed"] for s in json.loads((run_dir / "samples" / f"step_{k}" / "rewards.json").read_text())
              ["samples"]] for k in (0, 2)]
    assert seeds[0] == seeds[1]
    curves = run_dir / "curves.png"
    assert curves.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # W&B (offline): the eval videos are in the run's media
    media = list((run_dir / "wandb").glob("offline-run-*/files/media/videos/eval/*.mp4"))
    assert len(media) == 12  # 4 videos x 3 evaluations
