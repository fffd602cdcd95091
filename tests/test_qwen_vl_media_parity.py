"""Images and videos become the frames, sizes, prompt token ids, positions and pixel values that
cosmos-rl's Qwen2.5-VL packer (through qwen-vl-utils) makes of them.

The reference is the real thing: ``scripts/fixtures_qwen_vl_media.py`` ran cosmos-rl 0.4.7's
``Qwen2_5_VLM_DataPacker`` with qwen-vl-utils 0.0.11 (Cosmos-Reason1's lock) and 0.0.14 on the
committed media of ``tests/data/qwen_vl_media/media`` and wrote ``reference.json``. The library
follows 0.0.11, which equals 0.0.14 wherever 0.0.14 accepts the settings (checked here too).
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from cosmos_primitives import testing as cpt
from cosmos_primitives.data import BadSampleError, MediaSettings, MRopeSpec, Prompt, encode_prompts, load_conversation
from cosmos_primitives.data.mrope import mrope_position_ids
from cosmos_primitives.data.qwen_vl_encoding import encode_conversation
from cosmos_primitives.data.qwen_vl_sizing import (
    frame_indices,
    frame_range,
    image_size,
    smart_nframes,
    video_frame_size,
)

DATA = Path(__file__).parent / "data" / "qwen_vl_media"
MEDIA = DATA / "media"
REFERENCE = json.loads((DATA / "reference.json").read_text())
ITEMS = {item["name"]: item for item in REFERENCE["items"]}
FOLLOWED = "0.0.11"  # the qwen-vl-utils version whose rules the library follows (Cosmos-Reason1's lock)
MODEL_CONFIG = json.loads((Path(__file__).parent / "data" / "qwen2_5_vl_7b_config.json").read_text())
MROPE = MRopeSpec(image_token_id=MODEL_CONFIG["image_token_id"], video_token_id=MODEL_CONFIG["video_token_id"],
                  spatial_merge_size=MODEL_CONFIG["vision_config"]["spatial_merge_size"],
                  tokens_per_second=MODEL_CONFIG["vision_config"]["tokens_per_second"])


def unrle(runs: list[list[int]]) -> list[int]:
    return [value for value, count in runs for _ in range(count)]


def int_digest(values) -> dict:
    array = np.asarray(values, dtype="<i8")
    return {"count": int(array.size), "sha256": hashlib.sha256(array.tobytes()).hexdigest()}


def frames_digest(array: np.ndarray) -> dict:
    array = np.ascontiguousarray(array, dtype=np.uint8)
    return {"shape": list(array.shape), "sha256": hashlib.sha256(array.tobytes()).hexdigest()}


@pytest.fixture(scope="module")
def processor():
    """The Qwen2.5-VL processor the reference used: real Qwen vocabulary, the testing chat template,
    Qwen2.5-VL-7B-Instruct's pixel bounds (3136 .. 12845056)."""
    pre = REFERENCE["preprocessor"]
    return cpt.tiny_qwen2_5_vl_processor(min_pixels=pre["min_pixels"], max_pixels=pre["max_pixels"])


def load(item: dict, settings: MediaSettings | None = None):
    return load_conversation(copy.deepcopy(item["conversation"]), MEDIA, settings or MediaSettings(),
                             sample_id=item["name"])


def test_the_reference_covers_reason1_items_and_0014_agrees_with_0011_where_it_accepts_them() -> None:
    assert REFERENCE["versions"]["qwen-vl-utils"] == ["0.0.11", "0.0.14"]
    names = list(ITEMS)
    assert sum(n.startswith("reason1_rl:") for n in names) >= 16
    assert sum(n.startswith("reason1_sft:") for n in names) == 2
    refused_by_0014 = 0
    for item in ITEMS.values():
        old, new = item["reference"]["0.0.11"], item["reference"]["0.0.14"]
        if "error" in new and "error" not in old:
            # only where Reason1's max_pixels (81920) is under the default video min_pixels (100352)
            assert new["error"].startswith("AssertionError: The max_pixels of image must be greater")
            refused_by_0014 += 1
        else:
            assert new == old, item["name"]
    assert refused_by_0014 >= 10
    # the reference's decoder (torchcodec) and decord gave the same frames to qwen-vl-utils
    decoded = [item["decord_frames_equal"] for item in ITEMS.values() if item["reference"]["0.0.11"].get("frames")]
    assert len(decoded) >= 20 and all(decoded)


def _check_pixels(ours: torch.Tensor, stats: dict) -> None:
    flat = ours.detach().reshape(-1)
    assert list(ours.shape) == stats["shape"]
    assert [float(flat[i]) for i in stats["positions"]] == pytest.approx(stats["values"], abs=2e-5)
    assert float(flat.abs().sum(dtype=torch.float64)) == pytest.approx(stats["abs_sum"], rel=1e-6)


@pytest.mark.parametrize("name", list(ITEMS))
def test_item_equals_cosmos_rl_packer(processor, name: str) -> None:
    """Frames, images, token ids, grids, seconds per grid, mRoPE positions and pixel values (labels
    for SFT items) of one item equal the reference's; an item it refused is a bad sample here."""
    item, reference = ITEMS[name], ITEMS[name]["reference"][FOLLOWED]
    if "error" in reference:
        with pytest.raises(BadSampleError):
            load(item)
        return
    loaded = load(item)
    assert [frames_digest(v) for v in loaded.videos] == [{k: f[k] for k in ("shape", "sha256")}
                                                         for f in reference["frames"]]
    assert loaded.video_fps == pytest.approx([f["sample_fps"] for f in reference["frames"]], rel=1e-12)
    assert [frames_digest(i) for i in loaded.images] == reference["images"]

    if item["kind"] == "sft":
        encoded = encode_conversation(processor, loaded, mrope=MROPE)
        ids, positions = encoded.input_ids, encoded.position_ids
        media = ("video_grid_thw", "image_grid_thw", "second_per_grid_ts", "pixel_values", "pixel_values_videos")
        batch = {k: getattr(encoded, k) for k in media if getattr(encoded, k) is not None}
        # cosmos-rl trains on the assistant's tokens and the <|im_end|> after them, as this library does
        assert encoded.labels.tolist() == unrle(reference["label_ids"])
    else:
        prompt = Prompt(conversation=loaded.conversation, prompt_id=name, images=loaded.images,
                        videos=loaded.videos, video_fps=loaded.video_fps)
        batch = encode_prompts(processor, [prompt])
        ids = batch["input_ids"][0][batch["attention_mask"][0].bool()]
        positions = mrope_position_ids(ids, MROPE, batch.get("image_grid_thw"), batch.get("video_grid_thw"),
                                       batch.get("second_per_grid_ts"))
    assert ids.tolist() == unrle(reference["input_ids"])
    for key in ("video_grid_thw", "image_grid_thw"):
        assert (batch[key].tolist() if key in batch else None) == reference.get(key), key
    if "second_per_grid_ts" in reference:
        assert batch["second_per_grid_ts"].tolist() == pytest.approx(reference["second_per_grid_ts"], rel=1e-6)
    for key in ("pixel_values", "pixel_values_videos"):
        assert (key in batch) == (key in reference), key
        if key in reference:
            _check_pixels(batch[key], reference[key])
    assert int_digest(positions.tolist()) == reference["position_ids"]


@pytest.mark.parametrize("name", [n for n, item in ITEMS.items() if item["reference"][FOLLOWED].get("frames")
                                  and (n.startswith("reason1_rl:") or "video_start" in n)])
def test_pyav_decodes_the_same_frames_as_decord(name: str) -> None:
    reference = ITEMS[name]["reference"][FOLLOWED]
    loaded = load(ITEMS[name], MediaSettings(backend="pyav"))
    assert [frames_digest(v)["sha256"] for v in loaded.videos] == [f["sha256"] for f in reference["frames"]]


def test_qwen3_vl_sized_frames_equal_qwen_vl_utils() -> None:
    cases = REFERENCE["qwen3_vl_frames"]
    assert len(cases) == 6 and all("error" not in c for c in cases)
    for case in cases:
        settings = MediaSettings(patch_size=case["patch_size"])
        video = settings.video(MEDIA / case["video"], {"type": "video", "video": case["video"], **case["keys"]})
        assert frames_digest(video.frames) == {"shape": case["shape"], "sha256": case["sha256"]}, case
        assert video.fps == pytest.approx(case["sample_fps"], rel=1e-12)
        assert video.frames.shape[1] % 32 == 0 and video.frames.shape[2] % 32 == 0


def test_frame_counts_and_indices_equal_qwen_vl_utils_on_random_inputs() -> None:
    cases = REFERENCE["rules"]["frames"]
    assert len(cases) == 400 and 10 < sum("error" in c for c in cases) < 100
    for case in cases:
        keys = dict(case["keys"])
        start, end = keys.pop("video_start", None), keys.pop("video_end", None)
        try:
            first, last, count = frame_range(case["total_frames"], case["video_fps"], start, end)
            n = smart_nframes(count, case["video_fps"], **keys)
        except ValueError:
            assert "error" in case, case
            continue
        assert int_digest(frame_indices(first, last, n)) == case["indices"], case
        assert n / count * case["video_fps"] == pytest.approx(case["sample_fps"], rel=1e-15)


def test_frame_sizes_equal_qwen_vl_utils_on_random_inputs() -> None:
    videos, images = REFERENCE["rules"]["video_sizes"], REFERENCE["rules"]["image_sizes"]
    assert len(videos) == 800 and len(images) == 200
    compared = 0
    for case in videos:
        try:
            size = video_frame_size(case["height"], case["width"], case["num_frames"], factor=case["factor"],
                                    **case["keys"])
        except ValueError:
            size = None
        if case.get("error") == "AssertionError":  # 0.0.14 (factor 32) refuses min_pixels > max_pixels
            continue
        reference = case.get("size")
        if reference and min(reference) == 0:  # qwen-vl-utils asks for a 0-px side, then fails to resize
            reference = None
        assert (list(size) if size else None) == reference, case
        compared += 1
    assert compared > 700
    for case in images:
        try:
            size = image_size(case["height"], case["width"], factor=case["factor"], **case["keys"])
        except ValueError:
            size = None
        if case.get("error") == "AssertionError":
            continue
        assert (list(size) if size else None) == case.get("size"), case
