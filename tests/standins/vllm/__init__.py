"""A stand-in for the parts of vLLM that ``VLLMRolloutEngine`` uses, following vLLM's documented
call shapes (``LLM``, ``SamplingParams``, ``RequestOutput`` / ``CompletionOutput`` / ``Logprob``,
``collective_rpc`` with a ``worker_extension_cls``). It samples from a small HF causal LM on the
CPU so that outputs and log-probs are real. It is NOT vLLM: the real engine is untested here."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import torch

_LLM_KWARGS = {
    "model", "tensor_parallel_size", "gpu_memory_utilization", "enforce_eager", "dtype", "seed",
    "worker_extension_cls", "logprobs_mode", "max_model_len",
}
_LOGPROBS_MODES = {"raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits"}
CALLS: list[tuple[str, Any]] = []


@dataclasses.dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    repetition_penalty: float = 1.0
    max_tokens: int = 16
    logprobs: int | None = None
    seed: int | None = None
    stop_token_ids: list[int] | None = None


@dataclasses.dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclasses.dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None


@dataclasses.dataclass
class RequestOutput:
    request_id: str
    prompt: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True


class _StandInModel:
    """The worker's ``model_runner.model``: HF names on disk == in memory for Qwen2."""

    def __init__(self, hf_model: Any) -> None:
        self.hf_model = hf_model

    def named_parameters(self):
        return self.hf_model.named_parameters()

    @torch.no_grad()
    def load_weights(self, weights):
        params = dict(self.hf_model.named_parameters())
        loaded = set()
        tied = self.hf_model.config.tie_word_embeddings
        for name, tensor in weights:
            if tied and name == "lm_head.weight":  # vLLM skips the tied head as well
                continue
            params[name].copy_(tensor)
            loaded.add(name)
        return loaded


class _ModelRunner:
    def __init__(self, model: _StandInModel) -> None:
        self.model = model


class LLM:
    def __init__(self, **kwargs: Any) -> None:
        unknown = set(kwargs) - _LLM_KWARGS
        if unknown:
            raise TypeError(f"stand-in LLM got unexpected arguments {sorted(unknown)}")
        if kwargs.get("logprobs_mode", "raw_logprobs") not in _LOGPROBS_MODES:
            raise ValueError(f"bad logprobs_mode {kwargs['logprobs_mode']!r}")
        CALLS.append(("LLM", kwargs))
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.hf_model = AutoModelForCausalLM.from_pretrained(kwargs["model"]).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(kwargs["model"])
        module, _, cls = kwargs["worker_extension_cls"].rpartition(".")
        extension = getattr(importlib.import_module(module), cls)
        worker_cls = type("StandInWorker", (extension,), {})
        self.worker = worker_cls()
        self.worker.model_runner = _ModelRunner(_StandInModel(self.hf_model))

    def collective_rpc(self, method: str, timeout: float | None = None, args: tuple = (), kwargs: dict | None = None):
        CALLS.append(("collective_rpc", method))
        return [getattr(self.worker, method)(*args, **(kwargs or {}))]

    @torch.no_grad()
    def generate(self, prompts: list[dict[str, Any]], sampling_params: SamplingParams, use_tqdm: bool = True):
        CALLS.append(("generate", len(prompts)))
        gen = torch.Generator().manual_seed(sampling_params.seed or 0)
        eos = set(sampling_params.stop_token_ids or []) | {self.tokenizer.convert_tokens_to_ids("<|im_end|>")}
        results = []
        for i, request in enumerate(prompts):
            prompt_ids = self.tokenizer(request["prompt"])["input_ids"]
            outs = []
            for k in range(sampling_params.n):
                ids = list(prompt_ids)
                token_ids, logprobs, finish = [], [], "length"
                for _ in range(sampling_params.max_tokens):
                    logits = self.hf_model(input_ids=torch.tensor([ids])).logits[0, -1].float()
                    logp = torch.log_softmax(logits / sampling_params.temperature, -1)
                    tok = int(torch.multinomial(logp.exp(), 1, generator=gen))
                    token_ids.append(tok)
                    logprobs.append({tok: Logprob(logprob=float(logp[tok]), rank=1)})
                    ids.append(tok)
                    if tok in eos:
                        finish = "stop"
                        break
                text_ids = token_ids[:-1] if finish == "stop" else token_ids
                outs.append(CompletionOutput(k, self.tokenizer.decode(text_ids), token_ids, None, logprobs, finish))
            results.append(RequestOutput(str(i), request["prompt"], prompt_ids, outs))
        return results
