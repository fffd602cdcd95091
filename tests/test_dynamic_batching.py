"""GRPO dynamic batching (``[train.train_policy] max_token_len_per_mini_batch``): rows grouped by
length under a token budget give the fixed-row-count loss and gradients, with less padding.

The partition (``cp.data.token_budget_micro_batches``) is pure and deterministic; the micro-batch
count is raised to the data-parallel group's most, so ranks run the same collectives.
"""

from __future__ import annotations

import copy
import importlib
import random
from pathlib import Path

import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives import testing as cpt
from cosmos_primitives.data.records import Prompt, SamplingParams
from cosmos_primitives.data.rollout_batch import RolloutBatch, collate_rollouts
from cosmos_primitives.data.token_budget import pad_micro_batch_count, padded_tokens, token_budget_micro_batches
from cosmos_primitives.policy import CausalLMPolicy, GRPOUpdateSettings, grpo_update
from cosmos_primitives.rollout.hf_engine import HFRolloutEngine

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "configs" / "grpo_tiny.toml"
update_module = importlib.import_module("cosmos_primitives.policy.grpo_step")


def test_partition_keeps_every_micro_batch_within_the_budget_and_is_deterministic() -> None:
    rng = random.Random(0)
    lengths = [rng.randint(20, 200) for _ in range(37)] + [500]  # 10x spread, one row over the budget
    parts = token_budget_micro_batches(lengths, 400)
    assert sorted(i for p in parts for i in p) == list(range(len(lengths)))
    for p in parts:
        assert p == sorted(p)
        if len(p) > 1:
            assert len(p) * max(lengths[i] for i in p) <= 400
    assert [37] in parts  # the 500-token row alone
    assert token_budget_micro_batches(lengths, 400) == parts
    assert token_budget_micro_batches(list(lengths), 400) == parts
    # grouping by length pads far less than fixed rows of the batch's full width
    assert padded_tokens(lengths, parts) < 0.6 * len(lengths) * max(lengths)
    assert token_budget_micro_batches([], 10) == []
    with pytest.raises(ValueError, match="max_token_len_per_mini_batch"):
        token_budget_micro_batches([3], 0)


def _count_on_rank(lengths_by_rank: list[list[int]], budget: int) -> list[list[int]]:
    rank = torch.distributed.get_rank()
    return pad_micro_batch_count(token_budget_micro_batches(lengths_by_rank[rank], budget),
                                 torch.distributed.group.WORLD)


def test_ranks_with_different_lengths_run_as_many_micro_batches() -> None:
    lengths = [[10, 10, 10, 10], [100, 90, 80, 70, 10]]  # rank 0: one micro-batch, rank 1: several
    alone = [len(token_budget_micro_batches(ls, 200)) for ls in lengths]
    assert alone[0] < alone[1]
    parts = cpt.run_distributed(_count_on_rank, 2, (lengths, 200))
    assert [len(p) for p in parts] == [alone[1]] * 2
    assert parts[0][: alone[0]] == token_budget_micro_batches(lengths[0], 200)
    assert all(p == [] for p in parts[0][alone[0]:])  # the padding micro-batches are empty
    assert parts[1] == token_budget_micro_batches(lengths[1], 200)


def uneven_text_batch(vocab: int, seed: int = 0) -> RolloutBatch:
    """8 rows of 4 .. 40 tokens (prompt 3 .. 12 tokens), right padded, engine log-probs near the policy's."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [40, 6, 33, 4, 12, 9, 27, 5]
    prompts = [3, 2, 12, 2, 5, 4, 7, 2]
    width = max(lengths)
    ids = torch.randint(3, vocab, (len(lengths), width), generator=gen)
    attention = torch.zeros(len(lengths), width, dtype=torch.long)
    completion = torch.zeros(len(lengths), width)
    for i, (n, p) in enumerate(zip(lengths, prompts, strict=True)):
        attention[i, :n] = 1
        completion[i, p:n] = 1.0
        ids[i, n:] = 0
    rollout = -(torch.rand(len(lengths), width, generator=gen) * 3 + 7) * completion
    n = len(lengths)
    zeros = torch.zeros(n, dtype=torch.long)
    return RolloutBatch(inputs={"input_ids": ids, "attention_mask": attention}, completion_mask=completion,
                        rollout_logprobs=rollout, group_index=torch.arange(n) // 4,
                        completion_lengths=completion.sum(-1).long(), weight_versions=zeros,
                        images_per_row=zeros, videos_per_row=zeros)


def run_update(model, batch, *overrides: str) -> tuple[dict, dict]:
    """One update of a copy of ``model``: ``({"loss": each iteration's loss summed over its micro-batches,
    the per-token metrics}, the updated weights)``."""
    losses = []
    real_check = update_module.check_finite
    cfg = cp.load_config(CONFIG, ["rollout.sampling_config.temperature=1.0", "train.optm_warmup_steps=0",
                                  "train.optm_grad_norm_clip=0", *overrides])
    policy = CausalLMPolicy(copy.deepcopy(model))
    optimizer = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=1.0)
    advantages = torch.tensor([1.0, -0.5, 2.0, -1.0, 0.3, -2.0, 1.5, -0.7])[: len(batch)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(update_module, "check_finite",
                      lambda loss, *a, **k: losses.append(float(loss)) or real_check(loss, *a, **k))
        metrics = grpo_update(policy, None, optimizer, batch, advantages, GRPOUpdateSettings.from_config(cfg)).metrics
    # the logged "loss" / "kl" are token-weighted means of micro-batch partial sums (they depend on the
    # grouping); the loss that is back-propagated is their plain sum, which the optimizer step sees
    kept = {k: metrics[k] for k in ("entropy", "clip_fraction", "rollout_kl_k3", "rollout_ratio_max")}
    return {"losses": losses, **kept}, {k: v.detach().clone() for k, v in policy.hf_model.named_parameters()}


def assert_same_update(fixed: tuple[dict, dict], dynamic: tuple[dict, dict], model) -> None:
    start = dict(model.named_parameters())
    assert dynamic[0].keys() == fixed[0].keys()
    for k in fixed[0]:
        assert dynamic[0][k] == pytest.approx(fixed[0][k], rel=1e-4, abs=1e-6), k
    moved = 0.0
    for k, weight in fixed[1].items():
        step_fixed, step_dynamic = weight - start[k].detach(), dynamic[1][k] - start[k].detach()
        torch.testing.assert_close(step_dynamic, step_fixed, atol=2e-6, rtol=1e-4, msg=k)
        moved += float(step_fixed.abs().sum())
    assert moved > 0  # the update trained something


@pytest.mark.parametrize("loss_type", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("mu_iterations", [1, 2])
def test_dynamic_batching_gives_the_fixed_batch_loss_and_gradients(tiny_qwen2_model, loss_type,
                                                                   mu_iterations) -> None:
    batch = uneven_text_batch(tiny_qwen2_model.config.vocab_size)
    common = [f"grpo.loss_type={loss_type}", f"grpo.mu_iterations={mu_iterations}", "train.train_policy.mini_batch=4"]
    parts = token_budget_micro_batches(batch.lengths().tolist(), 64)
    assert len(parts) > 2 and len({len(p) for p in parts}) > 1  # uneven micro-batches, not the fixed split
    fixed = run_update(tiny_qwen2_model, batch, *common)
    dynamic = run_update(tiny_qwen2_model, batch, *common, "train.train_policy.max_token_len_per_mini_batch=64")
    assert_same_update(fixed, dynamic, tiny_qwen2_model)


def test_padding_micro_batches_train_nothing_and_still_run(tiny_qwen2_model, monkeypatch) -> None:
    """A rank with fewer micro-batches than another runs empty ones (masked-out rows) so that its
    forwards / backwards match; they change neither the loss nor the gradient (a fake all-reduce
    here asks for two more)."""
    batch = uneven_text_batch(tiny_qwen2_model.config.vocab_size)
    common = ["grpo.loss_type=seq-mean-token-mean", "train.train_policy.mini_batch=4",
              "train.train_policy.max_token_len_per_mini_batch=64"]
    plain = run_update(tiny_qwen2_model, batch, *common)
    forwards = []
    monkeypatch.setattr(update_module, "pad_micro_batch_count", lambda parts, group: [*parts, [], []])
    real = update_module.grpo_micro_batch_loss
    monkeypatch.setattr(update_module, "grpo_micro_batch_loss",
                        lambda policy, inputs, mask, *a, **k: forwards.append(float(mask.sum())) or
                        real(policy, inputs, mask, *a, **k))
    padded = run_update(tiny_qwen2_model, batch, *common)
    count = len(token_budget_micro_batches(batch.lengths().tolist(), 64))
    assert len(forwards) == count + 2 and forwards[-2:] == [0.0, 0.0]
    assert_same_update(plain, padded, tiny_qwen2_model)


def test_select_cuts_rows_to_their_longest_and_keeps_their_media(tiny_vl_model, tiny_vl_processor) -> None:
    """``RolloutBatch.select`` of any rows (any order) feeds the model what ``rows`` of the same rows
    one by one does, with only padding columns dropped; and a tiny VLM's GRPO update with images is
    the same under dynamic batching."""
    ask, image = {"type": "text", "text": "Which colour?"}, {"type": "image"}
    prompts = [
        Prompt(conversation=[{"role": "user", "content": [ask]}], prompt_id="text"),
        Prompt(conversation=[{"role": "user", "content": [image, {"type": "text", "text": "Which colour?" * 6}]}],
               prompt_id="one", images=[cpt.color_image("red", size=(56, 84))]),
        Prompt(conversation=[{"role": "user", "content": [image, image, ask]}], prompt_id="two",
               images=[cpt.color_image("blue", size=(56, 56)), cpt.color_image("green", size=(84, 112))]),
        Prompt(conversation=[{"role": "user", "content": [ask]}], prompt_id="text2"),
    ]
    engine = HFRolloutEngine(tiny_vl_model, tiny_vl_processor)
    groups = engine.generate(prompts, SamplingParams(num_samples_per_prompt=2, temperature=1.0, max_response_length=4,
                                                     seed=0))
    batch = collate_rollouts(groups, tiny_vl_processor)
    assert batch.images_per_row.tolist() == [0, 0, 1, 1, 2, 2, 0, 0]
    lengths = batch.lengths()
    for index in ([5, 0], [2, 4, 7], [3], [6, 1, 2], [4, 2, 0]):  # [4, 2]: image rows out of order
        part = batch.select(index)
        assert part.completion_mask.shape == (len(index), int(lengths[index].max()))
        assert part.images_per_row.tolist() == batch.images_per_row[index].tolist()
        inputs = part.rows(slice(None))
        for j, i in enumerate(index):
            one = batch.rows(slice(i, i + 1))
            mine = part.subset(slice(j, j + 1)).rows(slice(None))
            assert mine.keys() == one.keys()
            for k in one:
                width = one[k].shape[-1] if k in ("input_ids", "attention_mask", "mm_token_type_ids") else None
                expected = one[k] if width is None else one[k][:, : mine[k].shape[-1]]
                torch.testing.assert_close(mine[k], expected, msg=f"{index} row {i} {k}")
        assert ("pixel_values" in inputs) == bool(batch.images_per_row[index].sum())
    with pytest.raises(ValueError, match="select"):
        batch.select([])
    budget = int(lengths.max()) * 2
    assert len({len(p) for p in token_budget_micro_batches(lengths.tolist(), budget)}) > 1
    common = ["train.train_policy.mini_batch=2", "grpo.loss_type=seq-mean-token-mean"]
    fixed = run_update(tiny_vl_model, batch, *common)
    dynamic = run_update(tiny_vl_model, batch, *common, f"train.train_policy.max_token_len_per_mini_batch={budget}")
    assert_same_update(fixed, dynamic, tiny_vl_model)



def test_token_sum_is_cosmos_rl_s_per_mini_batch_token_sum_scaled_by_its_share_of_the_rows(tiny_qwen2_model) -> None:
    """cosmos-rl's ``loss_type = "token-sum"`` (its countdown / deepmath distillation files): each
    mini-batch's per-token losses summed, times ``rows in it / rows in the step`` (its
    ``loss_scaling_factor``); with mini-batches of ``m`` of ``N`` rows that is ``m / N`` x the sum over
    every token, i.e. ``m / N x tokens`` x the ``token-mean`` loss, and so its gradient. It depends on
    the grouping, so a token budget refuses it."""
    batch = uneven_text_batch(tiny_qwen2_model.config.vocab_size)
    start = dict(tiny_qwen2_model.named_parameters())
    mean = run_update(tiny_qwen2_model, batch, "grpo.loss_type=token-mean", "train.train_policy.mini_batch=4")
    summed = run_update(tiny_qwen2_model, batch, "grpo.loss_type=token-sum", "train.train_policy.mini_batch=4")
    factor = 4 / len(batch) * float(batch.completion_mask.sum())
    assert summed[0]["losses"][0] == pytest.approx(factor * mean[0]["losses"][0], rel=1e-4)
    for k, weight in mean[1].items():  # SGD with lr 1: the step is the gradient
        torch.testing.assert_close(summed[1][k] - start[k].detach(), factor * (weight - start[k].detach()),
                                   atol=1e-5, rtol=1e-4, msg=k)
    with pytest.raises(ValueError, match="loss_type 'token-sum' is not one whose loss is known not to depend"):
        run_update(tiny_qwen2_model, batch, "grpo.loss_type=token-sum", "train.train_policy.mini_batch=4",
                   "train.train_policy.max_token_len_per_mini_batch=64")
