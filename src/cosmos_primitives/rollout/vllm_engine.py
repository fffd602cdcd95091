"""``VLLMRolloutEngine``: generation with vLLM (optional ``vllm`` extra, GPU only).

UNTESTED ON THE REAL THING: vLLM cannot be installed or run on the machines this library is
developed on. The engine is tested against a stand-in module that follows vLLM's documented call
shapes (``LLM(...)``, ``LLM.generate(prompts, SamplingParams)`` returning ``RequestOutput`` objects
with ``.prompt_token_ids`` and ``.outputs[k].token_ids / .logprobs / .finish_reason / .text``,
``LLM.collective_rpc(method, args=...)`` reaching a ``worker_extension_cls``). Check it on a GPU
before relying on it.

Weights are updated through vLLM's public weight-loading path: a worker extension
(:class:`CosmosWorkerExtension`, passed to ``LLM(worker_extension_cls=...)``) whose method,
invoked with ``collective_rpc``, calls ``self.model_runner.model.load_weights(weights)``. Names are
the HF checkpoint names (``model.layers.0...``, ``visual...``); vLLM fuses q/k/v and gate/up itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from cosmos_primitives.data.prompt_inputs import render_prompt
from cosmos_primitives.data.records import Completion, Prompt, RolloutGroup, SamplingParams
from cosmos_primitives.utils.extras import require

WORKER_EXTENSION = "cosmos_primitives.rollout.vllm_engine.CosmosWorkerExtension"


class CosmosWorkerExtension:
    """Methods mixed into every vLLM worker (``worker_extension_cls``); reached by ``collective_rpc``."""

    def cosmos_load_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> int:
        model = self.model_runner.model  # type: ignore[attr-defined]
        loaded = model.load_weights(weights=named_tensors)
        return len(loaded) if loaded is not None else len(named_tensors)

    def cosmos_weight_checksums(self, names: list[str]) -> dict[str, float]:
        params = dict(self.model_runner.model.named_parameters())  # type: ignore[attr-defined]
        return {n: float(params[n].detach().double().sum()) for n in names if n in params}


class VLLMRolloutEngine:
    """``n`` completions per prompt from a vLLM ``LLM``.

    Args:
        model_path: HF folder or hub name (an exported ``safetensors/final`` folder works).
        processor: the HF processor / tokenizer, used to render the chat template.
        tensor_parallel_size: ``[rollout.parallelism] tp_size``.
        gpu_memory_utilization, enforce_eager, dtype, max_model_len, seed: passed to ``LLM``.
        llm_kwargs: anything else for ``LLM``.
    """

    def __init__(self, model_path: str, processor: Any, *, tensor_parallel_size: int = 1,
                 gpu_memory_utilization: float = 0.7, enforce_eager: bool = True, dtype: str = "bfloat16",
                 max_model_len: int | None = None, seed: int = 0, weight_version: int = 0,
                 llm_kwargs: dict[str, Any] | None = None) -> None:
        vllm = require("vllm", "vLLM rollouts")
        self._vllm = vllm
        self.processor = processor
        kwargs: dict[str, Any] = {
            "model": model_path,
            "tensor_parallel_size": tensor_parallel_size,
            "gpu_memory_utilization": gpu_memory_utilization,
            "enforce_eager": enforce_eager,
            "dtype": dtype,
            "seed": seed,
            "worker_extension_cls": WORKER_EXTENSION,
            # log-probs of the temperature-scaled distribution, as HFRolloutEngine reports them
            "logprobs_mode": "processed_logprobs",
        }
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        kwargs.update(llm_kwargs or {})
        self.llm = vllm.LLM(**kwargs)
        self.weight_version = weight_version

    def _sampling_params(self, params: SamplingParams) -> Any:
        kwargs: dict[str, Any] = {
            "n": params.n,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k if params.top_k > 0 else -1,
            "repetition_penalty": params.repetition_penalty,
            "max_tokens": params.max_new_tokens,
            "logprobs": 0,  # the sampled token's log-prob only
            "seed": params.seed,
        }
        if params.stop_token_ids:
            kwargs["stop_token_ids"] = list(params.stop_token_ids)
        return self._vllm.SamplingParams(**kwargs)

    @staticmethod
    def _request(text: str, prompt: Prompt) -> dict[str, Any]:
        request: dict[str, Any] = {"prompt": text}
        media: dict[str, Any] = {}
        if prompt.images:
            media["image"] = prompt.images if len(prompt.images) > 1 else prompt.images[0]
        if prompt.videos:
            media["video"] = prompt.videos if len(prompt.videos) > 1 else prompt.videos[0]
        if media:
            request["multi_modal_data"] = media
        if prompt.video_fps:
            request["mm_processor_kwargs"] = {"fps": prompt.video_fps[0]}
        return request

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[RolloutGroup]:
        requests = [self._request(render_prompt(self.processor, p), p) for p in prompts]
        outputs = self.llm.generate(requests, self._sampling_params(params), use_tqdm=False)
        if len(outputs) != len(prompts):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(prompts)} prompts")
        groups = []
        for prompt, out in zip(prompts, outputs):
            completions = []
            for sample in out.outputs:
                token_ids = list(sample.token_ids)
                if sample.logprobs is None:
                    raise RuntimeError("vLLM returned no log-probs although SamplingParams.logprobs=0 was set")
                logprobs = [float(step[tok].logprob) for tok, step in zip(token_ids, sample.logprobs)]
                finish = "length" if sample.finish_reason == "length" else "stop"
                completions.append(Completion(text=sample.text, token_ids=token_ids, logprobs=logprobs,
                                              finish_reason=finish))
            groups.append(RolloutGroup(prompt=prompt, prompt_token_ids=list(out.prompt_token_ids),
                                       completions=completions, weight_version=self.weight_version))
        return groups

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load HF-checkpoint-named tensors into every vLLM worker, then tag rollouts with ``version``."""
        batch = list(named_tensors)
        self.llm.collective_rpc("cosmos_load_weights", args=(batch,))
        self.weight_version = version

    def weight_checksums(self, names: Sequence[str]) -> dict[str, float]:
        """Per-tensor float64 sums on the first worker (for the first-sync equality check)."""
        return self.llm.collective_rpc("cosmos_weight_checksums", args=(list(names),))[0]
