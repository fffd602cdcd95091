"""Rollout groups -> training batch: layout, masks, media, and log-probs that match the engine's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cosmos_primitives import testing as cpt
from cosmos_primitives.data.records import Prompt, SamplingParams
from cosmos_primitives.data.rollout_batch import collate_rollouts
from cosmos_primitives.policy import CausalLMPolicy, token_logprobs
from cosmos_primitives.rollout.hf_engine import HFRolloutEngine


@pytest.fixture
def tiny_vl_model(family_vl_model):
    """Every VL test of this module runs on both families (Qwen2.5-VL, Qwen3-VL)."""
    return family_vl_model


@pytest.fixture
def tiny_vl_processor(family_vl_processor):
    return family_vl_processor


def prompts() -> list[Prompt]:
    out = []
    for i, colour in enumerate(("red", "blue", "green")):
        text = "Which colour?" + " Look closely." * i  # different prompt lengths
        conv = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
        out.append(Prompt(conversation=conv, prompt_id=f"p{i}", images=[cpt.color_image(colour, size=(56, 84))]))
    return out


def test_batch_layout_and_logprobs_match_engine(tiny_vl_model, tiny_vl_processor) -> None:
    engine = HFRolloutEngine(tiny_vl_model, tiny_vl_processor, weight_version=2)
    groups = engine.generate(prompts(), SamplingParams(num_samples_per_prompt=2, temperature=1.0,
                                                       max_response_length=5, seed=0))
    batch = collate_rollouts(groups, tiny_vl_processor)
    assert len(batch) == 6
    assert batch.group_index.tolist() == [0, 0, 1, 1, 2, 2]
    assert batch.weight_versions.tolist() == [2] * 6
    assert batch.inputs["image_grid_thw"].shape[0] == 6
    for i, (grp, c) in enumerate((g, c) for g in groups for c in g.completions):
        ids = batch.inputs["input_ids"][i]
        length = len(grp.prompt_token_ids) + len(c.token_ids)
        assert ids[:length].tolist() == grp.prompt_token_ids + c.token_ids
        assert batch.inputs["attention_mask"][i].sum() == length
        assert batch.completion_mask[i].sum() == len(c.token_ids)
        assert batch.completion_mask[i, len(grp.prompt_token_ids)] == 1
    # teacher-forced log-probs of the batch equal what the engine sampled with
    with torch.no_grad():
        logits = tiny_vl_model(**batch.inputs).logits.float()
    logprobs = torch.zeros_like(batch.completion_mask)
    logprobs[:, 1:] = torch.log_softmax(logits[:, :-1], -1).gather(-1, batch.inputs["input_ids"][:, 1:, None])[..., 0]
    mask = batch.completion_mask.bool()
    torch.testing.assert_close(logprobs[mask], batch.rollout_logprobs[mask], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("wrap", [True, False], ids=["policy", "hf_model"])
def test_trainer_logprobs_match_the_engine_at_its_sampling_temperature(tiny_vl_model, tiny_vl_processor,
                                                                        wrap: bool) -> None:
    """What GRPO trains on: ``cp.policy.token_logprobs`` at the rollout temperature equals the engine's
    log-probs of the sampled tokens (at the first update the policy ratio is exactly 1)."""
    engine = HFRolloutEngine(tiny_vl_model, tiny_vl_processor)
    groups = engine.generate(prompts(), SamplingParams(num_samples_per_prompt=2, temperature=0.7,
                                                       max_response_length=6, seed=3))
    batch = collate_rollouts(groups, tiny_vl_processor)
    model = CausalLMPolicy(tiny_vl_model) if wrap else tiny_vl_model
    mask = batch.completion_mask.bool()
    with torch.no_grad():
        at_t = token_logprobs(model, batch.inputs, mask=batch.completion_mask, temperature=0.7).logprobs
        at_one = token_logprobs(model, batch.inputs, mask=batch.completion_mask).logprobs
    torch.testing.assert_close(at_t[mask], batch.rollout_logprobs[mask], atol=1e-4, rtol=1e-4)
    assert (at_one[mask] - batch.rollout_logprobs[mask]).abs().max() > 1e-2  # the temperature is not a no-op


def test_mismatched_processor_is_named(tiny_vl_model, tiny_vl_processor) -> None:
    engine = HFRolloutEngine(tiny_vl_model, tiny_vl_processor)
    groups = engine.generate(prompts()[:1], SamplingParams(num_samples_per_prompt=1, max_response_length=2, seed=0))
    groups[0].prompt_token_ids = groups[0].prompt_token_ids[1:]
    with pytest.raises(ValueError, match="prompt 'p0': re-encoding"):
        collate_rollouts(groups, tiny_vl_processor)


def test_text_only_groups(tiny_qwen2_model, qwen_tokenizer) -> None:
    engine = HFRolloutEngine(tiny_qwen2_model, qwen_tokenizer)
    ps = [Prompt(conversation=[{"role": "user", "content": "hi" * (i + 1)}], prompt_id=str(i)) for i in range(2)]
    groups = engine.generate(ps, SamplingParams(num_samples_per_prompt=3, max_response_length=4, seed=1))
    batch = collate_rollouts(groups, qwen_tokenizer)
    assert set(batch.inputs) == {"input_ids", "attention_mask"}
    assert batch.completion_mask.sum() == sum(len(c.token_ids) for g in groups for c in g.completions)


def test_rows_cut_the_media_of_rows_with_different_numbers_of_blocks(tiny_vl_model, tiny_vl_processor,
                                                                     vl_family) -> None:
    """Micro-batches of any row range see exactly their own media: log-probs of ``batch.rows(r)``
    equal those rows of the whole batch, for prompts with 0, 1 or 2 images and one with a video."""
    frames = np.stack([cpt.frame_index_pattern(i, (56, 56)) for i in range(4)])
    ask, image = {"type": "text", "text": "Which colour?"}, {"type": "image"}
    prompts = [
        Prompt(conversation=[{"role": "user", "content": [ask]}], prompt_id="text"),
        Prompt(conversation=[{"role": "user", "content": [image, ask]}], prompt_id="one",
               images=[cpt.color_image("red", size=(56, 84))]),
        Prompt(conversation=[{"role": "user", "content": [image, image, ask]}], prompt_id="two",
               images=[cpt.color_image("blue", size=(56, 56)), cpt.color_image("green", size=(84, 56))]),
        Prompt(conversation=[{"role": "user", "content": [{"type": "video"}, ask]}], prompt_id="video",
               videos=[frames], video_fps=[2.0]),
    ]
    engine = HFRolloutEngine(tiny_vl_model, tiny_vl_processor)
    groups = engine.generate(prompts, SamplingParams(num_samples_per_prompt=2, temperature=1.0, max_response_length=4,
                                                     seed=0))
    batch = collate_rollouts(groups, tiny_vl_processor)
    assert batch.images_per_row.tolist() == [0, 0, 1, 1, 2, 2, 0, 0]
    assert batch.videos_per_row.tolist() == [0, 0, 0, 0, 0, 0, 1, 1]
    with torch.no_grad():
        whole = token_logprobs(tiny_vl_model, batch.inputs, mask=batch.completion_mask).logprobs
        for start, stop in [(0, 2), (1, 4), (3, 6), (5, 8), (6, 8), (0, 8)]:
            rows = slice(start, stop)
            inputs = batch.rows(rows)
            assert inputs["input_ids"].shape == (stop - start, batch.inputs["input_ids"].shape[1])
            images = int(batch.images_per_row[rows].sum())
            assert ("image_grid_thw" in inputs) == (images > 0)
            assert ("pixel_values_videos" in inputs) == (stop > 6)
            if vl_family == "qwen2_5_vl":  # Qwen3-VL times video frames by text, not by this tensor
                assert ("second_per_grid_ts" in inputs) == (stop > 6)
            if images:
                assert inputs["image_grid_thw"].shape[0] == images
                assert inputs["pixel_values"].shape[0] == int(inputs["image_grid_thw"].prod(-1).sum())
            part = token_logprobs(tiny_vl_model, inputs, mask=batch.completion_mask[rows]).logprobs
            torch.testing.assert_close(part, whole[rows], atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="contiguous"):
        batch.rows(slice(0, 8, 2))


def test_trainer_rows_have_the_prompt_ids_and_positions_the_engine_generated_from(
        tiny_vl_model, tiny_vl_processor, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mRoPE positions the engine's prefill used (its own call of the model's ``get_rope_index``,
    left-padded batch) equal those the trainer's forward computes for the prompt part of each row
    (right-padded, prompt + completion), image and video prompts alike; so do the prompt ids."""
    frames = np.stack([cpt.frame_index_pattern(i, (64, 64)) for i in range(4)])
    ask = {"type": "text", "text": "What is shown?"}
    prompts = [
        Prompt(conversation=[{"role": "user", "content": [{"type": "image"}, ask]}], prompt_id="image",
               images=[cpt.color_image("red", size=(56, 84))]),
        Prompt(conversation=[{"role": "user", "content": [{"type": "video"}, ask]}], prompt_id="video",
               videos=[frames], video_fps=[2.0],
               video_metadata=[{"fps": 8.0, "frames_indices": [0, 3, 6, 9], "total_num_frames": 10}]),
    ]
    inner = tiny_vl_model.model
    calls, original = [], inner.get_rope_index

    def spy(input_ids, *args, **kwargs):
        out = original(input_ids, *args, **kwargs)
        calls.append((input_ids.clone(), kwargs.get("attention_mask"), out[0].clone()))
        return out

    monkeypatch.setattr(inner, "get_rope_index", spy)
    engine = HFRolloutEngine(tiny_vl_model, tiny_vl_processor)
    groups = engine.generate(prompts, SamplingParams(num_samples_per_prompt=2, temperature=1.0, max_response_length=4,
                                                     seed=0))
    engine_ids, engine_mask, engine_positions = calls[0]  # the prefill of the whole (left-padded) batch
    calls.clear()
    batch = collate_rollouts(groups, tiny_vl_processor)
    media = {k: batch.inputs[k] for k in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts")
             if k in batch.inputs}
    with torch.no_grad():
        token_logprobs(tiny_vl_model, batch.inputs, mask=batch.completion_mask)  # the trainer's forward
    trainer_ids, _, trainer_positions = calls[0]
    assert torch.equal(trainer_positions, inner.get_rope_index(
        batch.inputs["input_ids"], batch.inputs["mm_token_type_ids"], attention_mask=batch.inputs["attention_mask"],
        **media)[0])
    for row in range(len(batch)):
        group = groups[row // 2]
        n = len(group.prompt_token_ids)
        real = engine_mask[row].bool()
        assert engine_ids[row][real].tolist() == group.prompt_token_ids == trainer_ids[row, :n].tolist()
        assert torch.equal(engine_positions[:, row][:, real], trainer_positions[:, row, :n])
    if tiny_vl_processor.__class__.__name__ == "Qwen3VLProcessor":  # the timestamps of the frames given
        text = tiny_vl_processor.tokenizer.decode(groups[1].prompt_token_ids)
        # each temporal patch at the mean time of its two source frames, index / source fps
        assert f"<{(0 + 3) / 2 / 8:.1f} seconds>" in text and f"<{(6 + 9) / 2 / 8:.1f} seconds>" in text


def test_sampling_params_from_the_rollout_config() -> None:
    from cosmos_primitives.config import config_from_dict

    rollout = config_from_dict({"rollout": {"max_response_length": 12, "sampling_config": {
        "temperature": 0.7, "top_p": 0.9, "top_k": 5, "repetition_penalty": 1.1}}}).rollout
    params = SamplingParams.from_config(rollout, num_samples_per_prompt=4, seed=3)
    assert params == SamplingParams(num_samples_per_prompt=4, temperature=0.7, top_p=0.9, top_k=5,
                                    repetition_penalty=1.1,
                                    max_response_length=12, seed=3)


def test_vision_block_markers_are_looked_up_without_building_the_vocabulary(qwen_tokenizer, monkeypatch) -> None:
    """The trainer asks for the markers once per record: ``get_vocab()`` rebuilds the 152k-entry dict
    each call (0.3 s on a CPU), so the lookup goes through ``convert_tokens_to_ids``."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from cosmos_primitives.data.rollout_batch import vision_block_markers

    monkeypatch.setattr(type(qwen_tokenizer), "get_vocab", lambda self: pytest.fail("get_vocab() was called"))
    assert vision_block_markers(qwen_tokenizer) == {qwen_tokenizer.convert_tokens_to_ids("<|vision_start|>"),
                                                    qwen_tokenizer.convert_tokens_to_ids("<|vision_end|>")}
    assert len(vision_block_markers(qwen_tokenizer)) == 2
    # a tokenizer without the markers maps them to its unknown token: no markers
    plain = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1},
                                                                                  unk_token="[UNK]")),
                                    unk_token="[UNK]")
    assert vision_block_markers(plain) == frozenset()
    assert vision_block_markers(object()) == frozenset()
