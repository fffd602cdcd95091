"""Hostile media in the SFT / GRPO loaders: whatever one sample's files raise (a decompression bomb,
an aspect ratio the processor refuses, a symlink loop, a malformed row, a failing encode) makes it a
counted bad sample naming the file; the good samples still train; the budget still stops the run."""

from __future__ import annotations

import functools
import json
import os
import struct
import zlib
from pathlib import Path

import pytest
from PIL import Image

from cosmos_primitives import testing as cpt

# through the package: importing the submodule first would shadow the function with the module
from cosmos_primitives.data import prompt_stream
from cosmos_primitives.data.bad_samples import BadSampleBudgetExceeded, BadSampleError, BadSampleTracker
from cosmos_primitives.data.hf_conversations import HFConversationDataset
from cosmos_primitives.data.media import MediaSettings, load_image
from cosmos_primitives.data.mrope import MRopeSpec
from cosmos_primitives.data.qwen_vl_encoding import IGNORE_INDEX, encode_conversation
from cosmos_primitives.data.sampler import ResumableDistributedSampler
from cosmos_primitives.data.sft_loader import SFTBatchLoader
from cosmos_primitives.data.video_folder import VideoFolderDataset

SETTINGS = MediaSettings(max_pixels=28 * 28 * 4, min_pixels=3136, max_frames=4)


def write_png_declaring(path: Path, width: int, height: int) -> Path:
    """A small real PNG whose header declares ``width x height`` (PIL checks the declared size at open)."""
    Image.new("RGB", (8, 8), (200, 10, 10)).save(path)
    raw = path.read_bytes()
    length = struct.unpack(">I", raw[8:12])[0]  # the IHDR chunk follows the 8-byte signature
    header = bytearray(raw[16:16 + length])
    header[0:8] = struct.pack(">II", width, height)
    crc = struct.pack(">I", zlib.crc32(b"IHDR" + bytes(header)) & 0xFFFFFFFF)
    path.write_bytes(raw[:16] + bytes(header) + crc + raw[16 + length + 4:])
    return path


@pytest.fixture(scope="module")
def hostile_media(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hostile")
    Image.new("RGB", (56, 56), (20, 120, 200)).save(root / "good.png")
    write_png_declaring(root / "bomb.png", 40_000, 40_000)  # 1.6 G pixels: PIL's DecompressionBombError
    Image.new("RGB", (20_000, 1), (90, 90, 90)).save(root / "wide.png")
    Image.new("RGB", (1, 20_000), (90, 90, 90)).save(root / "tall.png")
    (root / "truncated.png").write_bytes((root / "good.png").read_bytes()[:60])
    cpt.write_mp4(root / "good.mp4", num_frames=8, fps=8.0, size=(48, 64))
    os.symlink(root / "loop.mp4", root / "loop.mp4")  # a symlink to itself
    return root


def _row(kind: str, name: str, answer: str) -> dict:
    return {"conversations": [{"role": "user", "content": [{"type": kind, kind: name}, {"type": "text", "text": "?"}]},
                              {"role": "assistant", "content": answer}]}


def _loader(dataset, processor, budget: int, encode=None) -> SFTBatchLoader:
    encode = encode or functools.partial(encode_conversation, processor, mrope=MRopeSpec(tokens_per_second=4.0))
    return SFTBatchLoader(dataset, encode, ResumableDistributedSampler(len(dataset), shuffle=False),
                          token_budget=4096, pad_token_id=151643, rows_per_batch=1, buffer_size=16,
                          bad_samples=BadSampleTracker(budget))


def _trained_text(batches, processor) -> str:
    return "".join(processor.tokenizer.decode(b["labels"][b["labels"] != IGNORE_INDEX]) for b in batches)


def test_loader_skips_and_names_every_hostile_image_and_video(hostile_media, tiny_vl_processor) -> None:
    root = hostile_media
    rows = [_row("image", "good.png", "Good image."), _row("image", "bomb.png", "Bomb."),
            _row("image", "wide.png", "Wide."), _row("image", "tall.png", "Tall."),
            _row("image", "truncated.png", "Truncated."), _row("video", "loop.mp4", "Loop."),
            _row("video", "good.mp4", "Good video.")]
    ds = HFConversationDataset(rows, media_dir=root, settings=SETTINGS, name="rows")
    loader = _loader(ds, tiny_vl_processor, budget=5)
    batches = list(loader)
    reasons = {path: reason for path, _, reason in loader.bad_samples.worst()}
    assert loader.bad_samples.count == 5
    assert set(reasons) == {str(root / n) for n in ("bomb.png", "wide.png", "tall.png", "truncated.png", "loop.mp4")}
    assert "DecompressionBombError" in reasons[str(root / "bomb.png")]
    # refused before the processor, with our reason (the processor's names no file)
    assert "extreme aspect ratio: 1x20000" in reasons[str(root / "wide.png")]
    assert "extreme aspect ratio: 20000x1" in reasons[str(root / "tall.png")]
    assert "could not read image" in reasons[str(root / "truncated.png")]
    assert "Symlink loop" in reasons[str(root / "loop.mp4")]
    trained = _trained_text(batches, tiny_vl_processor)
    assert "Good image." in trained and "Good video." in trained
    assert not any(word in trained for word in ("Bomb", "Wide", "Tall", "Truncated", "Loop"))

    with pytest.raises(BadSampleBudgetExceeded, match=r"bomb\.png"):
        list(_loader(ds, tiny_vl_processor, budget=4))


def test_load_image_without_a_pixel_budget_still_refuses_extreme_aspect_ratios(hostile_media) -> None:
    with pytest.raises(BadSampleError, match="extreme aspect ratio") as refused:
        load_image(hostile_media / "wide.png")
    assert refused.value.path == str(hostile_media / "wide.png")
    assert load_image(hostile_media / "good.png").shape == (56, 56, 3)


def test_symlink_loop_in_a_video_folder_is_a_bad_sample(tmp_path, tiny_vl_processor) -> None:
    (tmp_path / "videos").mkdir()
    (tmp_path / "metas").mkdir()
    cpt.write_mp4(tmp_path / "videos" / "ok.mp4", num_frames=8, fps=8.0, size=(48, 64))
    os.symlink(tmp_path / "videos" / "loop.mp4", tmp_path / "videos" / "loop.mp4")
    for name in ("ok", "loop"):
        (tmp_path / "metas" / f"{name}.label.json").write_text(json.dumps(f"Clip {name}."))
    ds = VideoFolderDataset(tmp_path, settings=SETTINGS)
    loader = _loader(ds, tiny_vl_processor, budget=1)
    batches = list(loader)
    assert loader.bad_samples.count == 1
    (path, _, reason), = loader.bad_samples.worst()
    assert path == str(tmp_path / "videos" / "loop.mp4") and "Symlink loop" in reason
    assert "Clip ok." in _trained_text(batches, tiny_vl_processor)


def test_any_error_of_a_row_or_of_encoding_is_a_bad_sample_naming_it(hostile_media, tiny_vl_processor) -> None:
    rows = [_row("image", "good.png", "First."), {"no_conversation": 1}, _row("video", "good.mp4", "Second.")]
    ds = HFConversationDataset(rows, media_dir=hostile_media, settings=SETTINGS, name="rows")
    plain = functools.partial(encode_conversation, tiny_vl_processor, mrope=MRopeSpec(tokens_per_second=4.0))

    def encode(sample):
        if sample.videos:  # a processor error that names no file
            raise ValueError("absolute aspect ratio must be smaller than 200")
        return plain(sample)

    loader = _loader(ds, tiny_vl_processor, budget=2, encode=encode)
    batches = list(loader)
    reasons = {path: reason for path, _, reason in loader.bad_samples.worst()}
    assert set(reasons) == {"rows[1]", str(hostile_media / "good.mp4")}
    assert reasons["rows[1]"].startswith("KeyError")
    assert reasons[str(hostile_media / "good.mp4")].startswith("could not encode: ValueError: absolute aspect")
    assert "First." in _trained_text(batches, tiny_vl_processor)


class _Flaky:
    """Rows 1 and 3 raise errors no loader lists; the others are their index."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        if index == 1:
            raise RuntimeError("Symlink loop from '/data/x.mp4'")
        if index == 3:
            raise MemoryError("cannot allocate the decoded image")
        return index


def test_prompt_stream_skips_any_failing_row_and_stops_on_an_all_bad_epoch() -> None:
    bad = BadSampleTracker(budget=-1)
    stream = prompt_stream(_Flaky(), ResumableDistributedSampler(4, shuffle=False), bad)
    assert [next(stream) for _ in range(4)] == [0, 2, 0, 2]
    assert bad.count == 3 and {p for p, _, _ in bad.worst()} == {"sample 1", "sample 3"}  # 1, 3, then 1 again

    class AllBad(_Flaky):
        def __getitem__(self, index: int) -> int:
            raise OSError(f"row {index} unreadable")

    with pytest.raises(BadSampleBudgetExceeded, match="every sample of epoch 0 was bad"):
        next(prompt_stream(AllBad(), ResumableDistributedSampler(4, shuffle=False), BadSampleTracker(budget=-1)))


def test_mcq_prompts_name_the_hostile_file_or_row(hostile_media) -> None:
    from cosmos_primitives.data.mcq import MCQPromptDataset

    rows = [{"question": "Colour?", "choices": ["red", "blue"], "answer": "A", "image": name}
            for name in ("good.png", "bomb.png", "wide.png")] + [None]  # a row that is not a mapping
    ds = MCQPromptDataset(rows, media_dir=hostile_media, settings=SETTINGS, name="rl")
    assert ds[0].images[0].shape[-1] == 3 and ds[0].reference == "A"
    for index, where, reason in ((1, str(hostile_media / "bomb.png"), "DecompressionBombError"),
                                 (2, str(hostile_media / "wide.png"), "extreme aspect ratio"),
                                 (3, "rl[3]", "TypeError")):
        with pytest.raises(BadSampleError, match=reason) as bad:
            ds[index]
        assert bad.value.path == where


@pytest.mark.slow
def test_sft_example_trains_through_hostile_media_and_reports_it(hostile_media, tiny_vl_dir, tmp_path) -> None:
    from cosmos_primitives.logging import metric_series, read_metrics
    from cosmos_primitives.testing.recipe_runs import finish, launch_recipe

    repo = Path(__file__).resolve().parents[1]
    names = [("image", "good.png"), ("image", "bomb.png"), ("video", "good.mp4"), ("image", "wide.png"),
             ("video", "loop.mp4"), ("image", "good.png")]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(_row(kind, name, f"Answer {i}.")) + "\n"
                            for i, (kind, name) in enumerate(names)))
    config = tmp_path / "sft_hostile.toml"
    config.write_text(f"""
[policy]
model_name_or_path = "{tiny_vl_dir}"
model_max_length = 1024
dtype = "float32"
[train]
epoch = 1
output_dir = "{tmp_path / 'runs'}"
train_batch_per_replica = 2
[train.train_policy]
type = "sft"
packing_budget = 1024
[train.train_policy.dataset]
name = "{data}"
kind = "hf"
media_dir = "{hostile_media}"
max_frames = 4
max_pixels = 3136
min_pixels = 3136
bad_sample_budget = 3
[train.ckpt]
enable_checkpoint = false
[logging]
logger = ["console"]
""")
    log = tmp_path / "sft.log"
    text = finish(launch_recipe("examples/sft.py", config, [], log, cwd=repo, env={"OMP_NUM_THREADS": "1"}), log)
    run_dir = next((tmp_path / "runs").iterdir())
    steps, bad = metric_series(read_metrics(run_dir), "bad_samples")
    assert steps == [1, 2, 3] and bad[-1] == 3
    for name in ("bomb.png", "wide.png", "loop.mp4"):
        assert f"{hostile_media / name}: " in text
