"""HFRolloutEngine with ``static_cache=True``: the same rollouts as the dynamic cache (greedy tokens,
log-probs within 1e-5) for text and image prompts, with padding rows and prompts of several lengths;
weight updates are seen; the decode step stays one compiled graph across calls (compiled here with a
counting backend, since inductor and CUDA graphs need a GPU)."""

from __future__ import annotations

import pytest
import torch
from transformers import CompileConfig

import cosmos_primitives as cp
from cosmos_primitives import testing as cpt
from cosmos_primitives.config.rollout import RolloutConfig
from cosmos_primitives.data.records import Prompt, SamplingParams
from cosmos_primitives.rollout.hf_engine import HFRolloutEngine
from test_rollout_hf import full_sequence_logprobs, image_prompt

GREEDY = SamplingParams(num_samples_per_prompt=2, temperature=0.0, max_response_length=6)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matmuls: one thread beats several fighting over a busy CPU (10x on a shared 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def text_prompts(*words: int) -> list[Prompt]:
    return [Prompt(conversation=[{"role": "user", "content": "count " * k}], prompt_id=f"p{k}") for k in words]


def assert_same_rollouts(a, b, atol: float = 1e-5) -> None:
    assert [g.prompt.prompt_id for g in a] == [g.prompt.prompt_id for g in b]
    for ga, gb in zip(a, b):
        assert ga.prompt_token_ids == gb.prompt_token_ids
        for ca, cb in zip(ga.completions, gb.completions, strict=True):
            assert ca.token_ids == cb.token_ids and ca.finish_reason == cb.finish_reason
            torch.testing.assert_close(torch.tensor(ca.logprobs), torch.tensor(cb.logprobs), atol=atol, rtol=0)


def test_text_greedy_same_as_dynamic_with_padding_rows(tiny_qwen2_model, qwen_tokenizer) -> None:
    # 3 prompts x n=2 at 4 sequences per call: the second call has 1 real prompt and 1 padding prompt
    prompts = text_prompts(1, 9, 4)
    dynamic = HFRolloutEngine(tiny_qwen2_model, qwen_tokenizer, max_batch_sequences=4).generate(prompts, GREEDY)
    engine = HFRolloutEngine(tiny_qwen2_model, qwen_tokenizer, max_batch_sequences=4, static_cache=True,
                             cache_len_multiple=32)
    static = engine.generate(prompts, GREEDY)
    assert_same_rollouts(dynamic, static)
    assert len(static) == 3 and all(len(g.completions) == 2 for g in static)
    longest = max(len(g.prompt_token_ids) for g in static)
    assert engine.static_cache_shape == (4, -(-(longest + 6) // 32) * 32)  # rows constant, length rounded up


def test_image_greedy_same_as_dynamic_with_padding_rows(tiny_vl_model, tiny_vl_processor) -> None:
    prompts = [image_prompt("red", "r"), image_prompt("blue", "b"), image_prompt("green", "g")]
    prompts[1].conversation[0]["content"][1]["text"] = "Is it blue, or green, or neither of the two?"
    dynamic = HFRolloutEngine(tiny_vl_model, tiny_vl_processor, max_batch_sequences=4).generate(prompts, GREEDY)
    engine = HFRolloutEngine(tiny_vl_model, tiny_vl_processor, max_batch_sequences=4, static_cache=True,
                             cache_len_multiple=16)
    assert_same_rollouts(dynamic, engine.generate(prompts, GREEDY))
    rows, cache_len = engine.static_cache_shape
    assert rows == 4 and cache_len % 16 == 0


def test_sampled_logprobs_match_the_model_and_seed_reproduces(tiny_vl_model, tiny_vl_processor) -> None:
    engine = HFRolloutEngine(tiny_vl_model, tiny_vl_processor, max_batch_sequences=4, static_cache=True)
    prompts = [image_prompt("red", "p0"), image_prompt("blue", "p1"), image_prompt("green", "p2")]
    params = SamplingParams(num_samples_per_prompt=2, temperature=0.8, max_response_length=5, seed=3)
    groups = engine.generate(prompts, params)
    assert [c.token_ids for g in groups for c in g.completions] == \
        [c.token_ids for g in engine.generate(prompts, params) for c in g.completions]
    for group in groups:
        for c in group.completions:
            reference = full_sequence_logprobs(tiny_vl_model, tiny_vl_processor, group.prompt, c.token_ids, 0.8)
            torch.testing.assert_close(torch.tensor(c.logprobs), reference, atol=1e-4, rtol=1e-4)


def test_weight_updates_change_static_output_as_they_change_dynamic(tiny_qwen2_model, qwen_tokenizer) -> None:
    prompts, params = text_prompts(2, 5), SamplingParams(num_samples_per_prompt=2, temperature=0.0,
                                                         max_response_length=4)
    static = HFRolloutEngine(tiny_qwen2_model, qwen_tokenizer, max_batch_sequences=4, static_cache=True)
    dynamic = HFRolloutEngine(tiny_qwen2_model, qwen_tokenizer, max_batch_sequences=4)
    before = static.generate(prompts, params)
    static.update_weights(cpt.tiny_qwen2(seed=1).named_parameters(), version=1)  # copies into the storage
    after = static.generate(prompts, params)
    assert_same_rollouts(dynamic.generate(prompts, params), after)
    assert [c.logprobs for g in before for c in g.completions] != [c.logprobs for g in after for c in g.completions]
    # a sync sharing the trainer's storage rebinds the parameters instead of copying into them
    for (_, target), (_, source) in zip(tiny_qwen2_model.named_parameters(), cpt.tiny_qwen2(seed=2).named_parameters()):
        target.data = source.data
    rebound = static.generate(prompts, params)
    assert_same_rollouts(dynamic.generate(prompts, params), rebound)
    assert [c.logprobs for g in after for c in g.completions] != [c.logprobs for g in rebound for c in g.completions]


def test_decode_step_is_one_graph_across_prompt_lengths_and_grows_once(tiny_vl_model, tiny_vl_processor) -> None:
    graphs: list[torch.fx.GraphModule] = []

    def counting_backend(gm: torch.fx.GraphModule, example_inputs) -> object:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    engine = HFRolloutEngine(tiny_vl_model, tiny_vl_processor, max_batch_sequences=4, static_cache=True,
                             cache_len_multiple=64,
                             compile_config=CompileConfig(backend=counting_backend, mode=None, fullgraph=True))
    short, long = image_prompt("red", "r"), image_prompt("blue", "Is it blue, or green, or neither? " * 2)
    params = SamplingParams(num_samples_per_prompt=2, temperature=0.0, max_response_length=3)
    engine.generate([short], params)  # one prompt and a padding prompt
    compiled = engine.generate([long, short], params)  # other prompt lengths, no padding
    assert len(graphs) == 1 and engine.static_cache_shape == (4, 64)
    eager = HFRolloutEngine(tiny_vl_model, tiny_vl_processor, max_batch_sequences=4).generate([long, short], params)
    assert_same_rollouts(eager, compiled)
    # a request needing more than 64 positions grows the cache (one more graph); a shorter one then reuses it
    engine.generate([short], SamplingParams(num_samples_per_prompt=2, temperature=0.0, max_response_length=40))
    engine.generate([long], params)
    assert len(graphs) == 2 and engine.static_cache_shape == (4, 128)
    torch._dynamo.reset()


def test_factory_builds_the_static_cache_engine_from_the_key(tiny_qwen2_dir, qwen_tokenizer) -> None:
    cfg = cp.load_config(overrides=["rollout.backend=hf", "rollout.hf_static_cache=true"]).rollout
    engine, _ = cp.rollout.build_rollout_engine(cfg, str(tiny_qwen2_dir), qwen_tokenizer, dtype="float32")
    assert engine.static_cache is True
    assert RolloutConfig().hf_static_cache is False


def test_bad_cache_len_multiple_is_refused(tiny_qwen2_model, qwen_tokenizer) -> None:
    with pytest.raises(ValueError, match="cache_len_multiple must be >= 1, got 0"):
        HFRolloutEngine(tiny_qwen2_model, qwen_tokenizer, static_cache=True, cache_len_multiple=0)
