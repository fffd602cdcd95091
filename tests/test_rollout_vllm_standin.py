"""VLLMRolloutEngine against a stand-in with vLLM's documented call shapes (vLLM cannot run here)."""

from __future__ import annotations

import sys

import pytest
import torch

from cosmos_primitives import testing as cpt
from cosmos_primitives.data.records import Prompt, SamplingParams
from cosmos_primitives.rollout.base import RolloutEngine
from cosmos_primitives.utils.extras import MissingExtraError


def test_missing_vllm_names_the_extra(monkeypatch: pytest.MonkeyPatch, qwen_tokenizer) -> None:
    from cosmos_primitives.rollout.vllm_engine import VLLMRolloutEngine

    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(MissingExtraError, match=r"cosmos_primitives\[vllm\]"):
        VLLMRolloutEngine("/nowhere", qwen_tokenizer)


def test_generate_and_update_weights_through_documented_calls(standin_vllm, tiny_qwen2_dir, qwen_tokenizer) -> None:
    from cosmos_primitives.rollout.vllm_engine import WORKER_EXTENSION, VLLMRolloutEngine

    engine = VLLMRolloutEngine(str(tiny_qwen2_dir), qwen_tokenizer, tensor_parallel_size=1, seed=3)
    assert isinstance(engine, RolloutEngine)
    llm_kwargs = standin_vllm.CALLS[0][1]
    assert llm_kwargs["worker_extension_cls"] == WORKER_EXTENSION
    assert llm_kwargs["logprobs_mode"] == "processed_logprobs"
    prompts = [Prompt(conversation=[{"role": "user", "content": "hi"}], prompt_id="a"),
               Prompt(conversation=[{"role": "user", "content": "bye"}], prompt_id="b")]
    groups = engine.generate(prompts, SamplingParams(n=3, temperature=0.7, max_new_tokens=4, seed=1))
    assert [g.prompt.prompt_id for g in groups] == ["a", "b"]
    for g in groups:
        assert len(g.completions) == 3 and g.weight_version == 0
        assert g.prompt_token_ids[-3:] == qwen_tokenizer.encode("<|im_start|>assistant\n")
        for c in g.completions:
            assert len(c.token_ids) == len(c.logprobs) and all(lp <= 0 for lp in c.logprobs)

    new = cpt.tiny_qwen2(seed=5)
    engine.update_weights(new.state_dict().items(), version=4)
    assert engine.weight_version == 4
    assert ("collective_rpc", "cosmos_load_weights") in standin_vllm.CALLS
    for name, p in engine.llm.hf_model.named_parameters():
        assert torch.equal(p, new.state_dict()[name]), name
    sums = engine.weight_checksums(["model.norm.weight"])
    assert sums["model.norm.weight"] == pytest.approx(float(new.model.norm.weight.detach().double().sum()))
