"""Video frame sampling: which frames, what size, which decoder, and what happens to bad files."""

from __future__ import annotations

import numpy as np
import pytest

from cosmos_primitives import testing as cpt
from cosmos_primitives.data import video_sampling
from cosmos_primitives.data.video_sampling import (
    VideoDecodeError,
    fit_pixel_budget,
    plan_frame_indices,
    sample_video,
)
from cosmos_primitives.utils.extras import MissingExtraError


def test_plan_frame_indices_hand_worked_cases() -> None:
    # 30 frames at 10 fps = 3 s; 2 fps -> 6 frames spread over 0..29
    assert plan_frame_indices(30, 10.0, 2.0, max_frames=32) == [0, 6, 12, 17, 23, 29]
    # 8 frames at 8 fps = 1 s; 2 fps -> 2 frames, but min_frames=4 lifts it to 4
    assert plan_frame_indices(8, 8.0, 2.0, max_frames=32, min_frames=4) == [0, 2, 5, 7]
    # capped by max_frames (odd max rounds down to even)
    assert len(plan_frame_indices(300, 30.0, 4.0, max_frames=9)) == 8
    # never more frames than the clip has (rounded down to even)
    assert plan_frame_indices(5, 5.0, 30.0, max_frames=32) == [0, 1, 3, 4]
    # a one-frame clip yields its frame twice (one temporal patch)
    assert plan_frame_indices(1, 30.0, 2.0, max_frames=32) == [0, 0]


@pytest.mark.parametrize("total", [1, 2, 3, 7, 16, 31, 100])
@pytest.mark.parametrize("fps", [0.5, 1.0, 4.0, 24.0])
def test_plan_frame_indices_always_even_sorted_in_range(total: int, fps: float) -> None:
    idx = plan_frame_indices(total, 10.0, fps, max_frames=12, min_frames=4)
    assert len(idx) % 2 == 0 and 2 <= len(idx) <= 12
    assert idx == sorted(idx) and idx[0] == 0 and idx[-1] == total - 1
    assert len(idx) <= max(2, total)


@pytest.mark.parametrize(("h", "w", "budget"), [(240, 320, 81920), (1080, 1920, 81920), (48, 64, 81920),
                                                  (240, 320, 3136), (100, 2000, 20000)])
def test_fit_pixel_budget_multiples_of_28_within_budget(h: int, w: int, budget: int) -> None:
    out_h, out_w = fit_pixel_budget(h, w, budget)
    assert out_h % 28 == 0 and out_w % 28 == 0
    assert out_h * out_w <= max(budget, 28 * 28 * 4) or min(out_h, out_w) == 28
    if min(out_h, out_w) >= 84:  # at a few patches per side, 28-px rounding dominates the aspect ratio
        assert abs(out_w / out_h - w / h) / (w / h) < 0.2


@pytest.mark.parametrize("backend", ["decord", "pyav"])
@pytest.mark.parametrize("clip", ["short", "medium", "long_hd"])
def test_sample_video_returns_exactly_the_planned_frames(video_clips, backend: str, clip: str) -> None:
    path = video_clips[clip]
    out = sample_video(path, fps=4.0, max_pixels=28 * 28 * 12, max_frames=8, backend=backend)
    assert out.backend == backend
    expected = plan_frame_indices(out.total_frames, out.source_fps, 4.0, max_frames=8)
    assert out.indices == expected
    # the frames encode their own index: we got those frames, in that order
    assert [cpt.decode_frame_index(f) for f in out.frames] == expected
    t, h, w, c = out.frames.shape
    assert (t, c) == (len(expected), 3) and t % 2 == 0
    assert (h, w) == fit_pixel_budget(*out.source_size, 28 * 28 * 12)
    assert h * w <= 28 * 28 * 12 and out.frames.dtype == np.uint8
    assert out.fps == pytest.approx(len(expected) / out.total_frames * out.source_fps)


def test_sample_video_clip_geometry_is_read_from_the_file(video_clips) -> None:
    out = sample_video(video_clips["long_hd"], fps=2.0, max_pixels=81920, max_frames=32)
    assert out.source_size == (240, 320) and out.total_frames == 31 and out.source_fps == pytest.approx(30.0)
    # 31 frames at 30 fps ~ 1.03 s -> 2 frames at 2 fps, lifted to min_frames = 4
    assert out.indices == [0, 10, 20, 30]
    assert out.frames.shape[1:3] == (252, 308)  # 240x320 is within budget: nearest multiples of 28


def test_decord_decodes_fewer_bytes_than_the_clip(video_clips) -> None:
    out = sample_video(video_clips["long_hd"], fps=2.0, max_pixels=28 * 28 * 16, max_frames=4, backend="decord")
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
