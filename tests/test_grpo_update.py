"""``cp.policy.grpo_update`` (the update both GRPO recipes run): which policy is the "old" one of the PPO ratio.

With records that the current weights generated (colocated), the engine's log-probs equal the
trainer's, so ``[grpo] old_logprobs = "rollout"`` (default) and ``"recompute"`` take the same step.
With records from older weights (disaggregated, staleness > 0), only ``"rollout"`` bounds the step
by the clip: ``"recompute"`` makes the ratio exactly 1 whatever the records' age.
"""

from __future__ import annotations

import copy
from pathlib import Path

import attrs
import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives.data.records import Prompt, SamplingParams
from cosmos_primitives.data.rollout_batch import collate_rollouts
from cosmos_primitives.policy import CausalLMPolicy, GRPOUpdateSettings, grpo_update
from cosmos_primitives.rollout.hf_engine import HFRolloutEngine

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "configs" / "grpo_tiny.toml"


@pytest.fixture
def rollouts(tiny_qwen2_model, qwen_tokenizer):
    """A model and the batch of 4 prompts x 4 samples its HF engine generated at temperature 1."""
    engine = HFRolloutEngine(tiny_qwen2_model, qwen_tokenizer)
    prompts = [Prompt(conversation=[{"role": "user", "content": "count" + " up" * i}], prompt_id=str(i))
               for i in range(4)]
    groups = engine.generate(prompts, SamplingParams(num_samples_per_prompt=4, temperature=1.0, max_response_length=6,
                                                     seed=0))
    return tiny_qwen2_model, collate_rollouts(groups, qwen_tokenizer)


def update(model, batch, old_logprobs: str, *extra: str) -> tuple[dict, dict]:
    """One update of a copy of ``model``; returns the loss metrics and the updated weights."""
    cfg = cp.load_config(CONFIG, [f"grpo.old_logprobs={old_logprobs}", "rollout.sampling_config.temperature=1.0",
                                  "train.train_policy.mini_batch=8", "train.optm_warmup_steps=0", *extra])
    policy = CausalLMPolicy(copy.deepcopy(model))
    # plain SGD: the step is the gradient itself (Adam's first step is its sign, so float noise on a
    # gradient of ~0 would decide a full-size step)
    optimizer = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=1.0)
    advantages = torch.tensor([1.0, -1.0] * (len(batch) // 2))
    metrics = grpo_update(policy, None, optimizer, batch, advantages, GRPOUpdateSettings.from_config(cfg)).metrics
    return metrics, {k: v.detach().clone() for k, v in policy.hf_model.named_parameters()}


def step_of(weights: dict, model) -> dict:
    return {k: v - dict(model.named_parameters())[k].detach() for k, v in weights.items()}


def test_fresh_records_take_the_same_step_either_way(rollouts) -> None:
    model, batch = rollouts
    from_rollout, weights_rollout = update(model, batch, "rollout")
    from_trainer, weights_trainer = update(model, batch, "recompute")
    assert from_rollout["clip_fraction"] == from_trainer["clip_fraction"] == 0.0
    step_rollout, step_trainer = step_of(weights_rollout, model), step_of(weights_trainer, model)
    for name, value in step_rollout.items():
        torch.testing.assert_close(value, step_trainer[name], atol=1e-6, rtol=1e-4, msg=name)
    assert max(float(v.abs().max()) for v in step_rollout.values()) > 1e-3  # a real step was taken


def test_stale_records_are_clipped_against_the_policy_that_generated_them(rollouts) -> None:
    model, batch = rollouts
    # as if older weights had generated them: every sampled token was 1 nat less likely then (ratio e)
    stale = attrs.evolve(batch, rollout_logprobs=batch.rollout_logprobs - batch.completion_mask)
    behaviour, _ = update(model, stale, "rollout")
    recomputed, _ = update(model, stale, "recompute")
    # ratio e > 1 + epsilon_high: the positive-advantage half of the tokens is clipped
    assert 0.3 < behaviour["clip_fraction"] < 0.7
    assert recomputed["clip_fraction"] == 0.0


def test_a_batch_with_no_token_to_train_takes_no_step(rollouts) -> None:
    model, batch = rollouts
    dropped = attrs.evolve(batch, completion_mask=torch.zeros_like(batch.completion_mask))
    metrics, weights = update(model, dropped, "rollout")
    assert metrics == {}
    assert all(torch.equal(v, dict(model.named_parameters())[k]) for k, v in weights.items())


def test_a_nan_advantage_stops_the_update_or_skips_its_step(rollouts) -> None:
    """``[train] nonfinite``: "stop" raises before the optimizer applies a NaN gradient, "skip"
    leaves the weights as they were."""
    model, batch = rollouts
    advantages = torch.tensor([1.0, -1.0] * (len(batch) // 2))
    advantages[3] = float("nan")
    for mode in ("stop", "skip"):
        cfg = cp.load_config(CONFIG, [f"train.nonfinite={mode}", "train.train_policy.mini_batch=8"])
        policy = CausalLMPolicy(copy.deepcopy(model))
        optimizer = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=1.0)
        if mode == "stop":
            with pytest.raises(cp.policy.NonFiniteError, match="step 7"):
                grpo_update(policy, None, optimizer, batch, advantages, GRPOUpdateSettings.from_config(cfg), step=7)
        else:
            grpo_update(policy, None, optimizer, batch, advantages, GRPOUpdateSettings.from_config(cfg), step=7)
        after = dict(policy.hf_model.named_parameters())
        for name, before in model.named_parameters():
            assert torch.equal(after[name].detach(), before.detach()), name


def test_trainer_side_temperature_scores_the_tokens(rollouts) -> None:
    """``[grpo] temperature`` (cosmos-rl's train_policy.temperature): the trainer scores tokens under
    logits / T whatever the sampler's temperature; unset, the sampler's (1.0 here: ratio 1, nothing clipped)."""
    model, batch = rollouts
    same, _ = update(model, batch, "rollout")
    sharper, _ = update(model, batch, "rollout", "grpo.temperature=0.25")
    assert same["clip_fraction"] == 0.0
    assert sharper["clip_fraction"] > 0.1  # trainer log-probs at T = 0.25 differ from the engine's at T = 1


def test_top_k_top_p_rollouts_are_scored_under_the_same_distribution(tiny_qwen2_model, qwen_tokenizer) -> None:
    """Issue 29: rollouts sampled with top-k / top-p carry the filtered distribution's log-probs; the
    update scores the same distribution, so fresh records have ratio 1 and no drift, and the step
    from the engine's log-probs equals the step from the trainer's recompute (fused head or not)."""
    engine = HFRolloutEngine(tiny_qwen2_model, qwen_tokenizer)
    prompts = [Prompt(conversation=[{"role": "user", "content": "count" + " up" * i}], prompt_id=str(i))
               for i in range(4)]
    groups = engine.generate(prompts, SamplingParams(num_samples_per_prompt=4, temperature=1.0, top_k=40, top_p=0.7,
                                                     max_response_length=6,
                                                     seed=0))
    batch = collate_rollouts(groups, qwen_tokenizer)
    sampling = ["rollout.sampling_config.top_k=40", "rollout.sampling_config.top_p=0.7"]
    metrics, weights_rollout = update(tiny_qwen2_model, batch, "rollout", *sampling)
    assert metrics["clip_fraction"] == 0.0
    assert metrics["rollout_kl_k3"] < 1e-9 and abs(metrics["rollout_ratio_max"] - 1.0) < 1e-5, metrics
    _, weights_trainer = update(tiny_qwen2_model, batch, "recompute", *sampling)
    step_rollout, step_trainer = step_of(weights_rollout, tiny_qwen2_model), step_of(weights_trainer, tiny_qwen2_model)
    for name, value in step_rollout.items():
        torch.testing.assert_close(value, step_trainer[name], atol=1e-6, rtol=1e-4, msg=name)
    assert max(float(v.abs().max()) for v in step_rollout.values()) > 1e-3
    # scoring the unfiltered distribution instead shows the drift the basis mismatch would cause
    unfiltered, _ = update(tiny_qwen2_model, batch, "rollout")
    assert unfiltered["rollout_kl_k3"] > 1e-2, unfiltered
