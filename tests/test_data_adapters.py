"""Dataset adapters (HF conversations, video folder, MCQ prompts) and the bad-sample budget."""

from __future__ import annotations

import functools
import json
import logging
import re
from pathlib import Path

import pytest
import torch

from cosmos_primitives import testing as cpt
from cosmos_primitives.config import DatasetConfig
from cosmos_primitives.data.bad_samples import (
    BadSampleBudgetExceeded,
    BadSampleError,
    BadSampleTracker,
    NoGoodSamplesError,
)
from cosmos_primitives.data.hf_conversations import HFConversationDataset
from cosmos_primitives.data.mcq import MCQPromptDataset, answer_letter, mcq_prompt_text
from cosmos_primitives.data.media import MediaSettings, default_media_dir
from cosmos_primitives.data.mrope import MRopeSpec, mrope_position_ids
from cosmos_primitives.data.qwen_vl_encoding import IGNORE_INDEX, encode_conversation
from cosmos_primitives.data.qwen_vl_sizing import frame_indices, smart_nframes
from cosmos_primitives.data.records import Prompt
from cosmos_primitives.data.sampler import ResumableDistributedSampler
from cosmos_primitives.data.sft_loader import SFTBatchLoader, build_sft_dataset
from cosmos_primitives.data.video_folder import VideoFolderDataset
from cosmos_primitives.testing.tokenizer import IMAGE_PAD_ID, VIDEO_PAD_ID


class _Records(logging.Handler):
    """Collects the library logger's messages (it does not propagate to pytest's caplog)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def cosmos_warnings():
    handler = _Records()
    logger = logging.getLogger("cosmos")
    logger.addHandler(handler)
    yield handler.messages
    logger.removeHandler(handler)


def _video_turn(path: str, text: str, **extra) -> dict:
    return {"role": "user", "content": [{"type": "video", "video": path, **extra}, {"type": "text", "text": text}]}


def _answer(text: str) -> dict:
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


@pytest.fixture(scope="module")
def saved_hf_dataset(tmp_path_factory) -> Path:
    import datasets
    rows = [
        {"id": "a", "conversations": [_video_turn("medium.mp4", "What is shown?"), _answer("A counter.")]},
        {"id": "b", "conversations": [_video_turn("medium.mp4", "Again, faster?", fps=4, max_pixels=28 * 28 * 4),
                                      _answer("Yes.")]},
        {"id": "c", "conversations": [_video_turn("long_hd.mp4", "And this?"), _answer("A bigger counter.")]},
    ]
    path = tmp_path_factory.mktemp("hf") / "sft_dataset"
    datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return path


def test_hf_dataset_resolves_media_and_applies_fps_defaults_and_overrides(saved_hf_dataset, video_clips) -> None:
    clips = video_clips["medium"].parent
    cfg = DatasetConfig(name=str(saved_hf_dataset), media_dir=str(clips), fps=2.0, max_frames=32,
                        max_pixels=28 * 28 * 9, min_pixels=3136)
    ds = build_sft_dataset(cfg)
    assert isinstance(ds, HFConversationDataset) and len(ds) == 3
    first = ds[0]
    video_part = first.conversation[0]["content"][0]
    assert video_part["video"] == str(clips / "medium.mp4")
    # defaults from the config: 30 frames at 10 fps, sampled at 2 fps
    expected = frame_indices(0, 29, smart_nframes(30, 10.0, fps=2.0, max_frames=32))
    assert first.frame_indices == [expected]
    assert [cpt.decode_frame_index(f) for f in first.videos[0]] == expected
    assert first.video_fps == [pytest.approx(len(expected) / 30 * 10.0)]
    assert "fps" not in video_part  # the part is kept as the row gave it: re-reading it takes the same frames
    assert first.videos[0].shape[1] * first.videos[0].shape[2] <= 28 * 28 * 9
    # the part's own fps / max_pixels win over the config
    second = ds[1]
    assert len(second.frame_indices[0]) == smart_nframes(30, 10.0, fps=4.0, max_frames=32) == 12
    assert second.videos[0].shape[1:3] == (56, 56)
    # Arrow's None fields (from other rows' parts) are gone
    assert "fps" not in ds.conversation(0)[0]["content"][0]


def test_hf_dataset_from_jsonl_with_json_conversations(tmp_path, video_clips) -> None:
    clips = video_clips["short"].parent
    lines = [
        {"conversations": json.dumps([{"role": "user", "content": [{"type": "video", "video": "short.mp4"}, "Hi?"]},
                                      {"role": "assistant", "content": "Hello."}])},
        {"conversations": json.dumps([{"role": "user", "content": [{"type": "video", "video": "nope.mp4"}]},
                                      {"role": "assistant", "content": "?"}])},
        {"conversations": json.dumps([{"role": "user", "content": "no answer here"}])},
    ]
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines))
    cfg = DatasetConfig(name=str(path), media_dir=str(clips), system_prompt="Be brief.")
    ds = build_sft_dataset(cfg)
    sample = ds[0]
    assert sample.conversation[0] == {"role": "system", "content": "Be brief."}
    assert sample.conversation[1]["content"][1] == {"type": "text", "text": "Hi?"}
    assert sample.videos[0].shape[0] == 4  # 8 frames at 8 fps = 1 s at 2 fps -> 2, lifted to min_frames 4
    with pytest.raises(BadSampleError, match="not found") as missing:
        ds[1]
    assert missing.value.path == str(clips / "nope.mp4")
    with pytest.raises(BadSampleError, match="no assistant message") as malformed:
        ds[2]
    assert malformed.value.path.endswith("train.jsonl[2]")


@pytest.fixture
def cosmos_cache(tmp_path, monkeypatch) -> Path:
    """cosmos-rl's clip folder for nvidia/Cosmos-Reason1-SFT-Dataset, subset robovqa, clips nested."""
    monkeypatch.setenv("COSMOS_CACHE", str(tmp_path / "cache"))
    clips = tmp_path / "cache" / "datasets" / "nvidia" / "Cosmos-Reason1-SFT-Dataset" / "robovqa" / "video_clips"
    cpt.write_mp4(clips / "part_0" / "clip_a.mp4", num_frames=8, fps=8.0, size=(48, 48))
    cpt.write_mp4(clips / "part_1" / "clip_b.mp4", num_frames=8, fps=8.0, size=(48, 48))
    return clips


def test_cosmos_reason1_sft_rows_get_their_clip_by_name_from_the_cosmos_cache(cosmos_cache) -> None:
    # the Hub rows: a plain-text conversation beside a "video" path from the machine that made them
    rows = [
        {"video": "/data/robovqa/clips/clip_a.mp4",
         "conversations": [{"role": "user", "content": "What does the robot do?"},
                           {"role": "assistant", "content": "It picks up a cup."}]},
        {"video": "clips/missing.mp4",
         "conversations": [{"role": "user", "content": "And here?"}, {"role": "assistant", "content": "?"}]},
    ]
    cfg = DatasetConfig(name="nvidia/Cosmos-Reason1-SFT-Dataset", subset="robovqa", split="understanding")
    media_dir = default_media_dir(cfg)
    assert media_dir == str(cosmos_cache)
    ds = HFConversationDataset(rows, media_dir=media_dir, settings=MediaSettings.from_config(cfg))
    sample = ds[0]
    user = sample.conversation[0]["content"]
    assert user[0]["type"] == "video" and user[0]["video"] == str(cosmos_cache / "part_0" / "clip_a.mp4")
    assert user[1] == {"type": "text", "text": "What does the robot do?"}
    assert len(sample.videos) == 1
    with pytest.raises(BadSampleError, match="not found") as missing:
        ds[1]
    assert missing.value.path == str(cosmos_cache / "clips" / "missing.mp4")


def test_media_dir_defaults(tmp_path, cosmos_cache) -> None:
    assert default_media_dir(DatasetConfig(name="nvidia/Cosmos-Reason1-SFT-Dataset", subset="robovqa",
                                           media_dir="/clips")) == "/clips"  # the config wins
    assert default_media_dir(DatasetConfig(name="nvidia/Cosmos-Reason1-SFT-Dataset", subset="other")) is None
    (tmp_path / "local.jsonl").write_text("")
    assert default_media_dir(DatasetConfig(name=str(tmp_path / "local.jsonl"))) == str(tmp_path)


def test_mcq_rows_find_their_clip_by_name_under_media_dir(cosmos_cache) -> None:
    rows = [{"video": "/elsewhere/clip_b.mp4",
             "qa_pairs": {"question": "Is it moving?", "index2ans": {"A": "yes", "B": "no"}, "answer": "B"}}]
    cfg = DatasetConfig(name="nvidia/Cosmos-Reason1-SFT-Dataset", subset="robovqa",
                        question_column="qa_pairs.question", choices_column="qa_pairs.index2ans",
                        answer_column="qa_pairs.answer")
    prompt = MCQPromptDataset.from_config(cfg, rows=rows)[0]
    assert prompt.conversation[0]["content"][0]["video"] == str(cosmos_cache / "part_1" / "clip_b.mp4")
    assert prompt.reference == "B" and len(prompt.videos) == 1


@pytest.fixture
def video_folder(tmp_path) -> Path:
    root = tmp_path / "clips"
    suffix = ".camera_front_wide_120fov"
    cpt.write_mp4(root / "videos" / f"ep1{suffix}.mp4", num_frames=12, fps=6.0, size=(64, 96))
    cpt.write_mp4(root / "videos" / f"ep2{suffix}.mp4", num_frames=8, fps=4.0, size=(48, 48))
    cpt.write_mp4(root / "videos" / f"unlabelled{suffix}.mp4", num_frames=4, fps=4.0, size=(48, 48))
    (root / "metas").mkdir()
    (root / "metas" / "ep1.label.json").write_text(json.dumps({"caption": "A red car.", "meta": {"weather": "rain"}}))
    (root / "metas" / "ep2.label.json").write_text(json.dumps({"caption": "Empty road.", "meta": {"weather": "sun"}}))
    (root / "metas" / "ep3.label.json").write_text(json.dumps({"caption": "No video for me."}))
    return root


def test_video_folder_whole_json_or_a_field_becomes_the_answer(video_folder, cosmos_warnings) -> None:
    cfg = DatasetConfig(name=str(video_folder), video_suffix=".camera_front_wide_120fov", prompt="Caption it.")
    ds = build_sft_dataset(cfg)
    assert isinstance(ds, VideoFolderDataset) and ds.ids == ["ep1", "ep2", "ep3"]
    assert any("unlabelled" in m for m in cosmos_warnings)
    sample = ds[0]
    user, answer = sample.conversation
    assert user["content"][0]["video"] == str(video_folder / "videos" / "ep1.camera_front_wide_120fov.mp4")
    assert user["content"][1] == {"type": "text", "text": "Caption it."}
    assert json.loads(answer["content"]) == {"caption": "A red car.", "meta": {"weather": "rain"}}
    assert [cpt.decode_frame_index(f) for f in sample.videos[0]] == sample.frame_indices[0]
    by_field = VideoFolderDataset(video_folder, ".camera_front_wide_120fov", label_field="caption")
    assert by_field.conversation(1)[-1]["content"] == "Empty road."
    assert VideoFolderDataset(video_folder, ".camera_front_wide_120fov", "meta.weather").label_text(0) == "rain"
    assert json.loads(VideoFolderDataset(video_folder, ".camera_front_wide_120fov", "meta").label_text(1)) == {
        "weather": "sun"}
    with pytest.raises(BadSampleError, match="no field 'speed'") as no_field:
        VideoFolderDataset(video_folder, ".camera_front_wide_120fov", "speed").label_text(0)
    assert no_field.value.path.endswith("ep1.label.json")
    with pytest.raises(BadSampleError, match="not found"):
        ds[2]


def test_bad_samples_are_skipped_counted_logged_then_fail_past_budget(tiny_vl_processor, video_clips,
                                                                      cosmos_warnings) -> None:
    clips = video_clips["short"].parent
    rows = [{"conversations": [_video_turn(name, "What?"), _answer(f"Clip {i}.")]}
            for i, name in enumerate(["short.mp4", "corrupt.mp4", "medium.mp4", "does_not_exist.mp4", "short.mp4"])]
    settings = MediaSettings(max_pixels=28 * 28 * 4, min_pixels=3136, max_frames=4)
    ds = HFConversationDataset(rows, media_dir=clips, settings=settings, name="rows")
    encode = functools.partial(encode_conversation, tiny_vl_processor, mrope=MRopeSpec(tokens_per_second=4.0))

    def loader(budget: int) -> SFTBatchLoader:
        return SFTBatchLoader(ds, encode, ResumableDistributedSampler(len(ds), shuffle=False), token_budget=4096,
                              pad_token_id=151643, rows_per_batch=1, buffer_size=8,
                              bad_samples=BadSampleTracker(budget))

    ok = loader(budget=2)
    batches = list(ok)
    assert ok.bad_samples.count == 2
    assert {path for path, _, _ in ok.bad_samples.worst()} == {str(clips / "corrupt.mp4"),
                                                               str(clips / "does_not_exist.mp4")}
    assert sum(int((b["labels"] != IGNORE_INDEX).any(dim=1).sum()) for b in batches) == 1  # one packed row
    trained_text = tiny_vl_processor.tokenizer.decode(batches[0]["labels"][batches[0]["labels"] != IGNORE_INDEX])
    assert trained_text.count("<|im_end|>") == 3 and "Clip 1" not in trained_text and "Clip 3" not in trained_text
    logged = "\n".join(cosmos_warnings)
    assert str(clips / "corrupt.mp4") in logged and str(clips / "does_not_exist.mp4") in logged

    with pytest.raises(BadSampleBudgetExceeded) as exceeded:
        list(loader(budget=1))
    message = str(exceeded.value)
    assert "bad_sample_budget" in message and "2 bad samples" in message
    assert str(clips / "corrupt.mp4") in message and "could not decode" in message
    assert str(clips / "does_not_exist.mp4") in message and "not found" in message


@pytest.mark.parametrize("packing", [True, False])
def test_an_epoch_of_only_bad_samples_fails_instead_of_training_nothing(tiny_vl_processor, video_clips,
                                                                       packing: bool) -> None:
    """Within the budget, but nothing to train on: the loader raises once the epoch is used up (the SFT
    recipe would otherwise finish at step 0 with exit code 0)."""
    clips = video_clips["short"].parent
    rows = [{"conversations": [_video_turn(name, "What?"), _answer("Clip.")]}
            for name in ["corrupt.mp4", "does_not_exist.mp4", "corrupt.mp4"]]
    ds = HFConversationDataset(rows, media_dir=clips, settings=MediaSettings(max_frames=4), name="rows")
    encode = functools.partial(encode_conversation, tiny_vl_processor, mrope=MRopeSpec())
    loader = SFTBatchLoader(ds, encode, ResumableDistributedSampler(len(ds), shuffle=False), token_budget=4096,
                            pad_token_id=151643, packing=packing, bad_samples=BadSampleTracker(100))
    assert loader.next_step(2) == []  # a step of bad samples alone: the caller takes the next one
    with pytest.raises(NoGoodSamplesError, match="all 3 samples drawn in epoch 0 were bad") as raised:
        while loader.next_step(2) is not None:
            pass
    assert str(clips / "corrupt.mp4") in str(raised.value) and str(clips / "does_not_exist.mp4") in str(raised.value)
    loader.start_next_epoch()
    with pytest.raises(NoGoodSamplesError, match="epoch 1"):
        list(loader)


def test_tracker_ranks_offenders_and_round_trips() -> None:
    tracker = BadSampleTracker(budget=10, max_listed=2)
    for path, times in (("a.mp4", 1), ("b.mp4", 3), ("c.mp4", 2)):
        for _ in range(times):
            tracker.record(BadSampleError(path, f"broken {path}"))
    assert tracker.worst() == [("b.mp4", 3, "broken b.mp4"), ("c.mp4", 2, "broken c.mp4"), ("a.mp4", 1, "broken a.mp4")]
    report = tracker.report()
    assert "b.mp4 (x3)" in report and "c.mp4 (x2)" in report and "a.mp4" not in report and "1 more" in report
    copy = BadSampleTracker(budget=10)
    copy.load_state_dict(json.loads(json.dumps(tracker.state_dict())))
    assert copy.worst() == tracker.worst() and copy.count == 6


MCQ_EXPECTED = (
    "Which way does the car turn?\n(A) left\n(B) right\n(C) it does not turn\n"
    "Answer with the option's letter from the given choices directly.\n"
    "Please answer the question in the following format: <think> your reasoning </think> <answer> your answer "
    "</answer>."
)


def test_mcq_prompt_text_is_the_cosmos_reason_format() -> None:
    choices = ["left", "right", "it does not turn"]
    assert mcq_prompt_text("Which way does the car turn?", choices) == MCQ_EXPECTED
    assert mcq_prompt_text("Which way does the car turn?", {"A": "left", "B": "right", "C": "it does not turn"}) \
        == MCQ_EXPECTED
    assert mcq_prompt_text("Which way does the car turn?", json.dumps(choices)) == MCQ_EXPECTED


@pytest.mark.parametrize("answer", ["B", "b", "(B)", "B.", " B ", "<answer>B</answer>", 1, "right", "Right"])
def test_answer_letter_forms(answer) -> None:
    assert answer_letter(answer, ["left", "right", "straight"]) == "B"


def test_answer_letter_rejects_unknown_answers() -> None:
    with pytest.raises(BadSampleError, match="not one of the choice letters"):
        answer_letter("D", ["left", "right", "straight"])
    with pytest.raises(BadSampleError, match="outside"):
        answer_letter(5, ["left", "right"])


def test_mcq_dataset_builds_prompts_with_media_reference_and_row(video_clips, color_images) -> None:
    clips = video_clips["medium"].parent
    rows = [
        {"id": "v1", "video": "medium.mp4", "question": "Which way does the car turn?",
         "choices": ["left", "right", "it does not turn"], "answer": "B"},
        {"id": "i1", "image": str(color_images["green"]), "question": "Which colour fills the image?",
         "choices": ["red", "green", "blue", "yellow"], "answer": "green"},
    ]
    ds = MCQPromptDataset(rows, media_dir=clips, settings=MediaSettings(fps=2.0, max_pixels=28 * 28 * 4,
                                                                             min_pixels=3136))
    video = ds[0]
    assert isinstance(video, Prompt) and video.prompt_id == "v1"
    assert video.reference == "B" and video.row == rows[0]
    (message,) = video.conversation
    assert message["role"] == "user" and message["content"][1] == {"type": "text", "text": MCQ_EXPECTED}
    assert message["content"][0]["video"] == str(clips / "medium.mp4")
    assert len(video.videos) == 1 and video.videos[0].shape[0] == 6 and video.images == []
    assert video.video_fps == [pytest.approx(2.0)]
    image = ds[1]
    assert image.reference == "B" and image.videos == [] and image.images[0].shape[2] == 3
    assert image.conversation[0]["content"][0]["type"] == "image"


def test_mcq_dataset_reads_nested_rl_style_rows(video_clips) -> None:
    rows = [{"video": str(video_clips["short"]),
             "qa_pairs": {"question": "Is it moving?", "index2ans": {"A": "yes", "B": "no"}, "answer": "A"}}]
    cfg = DatasetConfig(question_column="qa_pairs.question", choices_column="qa_pairs.index2ans",
                        answer_column="qa_pairs.answer", system_prompt="Think first.")
    prompt = MCQPromptDataset.from_config(cfg, rows=rows)[0]
    assert prompt.reference == "A"
    assert prompt.conversation[0] == {"role": "system", "content": "Think first."}
    assert prompt.conversation[1]["content"][1]["text"].startswith("Is it moving?\n(A) yes\n(B) no\nAnswer with")
    bad = MCQPromptDataset([{"question": "q"}], name="rl")
    with pytest.raises(BadSampleError, match="missing field") as missing:
        bad[0]
    assert missing.value.path == "rl[0]"


def test_system_prompt_unset_empty_or_set_renders_as_cosmos_rl_does(tiny_vl_processor) -> None:
    """Unset: no system message (the Qwen template adds its default); "": an empty system message,
    which is what a cosmos-rl config (whose default is "") sends; a cosmos-rl file gets "" by default."""
    import cosmos_primitives as cp
    from cosmos_primitives.data.prompt_inputs import render_prompt

    rows = [{"question": "Which?", "choices": {"A": "red", "B": "blue"}, "answer": "A"}]
    rendered = {key: render_prompt(tiny_vl_processor, MCQPromptDataset(rows, system_prompt=key)[0])
                for key in (None, "", "Think first.")}
    assert "<|im_start|>system\nYou are a helpful assistant.<|im_end|>" in rendered[None]
    assert rendered[""].startswith("<|im_start|>system\n<|im_end|>\n<|im_start|>user")
    assert "<|im_start|>system\nThink first.<|im_end|>" in rendered["Think first."]
    assert DatasetConfig().system_prompt is None
    reason1 = Path(__file__).parent / "data" / "cosmos_rl_configs" / "cosmos-reason1"
    rl_configs = sorted(reason1.rglob("*rl*.toml"))
    assert rl_configs, "vendored Cosmos-Reason1 RL configs"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = cp.load_config(rl_configs[0])
    assert cfg.train.train_policy.dataset.system_prompt == ""


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_build_sft_loader_from_config_keys(video_folder, family: str, tiny_vl_processor,
                                           tiny_qwen3_vl_processor) -> None:
    """Video SFT from real mp4s on both families: frames sized for the model's patch (28 / 32 px per
    token), positions as the model computes them, and (Qwen3-VL) timestamps of the source frames."""
    import cosmos_primitives as cp
    from cosmos_primitives.data.sft_loader import build_sft_loader

    processor, model_config, patch = {
        "qwen2_5_vl": (tiny_vl_processor, cpt.tiny_qwen2_5_vl_config(), 14),
        "qwen3_vl": (tiny_qwen3_vl_processor, cpt.tiny_qwen3_vl_config(), 16)}[family]
    token_pixels = (2 * patch) ** 2
    config = cp.load_config(overrides=[
        f"train.train_policy.dataset.name={video_folder}",
        "train.train_policy.dataset.video_suffix=.camera_front_wide_120fov",
        "train.train_policy.dataset.label_field=caption",
        f"train.train_policy.dataset.max_pixels={6 * token_pixels}",  # within both tiny processors' bounds
        f"train.train_policy.dataset.min_pixels={6 * token_pixels}",
        "train.train_policy.dataset.bad_sample_budget=1",
        "train.train_policy.packing_budget=512",
        "train.train_policy.mini_batch=2",
    ])
    loader = build_sft_loader(config.train.train_policy, processor, model_config,
                              model_max_length=config.policy.model_max_length, seed=config.train.seed)
    assert loader.dataset.settings.patch_size == patch  # read from the processor
    (batch,) = list(loader)  # two clips fit in one 512-token row; ep3 has no video
    assert loader.bad_samples.count == 1 and loader.token_budget == 512
    assert batch["position_ids"].shape[:2] == (4, 1) and batch["video_grid_thw"].shape == (2, 3)
    text = processor.tokenizer.decode(batch["labels"][batch["labels"] != IGNORE_INDEX])
    assert sorted(text.split("<|im_end|>")[:2]) == ["A red car.", "Empty road."]
    # frames sized at multiples of the model's token side (2 * patch px) and kept so by the processor
    sizes = sorted(list(loader.dataset[i].videos[0].shape[1:3]) for i in range(2))
    assert all(side % (2 * patch) == 0 for size in sizes for side in size)
    assert sorted((batch["video_grid_thw"][:, 1:] * patch).tolist()) == sizes

    # positions: each packed sample's are its own alone; for Qwen3-VL also the model's (transformers'
    # get_rope_index; Qwen2.5-VL's differs after long videos, see cosmos_primitives.data.mrope)
    spec = MRopeSpec.from_config(model_config)
    model = cpt.tiny_qwen3_vl(seed=0).model if family == "qwen3_vl" else None
    ids, positions = batch["input_ids"][0], batch["position_ids"][1:, 0]
    starts = (batch["position_ids"][0, 0] == 0).nonzero().flatten().tolist()
    ends = [*starts[1:], int((batch["labels"][0] != IGNORE_INDEX).nonzero().max()) + 1]
    assert len(starts) == 2
    for k, (start, stop) in enumerate(zip(starts, ends)):
        sample, grid = ids[start:stop], batch["video_grid_thw"][k:k + 1]
        seconds = batch["second_per_grid_ts"][k:k + 1] if family == "qwen2_5_vl" else None
        alone = mrope_position_ids(sample, spec, video_grid_thw=grid, second_per_grid_ts=seconds)
        assert torch.equal(positions[:, start:stop], alone)
        if model is not None:
            types = (sample == IMAGE_PAD_ID).long() + 2 * (sample == VIDEO_PAD_ID).long()
            theirs, _ = model.get_rope_index(sample[None], types[None], video_grid_thw=grid)
            assert torch.equal(alone, theirs[:, 0])
    if family == "qwen3_vl":
        # <t seconds> of each temporal patch: the mean time of its two source frames (index / source fps)
        per_clip = []
        for clip in range(2):
            meta = loader.dataset[clip].video_metadata[0]
            assert meta["fps"] == (6.0, 4.0)[clip]  # the file's rate, not the sampling rate
            pairs = zip(meta["frames_indices"][::2], meta["frames_indices"][1::2])
            per_clip.append([f"{(a + b) / 2 / meta['fps']:.1f}" for a, b in pairs])
        found = re.findall(r"<(\d+\.\d) seconds>", processor.tokenizer.decode(ids))
        assert found in (per_clip[0] + per_clip[1], per_clip[1] + per_clip[0])


@pytest.mark.parametrize("datasets_installed", [True, False])
@pytest.mark.parametrize(("line", "why"), [(b'{"conversations": "[]"', "not a JSON object"),
                                           (b'{"conversations": "\xff\xfe"}', "not UTF-8")])
def test_a_broken_jsonl_line_names_the_file_and_line(tmp_path, monkeypatch, datasets_installed, line, why) -> None:
    from cosmos_primitives.data import hf_conversations
    from cosmos_primitives.data.hf_conversations import load_hf_dataset

    if not datasets_installed:
        monkeypatch.setattr(hf_conversations, "_has_module", lambda name: False)
    path = tmp_path / "train.jsonl"
    good = json.dumps({"conversations": "[]"}).encode()
    path.write_bytes(b"\n".join([good, good, line, good]) + b"\n")
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}:3: {why}"):
        load_hf_dataset(str(path))


def test_a_non_utf8_benchmark_line_names_the_file_and_line(tmp_path) -> None:
    from cosmos_primitives.eval.benchmark import BenchmarkFormatError, read_benchmark_rows

    path = tmp_path / "bench.jsonl"
    path.write_bytes(b'{"question": "a"}\n{"question": "\xe9t\xe9"}\n')
    with pytest.raises(BenchmarkFormatError, match=rf"{re.escape(str(path))} line 2: not UTF-8"):
        read_benchmark_rows(path)
