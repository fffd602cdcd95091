"""Multi-turn / tool-use episodes (``cosmos_primitives.rollout.multi_turn``): one row per episode whose
environment tokens are context, not trained, and whose model tokens carry log-probs the trainer
reproduces from the whole row; with the HF engine and the vLLM adapter (stand-in)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from cosmos_primitives import testing as cpt
from cosmos_primitives.data.records import Prompt, SamplingParams
from cosmos_primitives.data.rollout_batch import collate_rollouts
from cosmos_primitives.policy.teacher import teacher_logprobs
from cosmos_primitives.rollout.hf_engine import HFRolloutEngine
from cosmos_primitives.rollout.multi_turn import EnvReply, Episode, episode_rewards, run_episodes

PROMPTS = [Prompt(conversation="Tool call:", prompt_id="a"), Prompt(conversation="Look again:", prompt_id="b")]
PARAMS = SamplingParams(num_samples_per_prompt=2, max_response_length=3, seed=0)


def tool(episode: Episode) -> EnvReply:
    """A tool that answers each call with the turn number and rewards by it; ends after 3 turns."""
    turn = len(episode.turns)
    return EnvReply(text=f" result {turn} for {episode.prompt.prompt_id}.", reward=float(turn), done=turn == 3)


@pytest.fixture(scope="module")
def model():
    return cpt.tiny_qwen3(seed=0).eval()


def test_an_episode_is_one_row_whose_tool_tokens_are_context_and_whose_logprobs_the_trainer_reproduces(
        model, qwen_tokenizer) -> None:
    groups = run_episodes(HFRolloutEngine(model, qwen_tokenizer), qwen_tokenizer, PROMPTS, PARAMS, tool, max_turns=5)
    assert [len(g.completions) for g in groups] == [2, 2]
    for g in groups:
        for c in g.completions:
            assert c.turn_rewards == [1.0, 2.0, 3.0]  # the tool ended each episode after its third turn
            replies = [f" result {t} for {g.prompt.prompt_id}." for t in (1, 2)]
            reply_ids = [qwen_tokenizer(r, add_special_tokens=False)["input_ids"] for r in replies]
            # the layout: turn, reply, turn, reply, turn; the replies' tokens are masked, with log-prob 0
            masked = [t for t, m in zip(c.token_ids, c.loss_mask) if m == 0]
            assert masked == reply_ids[0] + reply_ids[1]
            assert all(lp == 0.0 for lp, m in zip(c.logprobs, c.loss_mask) if m == 0)
            assert sum(c.loss_mask) == len(c.token_ids) - len(masked) > 0
            assert all(lp < 0 for lp, m in zip(c.logprobs, c.loss_mask) if m == 1)
    batch = collate_rollouts(groups, qwen_tokenizer)
    mask = batch.completion_mask.bool()
    assert int(mask.sum()) == sum(sum(c.loss_mask) for g in groups for c in g.completions)
    # the trainer's forward over the whole row (replies as context) gives the engine's own log-probs
    torch.testing.assert_close(teacher_logprobs(model, batch)[mask], batch.rollout_logprobs[mask],
                               atol=1e-4, rtol=1e-4)
    assert episode_rewards(groups) == [6.0] * 4


def test_async_environments_run_concurrently(model, qwen_tokenizer) -> None:
    running, most = 0, 0

    async def slow_tool(episode: Episode) -> EnvReply:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.05)
        running -= 1
        return EnvReply(text=" ok.", reward=1.0, done=len(episode.turns) == 2)

    groups = run_episodes(HFRolloutEngine(model, qwen_tokenizer), qwen_tokenizer, PROMPTS, PARAMS, slow_tool)
    assert most == 4  # the four episodes' calls overlapped
    assert all(c.turn_rewards == [1.0, 1.0] for g in groups for c in g.completions)


def test_the_token_budget_cuts_an_episode_and_max_turns_ends_one(model, qwen_tokenizer) -> None:
    never_done = lambda e: EnvReply(text=" more.", reward=0.5)  # noqa: E731
    engine = HFRolloutEngine(model, qwen_tokenizer)
    cut = run_episodes(engine, qwen_tokenizer, PROMPTS, PARAMS, never_done, max_turns=10, max_tokens=8)
    for c in (c for g in cut for c in g.completions):
        assert len(c.token_ids) <= 8 and c.finish_reason == "length"
    ended = run_episodes(engine, qwen_tokenizer, PROMPTS, PARAMS, never_done, max_turns=2)
    assert all(len(c.turn_rewards) == 2 for g in ended for c in g.completions)


def test_a_wrong_environment_answer_is_named(model, qwen_tokenizer) -> None:
    with pytest.raises(TypeError, match="return an EnvReply"):
        run_episodes(HFRolloutEngine(model, qwen_tokenizer), qwen_tokenizer, PROMPTS, PARAMS, lambda e: "text")


def test_episodes_through_the_vllm_adapter_go_on_from_token_ids(standin_vllm, tiny_qwen2_dir, qwen_tokenizer) -> None:
    from transformers import AutoModelForCausalLM

    from cosmos_primitives.rollout.vllm_engine import VLLMRolloutEngine

    engine = VLLMRolloutEngine(str(tiny_qwen2_dir), qwen_tokenizer, dtype="float32")
    groups = run_episodes(engine, qwen_tokenizer, PROMPTS, PARAMS, tool, max_turns=5)
    assert all(c.turn_rewards == [1.0, 2.0, 3.0] for g in groups for c in g.completions)
    batch = collate_rollouts(groups, qwen_tokenizer)
    mask = batch.completion_mask.bool()
    assert int(((batch.completion_mask == 0) & (batch.inputs["attention_mask"] == 1)).sum()) > 0
    trainer = AutoModelForCausalLM.from_pretrained(tiny_qwen2_dir, dtype=torch.float32).eval()
    torch.testing.assert_close(teacher_logprobs(trainer, batch)[mask], batch.rollout_logprobs[mask],
                               atol=1e-4, rtol=1e-4)


def test_episodes_cross_the_queue_with_their_masks_and_turn_rewards(model, qwen_tokenizer) -> None:
    from cosmos_primitives.queue.record import decode_record, encode_record, record_from_group
    from cosmos_primitives.queue.record_groups import check_trainable, group_from_record

    groups = run_episodes(HFRolloutEngine(model, qwen_tokenizer), qwen_tokenizer, PROMPTS[:1], PARAMS, tool,
                          max_turns=5)
    record = decode_record(encode_record(record_from_group(groups[0], [6.0, 6.0], [0.0, 0.0])))
    assert record.loss_masks == [c.loss_mask for c in groups[0].completions]
    assert record.turn_rewards == [[1.0, 2.0, 3.0]] * 2
    rebuilt = group_from_record(record)
    check_trainable(record, rebuilt, qwen_tokenizer, num_samples_per_prompt=2)
    assert collate_rollouts([rebuilt], qwen_tokenizer).completion_mask.tolist() == \
        collate_rollouts(groups, qwen_tokenizer).completion_mask.tolist()
    bad = record_from_group(groups[0], [6.0, 6.0], [0.0, 0.0])
    with pytest.raises(ValueError, match="loss_masks\\[0\\] holds \\[2\\]"):
        type(bad)(**{**{f: getattr(bad, f) for f in bad.__struct_fields__},
                     "loss_masks": [[2] * len(bad.completion_token_ids[0]), bad.loss_masks[1]]})
