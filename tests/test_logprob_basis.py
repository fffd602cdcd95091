"""One log-prob basis (issue 29): the HF engine reports log-probs of the distribution it sampled from
(temperature, then top-k, then top-p, renormalised), and the trainer's recompute scores the same
distribution, so at equal weights the two agree with top-k / top-p on."""

from __future__ import annotations

import pytest
import torch

from cosmos_primitives import testing as cpt
from cosmos_primitives.data.prompt_inputs import encode_prompts
from cosmos_primitives.data.records import Prompt, SamplingParams
from cosmos_primitives.rollout.hf_engine import HFRolloutEngine
from cosmos_primitives.rollout.token_sampler import InverseCDFSampler


def reference_filtered_logprob(logits: torch.Tensor, token: int, temperature: float, top_k: int,
                               top_p: float) -> float:
    """Hand-written reference for one row: sort, keep top-k, renormalise, keep while the mass before < top_p."""
    probs = torch.softmax(logits.double() / temperature, -1)
    values, order = probs.sort(descending=True)
    if top_k > 0:
        values, order = values[:top_k], order[:top_k]
    values = values / values.sum()
    kept, mass = [], 0.0
    for value, index in zip(values.tolist(), order.tolist()):
        if mass >= top_p:
            break
        kept.append((index, value))
        mass += value
    total = sum(v for _, v in kept)
    chosen = dict(kept)
    return float(torch.tensor(chosen[token] / total).log()) if token in chosen else float("-inf")


def completion_batch(processor, prompt: Prompt, completion_ids: list[int]) -> tuple[dict, torch.Tensor]:
    """The trainer's view of one rollout: prompt + completion ids, completion mask ``[1, T]``."""
    batch = encode_prompts(processor, [prompt])
    n = len(completion_ids)
    ids = torch.cat([batch["input_ids"], torch.tensor([completion_ids])], dim=1)
    batch["attention_mask"] = torch.ones_like(ids)
    if "mm_token_type_ids" in batch:
        batch["mm_token_type_ids"] = torch.cat([batch["mm_token_type_ids"], torch.zeros(1, n, dtype=torch.long)], 1)
    batch["input_ids"] = ids
    mask = torch.zeros_like(ids)
    mask[:, -n:] = 1
    return batch, mask


def test_sampler_reports_logprobs_of_the_filtered_distribution() -> None:
    scores = torch.randn(64, 50, generator=torch.Generator().manual_seed(0)) * 2
    sampler = InverseCDFSampler(temperature=0.7, top_k=10, top_p=0.8, generator=torch.Generator().manual_seed(1))
    sampler(torch.zeros(64, 1, dtype=torch.long), scores)
    tokens, logprobs = sampler.token_logprobs()
    expected = [reference_filtered_logprob(scores[i], int(tokens[i, 0]), 0.7, 10, 0.8) for i in range(64)]
    torch.testing.assert_close(logprobs[:, 0], torch.tensor(expected, dtype=torch.float32), atol=1e-5, rtol=1e-5)


def test_filtered_logprobs_match_the_reference() -> None:
    from cosmos_primitives.algo.sampling_distribution import sampling_logprobs

    logits = torch.randn(16, 40, generator=torch.Generator().manual_seed(2)) * 3
    for top_k, top_p in ((-1, 0.9), (5, 1.0), (7, 0.6)):
        out = sampling_logprobs(logits, 1.3, top_k, top_p)
        for row in range(16):
            for token in range(40):
                ref = reference_filtered_logprob(logits[row], token, 1.3, top_k, top_p)
                got = float(out[row, token])
                assert (got == ref == float("-inf")) or abs(got - ref) < 1e-5, (top_k, top_p, row, token, got, ref)


@pytest.mark.parametrize("kind", ["text", "image"])
def test_hf_engine_logprobs_equal_trainer_recompute_with_top_k_top_p(kind, tiny_qwen2_model, qwen_tokenizer,
                                                                      tiny_vl_model, tiny_vl_processor) -> None:
    from cosmos_primitives.policy.lm_policy import token_logprobs

    if kind == "text":
        model, processor = tiny_qwen2_model, qwen_tokenizer
        prompt = Prompt(conversation=[{"role": "user", "content": "count to five"}], prompt_id="t")
    else:
        model, processor = tiny_vl_model, tiny_vl_processor
        conv = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Is it red?"}]}]
        prompt = Prompt(conversation=conv, prompt_id="i", images=[cpt.color_image("red")])
    temperature, top_k, top_p = 0.9, 20, 0.9
    engine = HFRolloutEngine(model, processor)
    groups = engine.generate([prompt], SamplingParams(num_samples_per_prompt=4, temperature=temperature, top_k=top_k,
                                                      top_p=top_p,
                                                      max_response_length=6, seed=3))
    for completion in groups[0].completions:
        batch, mask = completion_batch(processor, prompt, completion.token_ids)
        n = len(completion.token_ids)
        with torch.no_grad():
            logits = model(**batch).logits[0, -n - 1:-1].float()
        reference = [reference_filtered_logprob(logits[i], completion.token_ids[i], temperature, top_k, top_p)
                     for i in range(n)]
        torch.testing.assert_close(torch.tensor(completion.logprobs), torch.tensor(reference, dtype=torch.float32),
                                   atol=1e-4, rtol=1e-4)
        with torch.no_grad():
            trainer = token_logprobs(model, batch, mask=mask, temperature=temperature, top_k=top_k,
                                     top_p=top_p).logprobs[0, -n:]
        torch.testing.assert_close(torch.tensor(completion.logprobs), trainer, atol=1e-4, rtol=1e-4)


def test_filtered_head_values_and_gradients_match_full_logits() -> None:
    from cosmos_primitives.algo.sampling_distribution import filtered_token_logprobs_from_hidden, sampling_logprobs

    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(2, 7, 8, generator=g, requires_grad=True)
    weight = torch.randn(30, 8, generator=g, requires_grad=True)
    ids = torch.randint(0, 30, (2, 7), generator=g)
    mask = torch.ones(2, 7)
    out = filtered_token_logprobs_from_hidden(hidden, weight, ids, top_k=6, top_p=0.8, mask=mask, chunk_size=5,
                                              with_entropy=True)
    (out.logprobs.sum() + out.entropy.sum()).backward()
    grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad, weight.grad = None, None
    logits = hidden[:, :-1] @ weight.t()
    logp = sampling_logprobs(logits.reshape(-1, 30), 1.0, 6, 0.8, always_keep=ids[:, 1:].reshape(-1))
    picked = logp.gather(-1, ids[:, 1:].reshape(-1, 1)).view(2, 6)
    p = logp.exp()
    entropy = -(p * logp.masked_fill(p == 0, 0.0)).sum(-1).view(2, 6)
    torch.testing.assert_close(out.logprobs[:, 1:], picked)
    torch.testing.assert_close(out.entropy[:, 1:], entropy)
    (picked.sum() + entropy.sum()).backward()
    torch.testing.assert_close(grads[0], hidden.grad)
    torch.testing.assert_close(grads[1], weight.grad)
    # the scored token is always kept: a finite log-prob even where top-k would drop it
    assert torch.isfinite(out.logprobs).all()
