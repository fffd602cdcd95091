"""Multi-turn episodes of a vision-language model whose environment returns an image (a later frame
of the prompt's clip), for Qwen2.5-VL and Qwen3-VL: the image's pads are context in the row, the
trainer's forward over the row with all its media reproduces the engine's log-probs, and the next
model turn sees the image."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import torch

from cosmos_primitives import testing as cpt
from cosmos_primitives.data.records import Prompt, SamplingParams
from cosmos_primitives.data.rollout_batch import collate_rollouts
from cosmos_primitives.policy.teacher import teacher_logprobs
from cosmos_primitives.rollout.hf_engine import HFRolloutEngine
from cosmos_primitives.rollout.multi_turn import IMAGE_PLACEHOLDER, QWEN_TOOL_REPLY, EnvReply, Episode, run_episodes

CLIP = np.stack([cpt.frame_index_pattern(i, (64, 64)) for i in range(8)])
PARAMS = SamplingParams(num_samples_per_prompt=2, max_response_length=3, seed=0)


@pytest.fixture
def tiny_vl_model(family_vl_model):
    return family_vl_model.eval()


@pytest.fixture
def tiny_vl_processor(family_vl_processor):
    return family_vl_processor


def clip_prompt() -> Prompt:
    return Prompt(conversation=[{"role": "user", "content": [{"type": "video"},
                                                             {"type": "text", "text": "What moves?"}]}],
                  prompt_id="clip", videos=[CLIP], video_fps=[4.0])


def look_again(frame: int):
    """After the first turn, show frame ``frame`` of the clip; end after the second."""
    def env(episode: Episode) -> EnvReply:
        if len(episode.turns) == 1:
            return EnvReply(text=f"Frame {frame}: {IMAGE_PLACEHOLDER}", reward=0.5, images=[CLIP[frame]])
        return EnvReply(reward=1.0, done=True)
    return env


def image_pads(processor, image) -> int:
    grid = processor.image_processor(images=[image], return_tensors="pt")["image_grid_thw"]
    return int(grid.prod()) // processor.image_processor.merge_size ** 2


def assert_the_turn_after_the_image_depends_on_it(model, processor, groups, trained: torch.Tensor,
                                                  mask: torch.Tensor, types: torch.Tensor) -> None:
    """Scored again with another frame (``CLIP[1]``) returned in place of the environment's image, the
    tokens before the image's first pad keep their log-probs bit for bit and those after it change (the
    tiny random model's logits are near uniform, so the change is small, but an unseen image would
    leave them bit for bit equal too). ``trained`` / ``mask`` / ``types``: ``[B, T]`` of the batch
    collated from ``groups``."""
    swapped = [attrs.evolve(groups[0], completions=[attrs.evolve(c, images=[CLIP[1]])
                                                    for c in groups[0].completions])]
    other = teacher_logprobs(model, collate_rollouts(swapped, processor))
    first_pad = int((types[0] == 1).nonzero()[0])
    before, after = mask.clone(), mask.clone()
    before[:, first_pad:] = False
    after[:, :first_pad] = False
    assert torch.equal(other[before], trained[before]) and int(before.sum()) > 0
    assert float((other[after] - trained[after]).abs().max()) > 1e-5


def test_an_image_from_the_environment_is_context_the_trainer_and_the_next_turn_see(
        tiny_vl_model, tiny_vl_processor) -> None:
    model, processor = tiny_vl_model, tiny_vl_processor
    engine = HFRolloutEngine(model, processor)
    groups = run_episodes(engine, processor, [clip_prompt()], PARAMS, look_again(6), max_turns=2,
                          reply_template=QWEN_TOOL_REPLY)
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    for c in groups[0].completions:
        assert c.turn_rewards == [0.5, 1.0] and len(c.images) == 1
        assert np.array_equal(np.asarray(c.images[0]), CLIP[6])
        pads = [i for i, t in enumerate(c.token_ids) if t == pad]
        assert len(pads) == image_pads(processor, CLIP[6]) > 1  # the processor's expansion, not one placeholder
        assert all(c.loss_mask[i] == 0 and c.logprobs[i] == 0.0 for i in pads)
        assert c.loss_mask[-1] == 1  # the second model turn follows the image
    batch = collate_rollouts(groups, processor)
    assert batch.images_per_row.tolist() == [1, 1] and batch.videos_per_row.tolist() == [1, 1]
    assert batch.inputs["image_grid_thw"].shape[0] == 2
    ids, types = batch.inputs["input_ids"], batch.inputs["mm_token_type_ids"]
    assert bool((types[ids == pad] == 1).all()) and int((types == 1).sum()) == 2 * image_pads(processor, CLIP[6])
    mask = batch.completion_mask.bool()
    trained = teacher_logprobs(model, batch)
    torch.testing.assert_close(trained[mask], batch.rollout_logprobs[mask], atol=1e-4, rtol=1e-4)

    assert_the_turn_after_the_image_depends_on_it(model, processor, groups, trained, mask, types)


def test_a_reply_whose_placeholders_do_not_match_its_images_is_named(tiny_vl_model, tiny_vl_processor) -> None:
    engine = HFRolloutEngine(tiny_vl_model, tiny_vl_processor)

    def two_images_one_placeholder(episode: Episode) -> EnvReply:
        return EnvReply(text=f"look: {IMAGE_PLACEHOLDER}", images=[CLIP[2], CLIP[3]])

    with pytest.raises(ValueError, match="2 images but its text 1 placeholders"):
        run_episodes(engine, tiny_vl_processor, [clip_prompt()], PARAMS, two_images_one_placeholder, max_turns=2)


def test_a_text_tokenizer_cannot_take_an_image_reply(tiny_qwen2_model, qwen_tokenizer) -> None:
    engine = HFRolloutEngine(tiny_qwen2_model.eval(), qwen_tokenizer)
    with pytest.raises(ValueError, match="pass the model's AutoProcessor"):
        run_episodes(engine, qwen_tokenizer, [Prompt(conversation="Look:", prompt_id="t")], PARAMS, look_again(1),
                     max_turns=2)


def test_an_image_from_the_environment_on_the_vllm_standin(tiny_vl_model, tiny_vl_processor, standin_vllm,
                                                           tmp_path) -> None:
    """The same episode on VLLMRolloutEngine (against tests/standins/vllm, not real vLLM): the second turn
    goes to vLLM as token ids plus the clip and the returned frame; the trainer reproduces its log-probs
    and the turn after the frame depends on it."""
    from cosmos_primitives.rollout.vllm_engine import VLLMRolloutEngine

    model, processor = tiny_vl_model, tiny_vl_processor
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    engine = VLLMRolloutEngine(str(tmp_path), processor, dtype="float32")
    groups = run_episodes(engine, processor, [clip_prompt()], PARAMS, look_again(6), max_turns=2,
                          reply_template=QWEN_TOOL_REPLY)
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    sent = [r for r in standin_vllm.REQUESTS if r.get("prompt_token_ids") is not None]
    assert len(sent) == 2 and all("image" in r["multi_modal_data"] for r in sent)
    video_pad = processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    # one placeholder per image and per video (Qwen3-VL: the clip's timestamped blocks made one triple again)
    assert all(r["prompt_token_ids"].count(pad) == 1 == r["prompt_token_ids"].count(video_pad) for r in sent)
    for c in groups[0].completions:
        assert c.turn_rewards == [0.5, 1.0] and len(c.images) == 1 and c.loss_mask[-1] == 1
        pads = [i for i, t in enumerate(c.token_ids) if t == pad]
        assert len(pads) == image_pads(processor, CLIP[6]) > 1
        assert all(c.loss_mask[i] == 0 and c.logprobs[i] == 0.0 for i in pads)
    batch = collate_rollouts(groups, processor)
    mask = batch.completion_mask.bool()
    trained = teacher_logprobs(model, batch)
    torch.testing.assert_close(trained[mask], batch.rollout_logprobs[mask], atol=1e-4, rtol=1e-4)
    ids, types = batch.inputs["input_ids"], batch.inputs["mm_token_type_ids"]
    assert int((types == 1).sum()) == 2 * image_pads(processor, CLIP[6]) and bool((types[ids == pad] == 1).all())

    assert_the_turn_after_the_image_depends_on_it(model, processor, groups, trained, mask, types)


def test_the_vllm_adapter_collapses_expanded_image_pads(tiny_vl_processor) -> None:
    """vLLM expands each placeholder of a token prompt itself, so a continuation's expanded runs of image
    pads go to it as one pad per image; a run count that differs from the images given is named."""
    from cosmos_primitives.rollout.vllm_engine import vllm_token_prompt

    tok = tiny_vl_processor.tokenizer
    start, pad, end = (tok.convert_tokens_to_ids(t) for t in ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>"))
    ids = [7, start, pad, pad, pad, pad, end, 8, 9, start, pad, pad, end, 10]
    prompt = Prompt(conversation="", prompt_id="ep", token_ids=ids, images=[CLIP[1], CLIP[2]])
    assert vllm_token_prompt(prompt, tok, "qwen2_5_vl") == [7, start, pad, end, 8, 9, start, pad, end, 10]
    with pytest.raises(ValueError, match=r"prompt 'ep'.* 2 runs of <\|image_pad\|> .* 3 images"):
        vllm_token_prompt(attrs.evolve(prompt, images=[CLIP[1]] * 3), tok, "qwen2_5_vl")


def text_only(group):
    """``group`` with its prompt's clip out of the conversation: a record holds references, not arrays."""
    conversation = [{"role": "user", "content": [{"type": "text", "text": "What moves?"}]}]
    return attrs.evolve(group, prompt=attrs.evolve(group.prompt, conversation=conversation))


def test_environment_images_travel_in_the_queue_record_and_train_as_in_the_process_that_ran_them(
        tiny_vl_model, tiny_vl_processor) -> None:
    """A record carries the images an environment returned as PNG bytes (lossless): the trainer's group
    rebuilt from the decoded record collates to the same batch, and its forward reproduces the
    engine's log-probs on the model's tokens."""
    from cosmos_primitives.queue.record import decode_record, encode_record, record_byte_limit, record_from_group
    from cosmos_primitives.queue.record_groups import group_from_record

    model, processor = tiny_vl_model, tiny_vl_processor
    groups = run_episodes(HFRolloutEngine(model, processor), processor, [clip_prompt()], PARAMS, look_again(6),
                          max_turns=2, reply_template=QWEN_TOOL_REPLY)
    data = encode_record(record_from_group(text_only(groups[0]), [1.0, 1.0], [0.5, -0.5]))
    record = decode_record(data, max_bytes=record_byte_limit(512, 2, episode_images=True))
    assert [len(images) for images in record.episode_images] == [1, 1]
    group = group_from_record(record)
    for c in group.completions:
        assert np.array_equal(c.images[0], CLIP[6])
    rebuilt = attrs.evolve(group, prompt=groups[0].prompt)  # the clip is re-read from its reference in a job
    before, after = collate_rollouts(groups, processor), collate_rollouts([rebuilt], processor)
    for key, value in before.inputs.items():
        torch.testing.assert_close(after.inputs[key], value, msg=key)
    mask = after.completion_mask.bool()
    torch.testing.assert_close(teacher_logprobs(model, after)[mask], after.rollout_logprobs[mask], atol=1e-4,
                               rtol=1e-4)


def test_episode_images_are_bounded_and_checked(tiny_vl_model, tiny_vl_processor) -> None:
    import msgspec

    from cosmos_primitives.queue import MalformedRecordError
    from cosmos_primitives.queue.record import MAX_EPISODE_IMAGE_BYTES, decode_record, encode_record, record_from_group
    from cosmos_primitives.queue.record_groups import group_from_record

    groups = run_episodes(HFRolloutEngine(tiny_vl_model, tiny_vl_processor), tiny_vl_processor, [clip_prompt()],
                          PARAMS, look_again(6), max_turns=2, reply_template=QWEN_TOOL_REPLY)
    record = record_from_group(text_only(groups[0]), [1.0, 1.0], [0.0, 0.0])
    fields = msgspec.structs.asdict(record)
    noise = np.random.default_rng(0).integers(0, 256, (1800, 1800, 3), dtype=np.uint8)  # ~9.7 MB as PNG
    big = [attrs.evolve(c, images=[noise]) for c in groups[0].completions]
    with pytest.raises(ValueError, match=f"over the bound of {MAX_EPISODE_IMAGE_BYTES}"):
        record_from_group(attrs.evolve(text_only(groups[0]), completions=big), [1.0, 1.0], [0.0, 0.0])
    forged = msgspec.msgpack.encode({**fields, "episode_images": [[b"GIF89a..."], []]})
    with pytest.raises(MalformedRecordError, match=r"episode_images\[0\]\[0\] is not PNG bytes"):
        decode_record(forged)
    truncated = [[images[0][:40]] for images in record.episode_images]
    broken = decode_record(msgspec.msgpack.encode({**fields, "episode_images": truncated}))
    with pytest.raises(ValueError, match=r"record \S+ \(prompt 'clip'\): episode_images\[0\]\[0\] cannot be decoded"):
        group_from_record(broken)
    assert decode_record(encode_record(record)).episode_images == record.episode_images
