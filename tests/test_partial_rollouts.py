"""Partial rollouts (``cosmos_primitives.rollout.partial.generate_in_chunks``): a generation cut at a
weight update goes on under the new weights, each token keeping the log-prob of the weights that
sampled it, and the group counts the oldest version."""

from __future__ import annotations

import copy

import torch

from cosmos_primitives import testing as cpt
from cosmos_primitives.data.records import Prompt, SamplingParams
from cosmos_primitives.data.rollout_batch import collate_rollouts
from cosmos_primitives.policy.teacher import teacher_logprobs
from cosmos_primitives.rollout.hf_engine import HFRolloutEngine
from cosmos_primitives.rollout.partial import generate_in_chunks

PROMPTS = [Prompt(conversation="Once upon a time", prompt_id="a"), Prompt(conversation="1 + 1 =", prompt_id="b")]
PARAMS = SamplingParams(num_samples_per_prompt=2, max_response_length=7, seed=0)


class CountingEngine(HFRolloutEngine):
    calls: list[int]

    def generate(self, prompts, params):
        self.calls.append(len(prompts))
        return super().generate(prompts, params)


def engine_for(model, tokenizer) -> CountingEngine:
    engine = CountingEngine(model, tokenizer)
    engine.calls = []
    return engine


def test_a_generation_cut_by_an_update_goes_on_under_the_new_weights(qwen_tokenizer) -> None:
    model = cpt.tiny_qwen3(seed=0).eval()
    before = copy.deepcopy(model)
    engine = engine_for(model, qwen_tokenizer)
    gen = torch.Generator().manual_seed(1)
    new_weights = [(n, p.detach() + 0.2 * torch.randn(p.shape, generator=gen)) for n, p in model.named_parameters()]

    def take_new_weights() -> None:  # what a rollout job does between chunks when a version arrived
        if engine.weight_version == 0:
            engine.update_weights(new_weights, version=1)

    groups = generate_in_chunks(engine, PROMPTS, PARAMS, chunk_tokens=3, between_chunks=take_new_weights)
    assert engine.weight_version == 1 and [g.weight_version for g in groups] == [0, 0]  # the oldest tokens' version
    lengths = [len(c.token_ids) for g in groups for c in g.completions]
    assert max(lengths) > 3  # some completion went on past the update
    batch = collate_rollouts(groups, qwen_tokenizer)
    old, new = teacher_logprobs(before, batch), teacher_logprobs(model, batch)
    mask = batch.completion_mask.bool()
    starts = mask.float().argmax(1)
    for row in range(len(batch)):
        first_chunk = slice(int(starts[row]), int(starts[row]) + 3)
        later = slice(int(starts[row]) + 3, None)
        torch.testing.assert_close(batch.rollout_logprobs[row, first_chunk][mask[row, first_chunk]],
                                   old[row, first_chunk][mask[row, first_chunk]], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(batch.rollout_logprobs[row, later][mask[row, later]],
                                   new[row, later][mask[row, later]], atol=1e-4, rtol=1e-4)
    # the continued completions' text is their whole decoded ids
    for g in groups:
        for c in g.completions:
            ids = c.token_ids[:-1] if c.finish_reason == "stop" else c.token_ids
            assert c.text == qwen_tokenizer.decode(ids, skip_special_tokens=False)


def test_finished_completions_are_not_continued_and_the_budget_holds(qwen_tokenizer) -> None:
    model = cpt.tiny_qwen3(seed=0).eval()
    engine = engine_for(model, qwen_tokenizer)
    eos = qwen_tokenizer.eos_token_id
    # a stop on a common token ends some completions early; the rest run to max_response_length
    params = SamplingParams(num_samples_per_prompt=4, max_response_length=7, seed=3, stop_token_ids=(eos,))
    groups = generate_in_chunks(engine, PROMPTS, params, chunk_tokens=2)
    completions = [c for g in groups for c in g.completions]
    assert all(len(c.token_ids) <= 7 for c in completions)
    assert all((c.finish_reason == "length") == (len(c.token_ids) == 7) for c in completions)
    assert engine.calls[0] == 2 and all(n <= 8 for n in engine.calls[1:])  # continuations: one row each
    assert len(engine.calls) == 4  # chunks of 2, 2, 2, 1 tokens
