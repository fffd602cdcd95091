"""Qwen3-VL video prompts through vLLM (its stand-in) and back into the trainer.

The chat template writes a video as ``<|vision_start|><|video_pad|><|vision_end|>``. vLLM's Qwen3-VL
processor (``vllm/model_executor/models/qwen3_vl.py``, ``Qwen3VLMultiModalProcessor._get_prompt_updates``:
``PromptReplacement(modality="video", target="<|vision_start|><|video_pad|><|vision_end|>", ...)``)
replaces that whole triple by one block per temporal patch: the tokens of ``<{t:.1f} seconds>`` (``t``
from ``Qwen3VLProcessingInfo._get_video_second_idx``: the mean of the patch's two source frame indices
over the source fps), then ``<|vision_start|>``, ``h * w / 4`` video pads, ``<|vision_end|>``.
transformers 5's ``Qwen3VLProcessor.replace_video_token`` replaces only the ``<|video_pad|>`` with the
same blocks, so its prompt keeps the template's outer ``<|vision_start|>`` / ``<|vision_end|>`` as
well. The trainer must score the prompt the engine sampled from, whichever form it is.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives import testing as cpt
from cosmos_primitives.data.prompt_inputs import encode_prompts, render_prompt
from cosmos_primitives.data.records import Prompt, SamplingParams
from cosmos_primitives.data.rollout_batch import collate_rollouts
from cosmos_primitives.policy import CausalLMPolicy, token_logprobs
from cosmos_primitives.testing.tokenizer import VIDEO_PAD_ID, VISION_END_ID, VISION_START_ID

TRIPLE = "<|vision_start|><|video_pad|><|vision_end|>"
SOURCE_FPS = 8.0
FRAMES_INDICES = [0, 3, 6, 9]  # four frames of a 10-frame source: two temporal patches
SIDE = 64  # px, a multiple of Qwen3-VL's 32-px factor: 4 x 4 patches of 16 px, 4 tokens per frame block


@pytest.fixture(scope="module")
def qwen3_vl_dir(tmp_path_factory) -> str:
    return str(cpt.save_tiny_qwen3_vl(tmp_path_factory.mktemp("qwen3_vl") / "model"))


def _video_prompt() -> Prompt:
    frames = np.random.default_rng(0).integers(0, 256, (len(FRAMES_INDICES), SIDE, SIDE, 3), dtype=np.uint8)
    conversation = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]}]
    return Prompt(conversation=conversation, prompt_id="clip", videos=[frames], video_fps=[2.0],
                  video_metadata=[{"fps": SOURCE_FPS, "frames_indices": FRAMES_INDICES, "total_num_frames": 10}])


def _vllm_video_ids(processor, text: str) -> list[int]:
    """The prompt ids vLLM's Qwen3-VL processor gives ``text`` with :func:`_video_prompt`'s video, built
    from the rule in vLLM's model file (module docstring), not from the stand-in."""
    tokenizer = processor.tokenizer
    before, after = text.split(TRIPLE)
    tokens_per_frame = (SIDE // 16) * (SIDE // 16) // 4
    ids = tokenizer(before, add_special_tokens=False)["input_ids"]
    for first, second in zip(FRAMES_INDICES[::2], FRAMES_INDICES[1::2]):
        seconds = (first / SOURCE_FPS + second / SOURCE_FPS) / 2
        ids += tokenizer.encode(f"<{seconds:.1f} seconds>", add_special_tokens=False)
        ids += [VISION_START_ID] + [VIDEO_PAD_ID] * tokens_per_frame + [VISION_END_ID]
    return ids + tokenizer(after, add_special_tokens=False)["input_ids"]


def test_standin_gives_vllms_qwen3_vl_video_prompt(standin_vllm, qwen3_vl_dir, tiny_qwen3_vl_processor) -> None:
    """The stand-in's prompt ids for a Qwen3-VL video are vLLM's form (the triple replaced: no outer
    vision_start / vision_end), timestamps ``<0.2 seconds>`` / ``<0.9 seconds>`` from the source frame
    indices; transformers 5's processor gives the same with the outer pair kept."""
    from cosmos_primitives.rollout.vllm_engine import VLLMRolloutEngine

    processor = tiny_qwen3_vl_processor
    prompt = _video_prompt()
    engine = VLLMRolloutEngine(qwen3_vl_dir, processor, seed=0, dtype="float32")
    [group] = engine.generate([prompt], SamplingParams(num_samples_per_prompt=1, temperature=1.0,
                                                       max_response_length=2, seed=0))
    expected = _vllm_video_ids(processor, render_prompt(processor, prompt))
    assert group.prompt_token_ids == expected
    text = processor.tokenizer.decode(expected)
    assert "<0.2 seconds><|vision_start|>" in text and "<0.9 seconds><|vision_start|>" in text
    assert "<|vision_start|><0.2 seconds>" not in text

    encoded = encode_prompts(processor, [prompt])
    hf_ids = encoded["input_ids"][0].tolist()
    first = expected.index(VISION_START_ID) - len(processor.tokenizer.encode("<0.2 seconds>"))
    last = len(expected) - expected[::-1].index(VISION_END_ID)
    assert hf_ids == [*expected[:first], VISION_START_ID, *expected[first:last], VISION_END_ID, *expected[last:]]


def test_trainer_scores_the_prompt_the_engine_used(standin_vllm, qwen3_vl_dir, tiny_qwen3_vl_processor) -> None:
    """collate_rollouts keeps the engine's prompt ids (vLLM's form) with the processor's video
    tensors, marks the engine's video pads in mm_token_type_ids, and the trainer's log-probs of the
    completions are the engine's to 1e-5 (float32, same weights)."""
    from cosmos_primitives.rollout.vllm_engine import VLLMRolloutEngine

    processor = tiny_qwen3_vl_processor
    engine = VLLMRolloutEngine(qwen3_vl_dir, processor, seed=0, dtype="float32")
    groups = engine.generate([_video_prompt()], SamplingParams(num_samples_per_prompt=2, temperature=1.0,
                                                               max_response_length=4, seed=3))
    batch = collate_rollouts(groups, processor)
    prompt_ids = groups[0].prompt_token_ids
    for row in range(2):
        assert batch.inputs["input_ids"][row, :len(prompt_ids)].tolist() == prompt_ids
        types = batch.inputs["mm_token_type_ids"][row, :len(prompt_ids)]
        assert torch.equal(types, (torch.tensor(prompt_ids) == VIDEO_PAD_ID).long() * 2)
    assert batch.inputs["video_grid_thw"].tolist() == [[2, SIDE // 16, SIDE // 16]] * 2

    policy = CausalLMPolicy(cp.policy.load_hf_model(qwen3_vl_dir, dtype="float32"))
    with torch.no_grad():
        trainer = token_logprobs(policy, batch.inputs).logprobs
    scored = batch.completion_mask.bool()
    torch.testing.assert_close(trainer[scored], batch.rollout_logprobs[scored], atol=1e-5, rtol=0)


def test_a_queue_record_in_vllms_form_passes_the_trainers_check(standin_vllm, qwen3_vl_dir,
                                                                 tiny_qwen3_vl_processor) -> None:
    """The independent jobs' trainer checks each record's prompt ids against its own re-encoding
    (``check_trainable``) before training on it: vLLM's form of a Qwen3-VL video prompt must pass, as
    :func:`collate_rollouts` lets it, and a prompt differing in a text token must still be refused."""
    from types import SimpleNamespace

    from cosmos_primitives.queue.record_groups import check_trainable
    from cosmos_primitives.rollout.vllm_engine import VLLMRolloutEngine

    processor = tiny_qwen3_vl_processor
    engine = VLLMRolloutEngine(qwen3_vl_dir, processor, seed=0, dtype="float32")
    [group] = engine.generate([_video_prompt()], SamplingParams(num_samples_per_prompt=2, temperature=1.0,
                                                                max_response_length=2, seed=0))
    check_trainable(SimpleNamespace(num_completions=2, prompt_token_ids=group.prompt_token_ids), group, processor,
                    num_samples_per_prompt=2)
    changed = list(group.prompt_token_ids)
    changed[-3] = changed[-3] + 1  # a token of the text after the video
    with pytest.raises(ValueError, match="re-encoding its prompt"):
        check_trainable(SimpleNamespace(num_completions=2, prompt_token_ids=changed), group, processor)
