"""Video frame sampling: which frames, what size, which decoder, how much memory, and what happens to bad files.

Parity with qwen-vl-utils on real clips is in ``test_qwen_vl_media_parity.py``; these are the
hand-worked rules and the decoder behaviour.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cosmos_primitives import testing as cpt
from cosmos_primitives.data import video_sampling
from cosmos_primitives.data.media import MediaSettings
from cosmos_primitives.data.qwen_vl_sizing import (
    frame_indices,
    frame_range,
    plan_video,
    smart_nframes,
    smart_resize,
    video_frame_size,
    video_pixel_bounds,
)
from cosmos_primitives.data.video_sampling import VideoDecodeError, resize_frames, sample_video
from cosmos_primitives.utils.extras import MissingExtraError


def test_frame_count_is_floored_to_even_and_not_capped_at_32() -> None:
    # 30 frames at 10 fps = 3 s; 2 fps -> 6 frames
    assert smart_nframes(30, 10.0, fps=2.0) == 6
    # 2.5 s at 2 fps = 5 frames: floored to 4 (rounding would give 6)
    assert smart_nframes(60, 24.0, fps=2.0) == 4
    # 60 s at 4 fps = 240 frames: no cap at 32; the default cap is min(768, frames in the clip)
    assert smart_nframes(900, 15.0, fps=4.0) == 240
    assert smart_nframes(1800, 60.0, fps=30.0) == 768
    # 1 s at 1 fps = 1 frame, lifted to min_frames (4)
    assert smart_nframes(30, 30.0, fps=1) == 4
    # a 3-frame clip: min_frames 4 is capped by max_frames = 3 floored to 2
    assert smart_nframes(3, 1.0, fps=1) == 2
    # explicit keys: max_frames floored to even, min_frames ceiled to even, nframes rounded to even
    assert smart_nframes(300, 30.0, fps=4.0, max_frames=9) == 8
    assert smart_nframes(300, 30.0, fps=0.1, min_frames=3) == 4
    assert smart_nframes(300, 30.0, nframes=7) == 8
    # the default fps is 2
    assert smart_nframes(300, 30.0) == 20


@pytest.mark.parametrize(("total", "keys"), [(1, {}), (30, {"nframes": 40}), (30, {"fps": 1, "nframes": 4})])
def test_frame_counts_qwen_vl_utils_refuses_raise(total: int, keys: dict) -> None:
    with pytest.raises(ValueError):
        smart_nframes(total, 30.0, **keys)


def test_frame_indices_are_linspace_rounded_half_to_even() -> None:
    assert frame_indices(0, 29, 6) == [0, 6, 12, 17, 23, 29]
    assert frame_indices(0, 59, 4) == [0, 20, 39, 59]
    # halves go to the even neighbour: 1.5 -> 2, 4.5 -> 4
    assert frame_indices(0, 3, 3) == [0, 2, 3]
    assert frame_indices(0, 9, 3) == [0, 4, 9]
    assert frame_indices(8, 101, 18) == torch.linspace(8, 101, 18).round().long().tolist()


def test_frame_range_of_video_start_and_end() -> None:
    assert frame_range(300, 5.0) == (0, 299, 300)
    # 1.5 s -> frame ceil(7.5) = 8; 20.25 s -> floor(101.25) = 101
    assert frame_range(300, 5.0, 1.5, 20.25) == (8, 101, 94)
    assert frame_range(300, 5.0, None, 1000.0) == (0, 299, 300)
    with pytest.raises(ValueError, match="video_start"):
        frame_range(300, 5.0, 30.0, 10.0)


def test_reason1_max_pixels_under_the_video_min_pixels() -> None:
    # Cosmos-Reason1's scripts: max_pixels 81920, min_pixels unset (128 x 28 x 28 = 100352)
    lower, upper = video_pixel_bounds(8, max_pixels=81920)
    assert (lower, upper) == (100352, 81920)
    # a frame over 81920 px shrinks to fit it...
    h, w = video_frame_size(360, 640, 8, max_pixels=81920)
    assert (h, w) == (196, 364) and h * w <= 81920
    # ...a frame under it grows to at least 100352 px (the min_pixels floor wins)
    h, w = video_frame_size(90, 160, 8, max_pixels=81920)
    assert (h, w) == (252, 448) and h * w >= 100352


def test_video_frame_size_defaults_and_total_pixels() -> None:
    # defaults: at most 768 tokens per frame while frames x 768 tokens fit 0.9 x 128000 tokens
    assert video_pixel_bounds(16) == (100352, 602112)
    assert video_pixel_bounds(768)[1] == pytest.approx(128000 * 784 * 0.9 / 768 * 2)
    assert video_frame_size(1080, 1920, 16) == (560, 1008)  # 564480 px <= 602112
    # Reason2's total_pixels (Qwen3-VL, 32 px tokens): 3774873 / 60 x 2 < 1.05 x min_pixels
    assert video_pixel_bounds(60, factor=32, total_pixels=3774873) == (131072, 137625)
    assert video_frame_size(270, 480, 8, resized_height=200, resized_width=300) == (196, 308)


@pytest.mark.parametrize("patch_size", [14, 16], ids=["qwen2_5_vl", "qwen3_vl"])
def test_dataset_total_pixels_is_each_long_clip_s_budget(patch_size: int, tmp_path) -> None:
    from types import SimpleNamespace

    from cosmos_primitives.config import DatasetConfig

    factor = 2 * patch_size
    # 24 frames of 112 x 224 at 8 fps, all sampled (fps 8): unbudgeted, every frame keeps its size
    clip = cpt.write_mp4(tmp_path / "long.mp4", num_frames=24, fps=8.0, size=(112, 224))
    processor = SimpleNamespace(image_processor=SimpleNamespace(patch_size=patch_size))
    total = 96 * factor * factor  # 96 tokens for the video: 8 per frame (a pair of frames is one temporal patch)
    free = MediaSettings.from_config(DatasetConfig(fps=8, min_pixels=factor**2), processor).video(clip)
    budget = MediaSettings.from_config(DatasetConfig(fps=8, min_pixels=factor**2, total_pixels=total),
                                       processor).video(clip)
    assert free.frames.shape[0] == budget.frames.shape[0] == 24
    # qwen-vl-utils: a frame is at most total_pixels / frames x 2 px (two frames are one temporal
    # patch), so the video's tokens (frames / 2 x frame px / factor^2) fit total_pixels / factor^2
    t, h, w = budget.frames.shape[:3]
    assert h * w <= total / t * 2 and t // 2 * h * w <= total
    assert free.frames.shape[1] * free.frames.shape[2] > 2 * h * w  # the budget is what shrank them
    # a part's own total_pixels wins over the dataset's
    own = MediaSettings.from_config(DatasetConfig(fps=8, min_pixels=factor**2, total_pixels=total),
                                    processor).video(clip, {"total_pixels": 4 * total})
    assert own.frames.shape[1] * own.frames.shape[2] > h * w


@pytest.mark.parametrize(("h", "w", "lo", "hi"), [(240, 320, 3136, 81920), (1080, 1920, 3136, 81920),
                                                   (48, 64, 3136, 81920), (100, 2000, 3136, 20000),
                                                   (37, 53, 200704, 12845056)])
def test_smart_resize_multiples_of_28_within_bounds(h: int, w: int, lo: int, hi: int) -> None:
    out_h, out_w = smart_resize(h, w, 28, lo, hi)
    assert out_h % 28 == 0 and out_w % 28 == 0
    assert lo <= out_h * out_w <= hi


def test_smart_resize_refuses_extreme_aspect_ratios_and_zero_sides() -> None:
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(10, 2500)
    with pytest.raises(ValueError, match="side under 28"):
        smart_resize(20, 3000, 28, 3136, 10000)


def test_resize_frames_is_torchvisions_uint8_bicubic() -> None:
    torchvision = pytest.importorskip("torchvision")
    from torchvision.transforms import InterpolationMode

    frames = np.random.default_rng(0).integers(0, 256, (3, 45, 67, 3), dtype=np.uint8)
    ours = resize_frames(frames, (28, 84))
    theirs = torchvision.transforms.functional.resize(torch.from_numpy(frames).permute(0, 3, 1, 2), [28, 84],
                                                      interpolation=InterpolationMode.BICUBIC, antialias=True)
    assert np.array_equal(ours, theirs.permute(0, 2, 3, 1).numpy())
    assert resize_frames(frames, (45, 67)) is frames


@pytest.mark.parametrize("backend", ["decord", "pyav"])
@pytest.mark.parametrize("clip", ["short", "medium", "long_hd"])
def test_sample_video_returns_exactly_the_planned_frames(video_clips, backend: str, clip: str) -> None:
    out = sample_video(video_clips[clip], fps=4.0, max_pixels=28 * 28 * 12, min_pixels=3136, max_frames=8,
                       backend=backend)
    assert out.backend == backend
    plan = plan_video(out.total_frames, out.source_fps, *out.source_size, fps=4.0, max_pixels=28 * 28 * 12,
                      min_pixels=3136, max_frames=8)
    assert out.indices == plan.indices
    # the frames encode their own index: we got those frames, in that order
    assert [cpt.decode_frame_index(f) for f in out.frames] == plan.indices
    t, h, w, c = out.frames.shape
    assert (t, c) == (len(plan.indices), 3) and t % 2 == 0 and (h, w) == plan.size
    assert h * w <= 28 * 28 * 12 and out.frames.dtype == np.uint8
    assert out.fps == pytest.approx(len(plan.indices) / out.total_frames * out.source_fps)


def test_sample_video_clip_geometry_is_read_from_the_file(video_clips) -> None:
    out = sample_video(video_clips["long_hd"], fps=2.0, max_pixels=81920)
    assert out.source_size == (240, 320) and out.total_frames == 31 and out.source_fps == pytest.approx(30.0)
    # 31 frames at 30 fps ~ 1.03 s -> 2 frames at 2 fps, lifted to min_frames = 4
    assert out.indices == [0, 10, 20, 30]
    # 240x320 rounds to 252x308 = 77616 px, under the default min_pixels 100352: it grows
    assert out.frames.shape[1:3] == (280, 392)


def test_part_keys_win_over_settings_and_nframes_takes_no_settings_fps(video_clips) -> None:
    settings = MediaSettings(fps=1.0, max_pixels=28 * 28 * 16, min_pixels=3136)
    part = {"type": "video", "video": "medium.mp4", "nframes": 6, "max_pixels": 28 * 28 * 4}
    assert settings.video_keys(part) == {"nframes": 6, "max_pixels": 3136, "min_pixels": 3136}
    out = settings.video(video_clips["medium"], part)
    assert len(out.indices) == 6 and out.frames.shape[1:3] == (56, 56)
    with pytest.raises(ValueError, match="'fps' must be a number"):
        settings.video_keys({"fps": "two"}, "row 3")


def test_memory_holds_the_sampled_frames_and_one_chunk(video_clips, monkeypatch: pytest.MonkeyPatch) -> None:
    # one full-size frame per chunk: the decoder is asked for one frame at a time
    monkeypatch.setattr(video_sampling, "CHUNK_BYTES", 240 * 320 * 3 * 4)
    asked = []
    decord = pytest.importorskip("decord")
    real = decord.VideoReader.get_batch

    def get_batch(self, indices):
        asked.append(list(indices))
        return real(self, indices)

    monkeypatch.setattr(decord.VideoReader, "get_batch", get_batch)
    out = sample_video(video_clips["long_hd"], fps=2.0, max_pixels=28 * 28 * 16, min_pixels=3136, max_frames=4,
                       backend="decord")
    assert asked == [[i] for i in out.indices]
    whole_clip_bytes = 31 * 240 * 320 * 3
    assert out.frames.nbytes * 20 < whole_clip_bytes


def test_missing_and_corrupt_videos_raise_decode_error_naming_the_file(video_clips) -> None:
    with pytest.raises(VideoDecodeError, match="not found") as missing:
        sample_video(video_clips["missing"])
    assert missing.value.path == str(video_clips["missing"])
    with pytest.raises(VideoDecodeError) as corrupt:
        sample_video(video_clips["corrupt"])
    assert corrupt.value.path == str(video_clips["corrupt"])
    # both decoders were tried and both failures are reported
    assert "decord:" in corrupt.value.reason and "pyav:" in corrupt.value.reason


def test_one_frame_clip_is_a_bad_sample(tmp_path) -> None:
    clip = cpt.write_mp4(tmp_path / "one.mp4", num_frames=1, fps=30.0, size=(64, 64))
    with pytest.raises(VideoDecodeError, match=r"outside \[2, 1\]"):
        sample_video(clip)


def test_falls_back_to_pyav_when_decord_is_missing(video_clips, monkeypatch: pytest.MonkeyPatch) -> None:
    real_require = video_sampling.require

    def without_decord(module: str, feature: str | None = None):
        if module == "decord":
            raise MissingExtraError("'decord' is needed for video decoding but is not installed")
        return real_require(module, feature)

    monkeypatch.setattr(video_sampling, "require", without_decord)
    out = sample_video(video_clips["medium"], fps=2.0, max_frames=8)
    assert out.backend == "pyav"
    assert [cpt.decode_frame_index(f) for f in out.frames] == out.indices == [0, 6, 12, 17, 23, 29]


def test_falls_back_to_pyav_when_decord_fails(video_clips, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_decord(*args, **kwargs):
        raise RuntimeError("decord could not seek")

    monkeypatch.setattr(video_sampling, "_read_decord", broken_decord)
    out = sample_video(video_clips["short"], fps=8.0, max_frames=8)
    assert out.backend == "pyav" and out.indices == list(range(8))
