"""HFRolloutEngine: n samples per prompt for text, image and video prompts, log-probs, stops."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from cosmos_primitives import testing as cpt
from cosmos_primitives.data.records import Prompt, SamplingParams
from cosmos_primitives.rollout.base import RolloutEngine
from cosmos_primitives.rollout.hf_engine import HFRolloutEngine
from cosmos_primitives.rollout.token_sampler import InverseCDFSampler


@pytest.fixture
def tiny_vl_model(family_vl_model):
    """Every VL test of this module runs on both families (Qwen2.5-VL, Qwen3-VL)."""
    return family_vl_model


@pytest.fixture
def tiny_vl_processor(family_vl_processor):
    return family_vl_processor


def image_prompt(color: str, pid: str) -> Prompt:
    conv = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"Is it {color}?"}]}]
    return Prompt(conversation=conv, prompt_id=pid, images=[cpt.color_image(color)], reference="A")


def full_sequence_logprobs(model, processor, prompt: Prompt, completion_ids: list[int], temperature: float):
    """Reference: teacher-forced log-probs of a completion under the model (temperature-scaled)."""
    from cosmos_primitives.data.prompt_inputs import encode_prompts

    batch = encode_prompts(processor, [prompt])
    ids = torch.cat([batch["input_ids"], torch.tensor([completion_ids])], dim=1)
    batch["attention_mask"] = torch.ones_like(ids)
    if "mm_token_type_ids" in batch:
        batch["mm_token_type_ids"] = torch.cat([batch["mm_token_type_ids"], torch.zeros(1, len(completion_ids),
                                                                                          dtype=torch.long)], 1)
    batch["input_ids"] = ids
    with torch.no_grad():
        logits = model(**batch).logits[0, -len(completion_ids) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion_ids)[:, None]).squeeze(-1)


def test_engine_satisfies_protocol(tiny_vl_model, tiny_vl_processor) -> None:
    assert isinstance(HFRolloutEngine(tiny_vl_model, tiny_vl_processor), RolloutEngine)


def test_image_prompts_n_samples_with_matching_logprobs(tiny_vl_model, tiny_vl_processor) -> None:
    engine = HFRolloutEngine(tiny_vl_model, tiny_vl_processor, weight_version=3)
    prompts = [image_prompt("red", "p0"), image_prompt("blue", "p1")]
    groups = engine.generate(prompts, SamplingParams(num_samples_per_prompt=3, temperature=0.8, max_response_length=6,
                                                     seed=0))
    assert [g.prompt.prompt_id for g in groups] == ["p0", "p1"]
    for group in groups:
        assert group.weight_version == 3 and len(group.completions) == 3
        assert group.prompt_token_ids[-3:] == tiny_vl_processor.tokenizer.encode("<|im_start|>assistant\n")
        for c in group.completions:
            assert len(c.token_ids) == len(c.logprobs) >= 1
            assert c.finish_reason in ("stop", "length")
            if c.finish_reason == "length":
                assert len(c.token_ids) == 6
            reference = full_sequence_logprobs(tiny_vl_model, tiny_vl_processor, group.prompt, c.token_ids, 0.8)
            torch.testing.assert_close(torch.tensor(c.logprobs), reference, atol=1e-4, rtol=1e-4)


def test_same_seed_same_rollouts_and_different_seed_differs(tiny_vl_model, tiny_vl_processor) -> None:
    engine = HFRolloutEngine(tiny_vl_model, tiny_vl_processor)
    prompts = [image_prompt("green", "g")]
    a = engine.generate(prompts, SamplingParams(num_samples_per_prompt=4, temperature=1.0, max_response_length=5,
                                                seed=7))
    b = engine.generate(prompts, SamplingParams(num_samples_per_prompt=4, temperature=1.0, max_response_length=5,
                                                seed=7))
    c = engine.generate(prompts, SamplingParams(num_samples_per_prompt=4, temperature=1.0, max_response_length=5,
                                                seed=8))
    ids = lambda g: [x.token_ids for x in g[0].completions]  # noqa: E731
    assert ids(a) == ids(b)
    assert ids(a) != ids(c)


def test_stop_token_ends_completion_and_is_kept(tiny_qwen2_model, qwen_tokenizer) -> None:
    engine = HFRolloutEngine(tiny_qwen2_model, qwen_tokenizer)
    prompt = Prompt(conversation=[{"role": "user", "content": "hello"}], prompt_id="t")
    # with every token a stop token, each completion is exactly one token and finishes with "stop"
    groups = engine.generate([prompt], SamplingParams(num_samples_per_prompt=5, max_response_length=4, seed=0,
                                                      stop_token_ids=tuple(range(151936))))
    for c in groups[0].completions:
        assert c.finish_reason == "stop" and len(c.token_ids) == 1 and len(c.logprobs) == 1


def test_video_prompt(tiny_vl_model, tiny_vl_processor) -> None:
    frames = np.stack([cpt.frame_index_pattern(i, (56, 56)) for i in range(4)])
    conv = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]}]
    prompt = Prompt(conversation=conv, prompt_id="v", videos=[frames], video_fps=[2.0])
    engine = HFRolloutEngine(tiny_vl_model, tiny_vl_processor)
    groups = engine.generate([prompt, prompt], SamplingParams(num_samples_per_prompt=2, max_response_length=4, seed=1))
    assert [len(g.completions) for g in groups] == [2, 2]
    c = groups[1].completions[0]
    reference = full_sequence_logprobs(tiny_vl_model, tiny_vl_processor, prompt, c.token_ids, 1.0)
    torch.testing.assert_close(torch.tensor(c.logprobs), reference, atol=1e-4, rtol=1e-4)


def test_mixed_batch_splits_by_max_sequences(tiny_vl_model, tiny_vl_processor) -> None:
    engine = HFRolloutEngine(tiny_vl_model, tiny_vl_processor, max_batch_sequences=4)
    prompts = [image_prompt(c, c) for c in ("red", "green", "blue")]
    groups = engine.generate(prompts, SamplingParams(num_samples_per_prompt=2, max_response_length=3, seed=0,
                                                     temperature=0.0))
    # greedy: both copies of a prompt agree, and each equals a single-prompt greedy run
    for g in groups:
        assert g.completions[0].token_ids == g.completions[1].token_ids
        alone = engine.generate([g.prompt], SamplingParams(num_samples_per_prompt=1, max_response_length=3,
                                                           temperature=0.0))
        assert alone[0].completions[0].token_ids == g.completions[0].token_ids


def test_update_weights_changes_outputs_and_version(tiny_qwen2_model, qwen_tokenizer) -> None:
    engine = HFRolloutEngine(tiny_qwen2_model, qwen_tokenizer)
    other = cpt.tiny_qwen2(seed=1)
    engine.update_weights(other.named_parameters(), version=5)
    assert engine.weight_version == 5
    for (n, a), (_, b) in zip(tiny_qwen2_model.named_parameters(), other.named_parameters()):
        assert torch.equal(a, b), n
    with pytest.raises(KeyError, match="no parameter 'nope'"):
        engine.update_weights([("nope", torch.zeros(1))], version=6)


def test_top_k_one_is_greedy() -> None:
    scores = torch.tensor([[0.1, 2.0, -1.0, 0.5], [3.0, 0.0, 0.0, 0.0]])
    sampler = InverseCDFSampler(temperature=1.0, top_k=1, generator=torch.Generator().manual_seed(0))
    out = sampler(torch.zeros(2, 1, dtype=torch.long), scores)
    assert out.argmax(-1).tolist() == [1, 0]
    _, logprobs = sampler.token_logprobs()
    # the log-probs of the distribution sampled from: all mass on the one kept token
    torch.testing.assert_close(logprobs[:, 0], torch.zeros(2))


def test_sampler_frequencies_match_distribution() -> None:
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    scores = probs.log().expand(20000, 4).clone()
    sampler = InverseCDFSampler(temperature=1.0, generator=torch.Generator().manual_seed(0))
    sampler(torch.zeros(20000, 1, dtype=torch.long), scores)
    tokens, _ = sampler.token_logprobs()
    freq = torch.bincount(tokens[:, 0], minlength=4).float() / 20000
    torch.testing.assert_close(freq, probs, atol=0.015, rtol=0)
    top_p = InverseCDFSampler(temperature=1.0, top_p=0.65, generator=torch.Generator().manual_seed(0))
    top_p(torch.zeros(20000, 1, dtype=torch.long), scores)
    kept = torch.bincount(top_p.token_logprobs()[0][:, 0], minlength=4)
    assert kept[0] == 0 and kept[1] == 0  # 0.4 + 0.3 reaches 0.65: only the two largest remain


@pytest.mark.parametrize(("temperature", "top_k"), [(1.0, -1), (0.7, -1), (1.0, 40)])
def test_the_block_search_draws_the_token_of_the_full_inverse_cdf(temperature: float, top_k: int) -> None:
    """Two-level search (block sums, then one block's cumulative sum) vs the whole row's CDF in float64, for
    the same uniforms: the same token, over a vocabulary of 4 whole blocks and a partial one, and the
    log-prob of the distribution sampled from."""
    from cosmos_primitives.algo.sampling_distribution import sampling_logprobs
    from cosmos_primitives.rollout.token_sampler import BLOCK

    vocab = 4 * BLOCK + 357
    scores = torch.randn(512, vocab, generator=torch.Generator().manual_seed(1)) * 3
    scores[::3, BLOCK + 5] += 12  # some rows almost sure of one token, in the second block
    sampler = InverseCDFSampler(temperature, top_k, generator=torch.Generator().manual_seed(2))
    sampler(torch.zeros(512, 1, dtype=torch.long), scores)
    tokens, logprobs = sampler.token_logprobs()
    expected = sampling_logprobs(scores, temperature, top_k).double()
    cdf = expected.exp().cumsum(-1)
    u = torch.rand(512, 1, generator=torch.Generator().manual_seed(2)).double()
    reference = torch.searchsorted(cdf, u * cdf[:, -1:])[:, 0]
    assert torch.equal(tokens[:, 0], reference)
    torch.testing.assert_close(logprobs[:, 0].double(), expected.gather(-1, reference[:, None])[:, 0],
                               atol=2e-6, rtol=0)


def test_a_uniform_just_below_one_draws_the_last_token_the_filtered_distribution_keeps(monkeypatch) -> None:
    """Whole blocks of dropped tokens after the kept ones: the search never ends past the last kept token."""
    from cosmos_primitives.rollout.token_sampler import BLOCK

    scores = torch.zeros(2, 3 * BLOCK)
    scores[0, [3, BLOCK + 7]] = 5.0  # kept by top-k 2: token BLOCK + 7 is the last
    scores[1, [0, 1]] = 5.0
    below_one = 1.0 - 2.0 ** -24  # the largest float32 under 1
    monkeypatch.setattr(torch, "rand", lambda *shape, **kw: torch.full(shape, below_one, dtype=kw.get("dtype")))
    sampler = InverseCDFSampler(temperature=1.0, top_k=2)
    sampler(torch.zeros(2, 1, dtype=torch.long), scores)
    tokens, logprobs = sampler.token_logprobs()
    assert tokens[:, 0].tolist() == [BLOCK + 7, 1]
    torch.testing.assert_close(logprobs[:, 0], torch.full((2,), -math.log(2.0)))


def test_a_zero_uniform_draws_the_first_token_the_filtered_distribution_keeps(monkeypatch) -> None:
    """u = 0 would land on token 0 whatever its probability; a dropped token is never drawn: the first kept
    token is (the inverse CDF's limit as u falls to 0), found by a search rather than a pass over the vocabulary."""
    scores = torch.tensor([[0.1, 1.5, -1.0, 0.5, 2.0], [3.0, 0.0, 0.0, 0.0, 0.0]])
    monkeypatch.setattr(torch, "rand", lambda *shape, **kw: torch.zeros(*shape, dtype=kw.get("dtype")))
    sampler = InverseCDFSampler(temperature=1.0, top_k=2)
    out = sampler(torch.zeros(2, 1, dtype=torch.long), scores)
    # row 0 keeps tokens 1 and 4: token 1 comes first (4 is the more likely); row 1 keeps token 0 and a tie
    assert out.argmax(-1).tolist() == [1, 0]
    _, logprobs = sampler.token_logprobs()
    assert torch.isfinite(logprobs).all()
