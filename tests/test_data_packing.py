"""Qwen-VL encoding (assistant-only labels, mRoPE) and sequence packing without cross-sample attention, for
both families (Qwen2.5-VL, Qwen3-VL: the VL tests run once per family)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from cosmos_primitives import testing as cpt
from cosmos_primitives.data.mrope import MRopeSpec, mrope_position_ids
from cosmos_primitives.data.packing import collate_packed, collate_padded, model_inputs, padding_stats, plan_rows
from cosmos_primitives.data.qwen_vl_encoding import IGNORE_INDEX, encode_conversation
from cosmos_primitives.testing.tokenizer import IMAGE_PAD_ID, VIDEO_PAD_ID, VISION_START_ID

PAD = 151643


FAMILIES = {"qwen2_5_vl": (cpt.tiny_qwen2_5_vl, cpt.tiny_qwen2_5_vl_processor),
            "qwen3_vl": (cpt.tiny_qwen3_vl, cpt.tiny_qwen3_vl_processor)}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def vl_model(family):
    return FAMILIES[family][0](seed=0).eval()


@pytest.fixture(scope="module")
def vl_processor(family):
    return FAMILIES[family][1]()


@pytest.fixture(scope="module")
def spec(vl_model) -> MRopeSpec:
    return MRopeSpec.from_config(vl_model.config)


def _video(num_frames: int, size=(56, 84)) -> np.ndarray:
    return np.stack([cpt.frame_index_pattern(i, size) for i in range(num_frames)])


VIDEO_CONV = [
    {"role": "system", "content": "You watch driving videos."},
    {"role": "user", "content": [{"type": "video", "video": "clip.mp4"}, {"type": "text", "text": "What happens?"}]},
    {"role": "assistant", "content": "A car turns left."},
    {"role": "user", "content": "And then?"},
    {"role": "assistant", "content": "It stops."},
]
IMAGE_CONV = [
    {"role": "user", "content": [{"type": "image", "image": "red.png"}, {"type": "text", "text": "Which colour?"}]},
    {"role": "assistant", "content": "<think>It is red.</think>\n\n<answer>A</answer>"},
]
TEXT_CONV = [
    {"role": "user", "content": "Say hello."},
    {"role": "assistant", "content": "Hello! Nice to meet you."},
]


@pytest.fixture(scope="module")
def samples(vl_processor, spec):
    return [
        encode_conversation(vl_processor, VIDEO_CONV, mrope=spec, videos=[_video(6)], video_fps=[2.0]),
        encode_conversation(vl_processor, IMAGE_CONV, mrope=spec, images=[cpt.color_image("red")]),
        encode_conversation(vl_processor, TEXT_CONV, mrope=spec),
    ]


def test_labels_cover_exactly_assistant_content_and_im_end(samples, vl_processor) -> None:
    tok = vl_processor.tokenizer
    video = samples[0]
    trained = video.labels != IGNORE_INDEX
    assert torch.equal(video.labels[trained], video.input_ids[trained])
    # every assistant turn is labelled, nothing else (system, user, headers, vision tokens)
    assert tok.decode(video.input_ids[trained]) == "A car turns left.<|im_end|>It stops.<|im_end|>"
    assert not trained[video.input_ids == VIDEO_PAD_ID].any()
    # the labelled spans are contiguous runs that each end on <|im_end|>
    runs = torch.nonzero(torch.diff(trained.int()) != 0).flatten().tolist()
    assert len(runs) == 4
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert video.input_ids[runs[1]] == im_end and video.input_ids[runs[3]] == im_end
    # the token after each labelled <|im_end|> (the template's newline) is not trained
    assert not trained[runs[1] + 1] and not trained[runs[3] + 1]
    image = samples[1]
    assert tok.decode(image.input_ids[image.labels != IGNORE_INDEX]) == IMAGE_CONV[1]["content"] + "<|im_end|>"
    assert not (image.labels[image.input_ids == IMAGE_PAD_ID] != IGNORE_INDEX).any()


def test_media_tensors_match_vision_tokens(samples, family) -> None:
    video, image, text = samples
    assert int((video.input_ids == VIDEO_PAD_ID).sum()) == int(video.video_grid_thw.prod()) // 4
    assert video.video_grid_thw[0, 0] == 3  # 6 frames -> 3 temporal patches
    if family == "qwen2_5_vl":
        assert video.second_per_grid_ts.tolist() == [1.0]  # 2 frames per patch at 2 fps
    else:  # Qwen3-VL times frames by text: one block per temporal patch, no seconds tensor
        assert video.second_per_grid_ts is None
        assert int((video.input_ids == VISION_START_ID).sum()) >= 3
    assert int((image.input_ids == IMAGE_PAD_ID).sum()) == int(image.image_grid_thw.prod()) // 4
    assert text.pixel_values is None and text.pixel_values_videos is None
    assert video.position_ids.shape == (3, len(video))


def test_mrope_matches_transformers_where_the_rules_agree(vl_model, vl_processor, spec) -> None:
    for conv, media in ((IMAGE_CONV, {"images": [cpt.color_image("blue", (84, 112))]}),
                        (VIDEO_CONV, {"videos": [_video(4, (112, 112))]}),
                        (IMAGE_CONV + VIDEO_CONV[1:], {"images": [cpt.color_image("red")],
                                                       "videos": [_video(6, (64, 96))]})):
        text = vl_processor.apply_chat_template(conv, tokenize=False)
        # at 8 fps a temporal patch is 0.25 s: temporal positions stay below the 4x4 spatial extent
        frames = len(media["videos"][0]) if "videos" in media else 0
        kwargs = {"video_metadata": [{"fps": 8.0, "total_num_frames": frames, "frames_indices": list(range(frames)),
                                      }], "do_sample_frames": False}
        out = vl_processor(text=[text], return_tensors="pt", videos_kwargs=kwargs, **media)
        ours = mrope_position_ids(out["input_ids"][0], spec, out.get("image_grid_thw"), out.get("video_grid_thw"),
                                  out.get("second_per_grid_ts"))
        theirs, _ = vl_model.model.get_rope_index(
            out["input_ids"], out["mm_token_type_ids"], image_grid_thw=out.get("image_grid_thw"),
            video_grid_thw=out.get("video_grid_thw"), second_per_grid_ts=out.get("second_per_grid_ts"))
        assert torch.equal(ours, theirs[:, 0])


def test_mrope_text_after_a_long_video_resumes_after_its_last_temporal_position() -> None:
    spec = MRopeSpec(tokens_per_second=2.0)
    v = spec.video_token_id
    # 2 text tokens, a video of 3 temporal patches x 1x1 merged tokens (grid 3x2x2), 1 s per patch, 2 text tokens
    ids = torch.tensor([7, 8, v, v, v, 9, 10])
    grid, seconds = torch.tensor([[3, 2, 2]]), torch.tensor([1.0])
    pos = mrope_position_ids(ids, spec, video_grid_thw=grid, second_per_grid_ts=seconds)
    assert pos[0].tolist() == [0, 1, 2, 4, 6, 7, 8]  # temporal: 2 + i * (2 tokens/s * 1 s), then max + 1
    assert pos[1].tolist() == [0, 1, 2, 2, 2, 7, 8]
    with pytest.raises(ValueError, match="grids"):
        mrope_position_ids(ids, spec)


def test_plan_rows_fills_rows_within_budget_and_places_every_sample_once() -> None:
    lengths = [50, 10, 90, 30, 60, 5, 100, 40]
    rows = plan_rows(lengths, budget=100)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in row) <= 100 for row in rows)
    assert [row[0] for row in rows] == sorted(row[0] for row in rows)  # each row starts with the oldest left
    # row 0: the oldest (50), then the longest that still fit: 40 (room 10), then 10
    assert rows == [[0, 7, 1], [2, 5], [3, 4], [6]]  # 385 tokens in 4 rows of 100: as few as possible


def test_plan_rows_rejects_a_sample_over_budget() -> None:
    with pytest.raises(ValueError, match="sample 1 has 120 tokens"):
        plan_rows([10, 120], budget=100)


def test_collate_packed_layout(samples, family) -> None:
    video, image, text = samples
    batch = collate_packed([[video, image], [text]], PAD)
    timed = {"second_per_grid_ts"} if family == "qwen2_5_vl" else set()  # Qwen3-VL: timestamps are text
    assert set(batch) == {"input_ids", "labels", "position_ids", "pixel_values", "image_grid_thw",
                          "pixel_values_videos", "video_grid_thw", *timed}
    width = len(video) + len(image)
    assert batch["input_ids"].shape == (2, width) and batch["position_ids"].shape == (4, 2, width)
    text_pos = batch["position_ids"][0]
    assert text_pos[0, len(video)] == 0 and text_pos[1, len(text)] == 0  # restart per sample and in the tail
    assert torch.equal(batch["position_ids"][1:, 0, :len(video)], video.position_ids)
    # the first label of every sample is masked (HF's shift would predict it from the previous sample)
    assert batch["labels"][0, len(video)] == IGNORE_INDEX
    assert (batch["labels"][1, len(text):] == IGNORE_INDEX).all()
    assert (batch["input_ids"][1, len(text):] == PAD).all()
    assert padding_stats(batch, PAD) == (len(video) + len(image) + len(text), 2 * width)


@pytest.fixture(scope="module")
def alone(vl_model, samples) -> list[torch.Tensor]:
    """Each sample's logits ``[L, vocab]`` when it is the only sequence in the batch."""
    with torch.no_grad():
        return [vl_model(**model_inputs(collate_padded([s], PAD))).logits[0] for s in samples]


def test_packed_rows_give_the_same_logits_as_each_sample_alone(vl_model, samples, alone) -> None:
    video, image, text = samples
    rows = [[video, image, text], [text, image]]
    batch = collate_packed(rows, PAD, pad_to=len(video) + len(image) + len(text) + 7)
    with torch.no_grad():
        packed = vl_model(**model_inputs(batch)).logits
    by_sample = {id(s): a for s, a in zip(samples, alone)}
    for b, row in enumerate(rows):
        offset = 0
        for s in row:
            torch.testing.assert_close(packed[b, offset:offset + len(s)], by_sample[id(s)], atol=1e-5, rtol=1e-5)
            offset += len(s)
    # the same row with a plain all-ones attention mask lets samples see each other: the check above has teeth
    leaky = dict(model_inputs(batch), attention_mask=torch.ones_like(batch["input_ids"]))
    with torch.no_grad():
        mixed = vl_model(**leaky).logits
    assert (mixed[0, len(video):len(video) + len(image)] - alone[1]).abs().max() > 1e-2


def test_padded_batch_gives_the_same_logits_as_each_sample_alone(vl_model, samples, alone) -> None:
    batch = collate_padded(samples, PAD)
    assert batch["attention_mask"].sum(1).tolist() == [len(s) for s in samples]
    assert batch["position_ids"].shape == (3, 3, max(len(s) for s in samples))
    with torch.no_grad():
        padded = vl_model(**model_inputs(batch)).logits
    for b, s in enumerate(samples):
        torch.testing.assert_close(padded[b, :len(s)], alone[b], atol=1e-5, rtol=1e-5)


def test_text_model_packing_isolates_samples(qwen_tokenizer) -> None:
    model = cpt.tiny_qwen2(seed=1).eval()
    convs = [TEXT_CONV, [{"role": "user", "content": "Count to three."}, {"role": "assistant", "content": "1 2 3"}],
             [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
              {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Goodbye."}]]
    samples = [encode_conversation(qwen_tokenizer, c) for c in convs]
    assert samples[2].position_ids.shape == (len(samples[2]),)
    assert qwen_tokenizer.decode(samples[2].input_ids[samples[2].labels != IGNORE_INDEX]) == \
        "Hello.<|im_end|>Goodbye.<|im_end|>"
    batch = collate_packed([samples], PAD, pad_to=sum(len(s) for s in samples) + 3)
    assert batch["position_ids"].shape == batch["input_ids"].shape
    with torch.no_grad():
        packed = model(**model_inputs(batch)).logits[0]
        offset = 0
        for s in samples:
            alone = model(**model_inputs(collate_padded([s], PAD))).logits[0]
            torch.testing.assert_close(packed[offset:offset + len(s)], alone, atol=1e-5, rtol=1e-5)
            offset += len(s)


def test_media_for_a_text_tokenizer_is_refused(qwen_tokenizer) -> None:
    with pytest.raises(ValueError, match="processor"):
        encode_conversation(qwen_tokenizer, IMAGE_CONV)


@pytest.mark.gpu
@pytest.mark.parametrize("attn", ["sdpa", "flash_attention_2"])
def test_packed_rows_are_isolated_on_gpu(samples, family, attn: str) -> None:
    """Flash-attention finds the samples from the text position row; it needs one packed row (B == 1)."""
    if attn == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        pytest.skip("flash-attn is not installed on this GPU machine")
    dtype = torch.bfloat16 if attn == "flash_attention_2" else torch.float32
    model = FAMILIES[family][0](seed=0).to("cuda", dtype).eval()
    model.set_attn_implementation(attn)

    def run(batch: dict) -> torch.Tensor:
        with torch.no_grad():
            return model(**{k: (v.to("cuda") if torch.is_tensor(v) else v) for k, v in model_inputs(batch).items()}
                         ).logits[0].float().cpu()

    packed = run(collate_packed([samples], PAD, pad_to=sum(len(s) for s in samples) + 5))
    tolerance = 1e-5 if dtype == torch.float32 else 5e-2
    offset = 0
    for s in samples:
        alone = run(collate_padded([s], PAD))
        torch.testing.assert_close(packed[offset:offset + len(s)], alone, atol=tolerance, rtol=tolerance)
        offset += len(s)
