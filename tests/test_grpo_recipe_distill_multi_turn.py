"""The library parts examples/grpo_vlm.py runs for ``[distillation]`` and ``[rollout.multi_turn_config]``
(``cp.policy.distill``, ``cp.rollout.episodes``), on a tiny random Qwen3 on the CPU; the whole recipe
on cosmos-rl's files is tests/test_cosmos_rl_config_runs.py's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives.data import Prompt, SamplingParams, collate_rollouts
from cosmos_primitives.policy.distill import distill_advantages
from cosmos_primitives.rewards.compose import RewardSet
from cosmos_primitives.rollout.episodes import (
    end_after_first_turn,
    generate_rollouts,
    load_environment,
    model_turns,
    score_rollouts,
)
from cosmos_primitives.rollout.multi_turn import EnvReply, Episode


def test_distillation_needs_a_teacher_and_refuses_a_row_prefix_filter_of_token_advantages() -> None:
    with pytest.raises(Exception, match=r"distillation\.model_name_or_path"):
        cp.load_config(None, ["distillation.enable=true"])
    with pytest.raises(Exception, match="min_filter_prefix_tokens"):
        cp.load_config(None, ["distillation.enable=true", "distillation.model_name_or_path=t",
                              "distillation.reward_advantages=add", "grpo.min_filter_prefix_tokens=1"])
    # bypassed rewards are all 0 in cosmos-rl, where the filter then takes nothing out: unset here
    cfg = cp.load_config(None, ["distillation.enable=true", "distillation.model_name_or_path=t",
                                "grpo.min_filter_prefix_tokens=1"])
    assert cfg.grpo.min_filter_prefix_tokens is None


def test_the_environment_is_loaded_from_the_config(tmp_path: Path) -> None:
    assert load_environment(cp.load_config(None, []).rollout.multi_turn_config) is None
    on = ["rollout.multi_turn_config.enable=true"]
    assert load_environment(cp.load_config(None, on).rollout.multi_turn_config) is end_after_first_turn
    (tmp_path / "my_env.py").write_text("def reply(episode):\n    return 'not an EnvReply'\n")
    key = f"rollout.multi_turn_config.environment={tmp_path}/my_env.py"
    env = load_environment(cp.load_config(None, [*on, f"{key}:reply"]).rollout.multi_turn_config)
    assert env(None) == "not an EnvReply"
    with pytest.raises(ImportError, match=r"rollout\.multi_turn_config\.environment"):
        load_environment(cp.load_config(None, [*on, f"{key}:nope"]).rollout.multi_turn_config)


def test_model_turns_are_the_runs_of_the_loss_mask() -> None:
    completion = cp.data.Completion(text="", token_ids=[1, 2, 3, 4, 5, 6], logprobs=[0.0] * 6,
                                    finish_reason="stop", loss_mask=[1, 1, 0, 0, 1, 0])
    assert model_turns(completion) == [[1, 2], [5]]
    assert model_turns(cp.data.Completion(text="", token_ids=[7], logprobs=[0.0], finish_reason="stop")) == [[7]]


def _quiz(episode: Episode) -> EnvReply:
    return EnvReply(text=" and again:", reward=0.25, done=len(episode.turns) == 3)


def test_episodes_are_scored_on_their_last_turn_plus_the_environment_rewards() -> None:
    tokenizer, model = cp.testing.qwen_tokenizer(), cp.testing.tiny_qwen3(seed=0)
    cfg = cp.load_config(None, ["rollout.multi_turn_config.enable=true", "rollout.max_response_length=64",
                                "rollout.multi_turn_config.max_assistant_turns=5", "grpo.num_samples_per_prompt=2"])
    engine = cp.rollout.HFRolloutEngine(model, tokenizer)
    params = SamplingParams(num_samples_per_prompt=2, temperature=1.0, max_response_length=4, seed=0)
    groups = generate_rollouts(engine, tokenizer, [Prompt(conversation="1 + 1 ="), Prompt(conversation="2 + 1 =")],
                               params, _quiz, multi=cfg.rollout.multi_turn_config,
                               max_response_length=cfg.rollout.max_response_length)
    seen: list[str] = []

    def record(completion: str) -> float:
        seen.append(completion)
        return 1.0 if len(seen) % 2 else 0.0

    scored, metrics = score_rollouts(groups, RewardSet({"seen": 1.0}, functions={"seen": record}), cfg.grpo,
                                     tokenizer, max_response_length=cfg.rollout.max_response_length, multi_turn=True)
    turns = [model_turns(c) for g in groups for c in g.completions]
    assert all(len(t) == 3 for t in turns)  # the environment ended each episode after its third turn
    assert metrics == {"episode/turns": 3.0, "episode/turns_max": 3.0, "episode/env_reward": 0.75}
    assert seen == [tokenizer.decode(t[-1], skip_special_tokens=True) for t in turns]  # the last model turn only
    assert torch.allclose(scored.rewards, torch.tensor([1.75, 0.75, 1.75, 0.75]))
    assert torch.allclose(scored.advantages, cp.algo.compute_advantages(scored.rewards, cfg=cfg.grpo))


def test_distill_advantages_are_per_token_and_bypass_the_rewards_unless_added() -> None:
    tokenizer = cp.testing.qwen_tokenizer()
    student, teacher = cp.testing.tiny_qwen3(seed=0), cp.testing.tiny_qwen3(seed=1)
    base = ["distillation.enable=true", "distillation.model_name_or_path=t", "grpo.num_samples_per_prompt=2"]
    cfg = cp.load_config(None, base)
    groups = cp.rollout.HFRolloutEngine(student, tokenizer).generate(
        [Prompt(conversation="1 + 1 =")], SamplingParams(num_samples_per_prompt=2, temperature=1.0,
                                                         max_response_length=5, seed=0))
    batch = collate_rollouts(groups, tokenizer)
    rewards = torch.tensor([1.0, -1.0])
    advantages, metrics = distill_advantages(teacher, batch, rewards, cfg.distillation, temperature=1.0)
    mask = batch.completion_mask.bool()
    assert advantages.shape == mask.shape and (advantages[~mask] == 0).all()
    teacher_scores = cp.policy.teacher.teacher_logprobs(teacher, batch)
    expected = -(batch.rollout_logprobs - teacher_scores)  # kl_penalty_coef 1, no discount
    assert torch.allclose(advantages[mask], expected[mask], atol=1e-5)
    assert metrics["teacher_kl"] == pytest.approx(float((-expected[mask]).mean()), abs=1e-5)
    added, _ = distill_advantages(teacher, batch, rewards,
                                  cp.load_config(None, [*base, "distillation.reward_advantages=add"]).distillation,
                                  temperature=1.0)
    assert torch.allclose(added[mask], (expected + rewards[:, None])[mask], atol=1e-5)
