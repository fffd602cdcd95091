"""``HFRolloutEngine``: batched HF ``generate`` with a KV cache, on CPU or GPU."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from cosmos_primitives.data.prompt_inputs import encode_prompts, repeat_batch
from cosmos_primitives.data.records import Completion, Prompt, RolloutGroup, SamplingParams
from cosmos_primitives.rollout.token_sampler import InverseCDFSampler


class HFRolloutEngine:
    """Generate ``n`` completions per prompt with a transformers model (text or Qwen2.5-VL).

    The engine keeps its own reference to ``model`` (eval mode, no grad). In the colocated case
    ``cp.sync`` keeps that model's weights equal to the trainer's (sharing storage where it can)
    and calls :meth:`update_weights` or bumps :attr:`weight_version`.

    Args:
        model: a HF ``...ForCausalLM`` / ``Qwen2_5_VLForConditionalGeneration``.
        processor: its processor (VLM) or tokenizer (text); conversation prompts need its chat
            template, plain-text prompts are tokenized as they are.
        max_batch_sequences: sequences (prompts x n) per ``generate`` call.
        stop_token_ids: default stop tokens (default: the model's EOS ids, e.g. ``<|im_end|>``).
        weight_version: version tag of the current weights.
    """

    def __init__(self, model: Any, processor: Any, *, max_batch_sequences: int = 64,
                 stop_token_ids: Sequence[int] | None = None, weight_version: int = 0) -> None:
        self.model = model
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.max_batch_sequences = max_batch_sequences
        eos = stop_token_ids or model.generation_config.eos_token_id or self.tokenizer.eos_token_id
        self.stop_token_ids = tuple(eos if isinstance(eos, (list, tuple)) else [eos])
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else self.stop_token_ids[0]
        self.weight_version = weight_version

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[RolloutGroup]:
        """``params.n`` completions per prompt (prompt order kept; copies of a prompt adjacent).

        The same ``params.seed`` on the same device and engine settings gives the same rollouts;
        the uniforms are drawn on the model's device, so a CPU and a GPU run of one seed differ.
        """
        if params.n < 1:
            raise ValueError(f"SamplingParams.n must be >= 1, got {params.n}")
        generator = torch.Generator(device=self.device)
        if params.seed is not None:
            generator.manual_seed(params.seed)
        else:
            generator.seed()  # a fresh seed for this generator only; torch's global RNG is left alone
        per_call = max(1, self.max_batch_sequences // params.n)
        was_training = self.model.training
        self.model.eval()
        try:
            groups: list[RolloutGroup] = []
            for start in range(0, len(prompts), per_call):
                groups.extend(self._generate_chunk(prompts[start:start + per_call], params, generator))
            return groups
        finally:
            self.model.train(was_training)

    def _generate_chunk(self, prompts: Sequence[Prompt], params: SamplingParams,
                        generator: torch.Generator) -> list[RolloutGroup]:
        batch = encode_prompts(self.processor, prompts)
        prompt_ids = [row[mask.bool()].tolist() for row, mask in zip(batch["input_ids"], batch["attention_mask"])]
        batch = repeat_batch(batch, prompts, params.n)
        batch = {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in batch.items()}
        sampler = InverseCDFSampler(params.temperature, params.top_k, params.top_p, generator)
        stop = tuple(params.stop_token_ids) or self.stop_token_ids
        kwargs: dict[str, Any] = {}
        if params.repetition_penalty != 1.0:
            kwargs["repetition_penalty"] = params.repetition_penalty
        output = self.model.generate(
            **batch,
            max_new_tokens=params.max_new_tokens,
            do_sample=False,
            logits_processor=[sampler],
            eos_token_id=list(stop),
            pad_token_id=self.pad_token_id,
            **kwargs,
        )
        _, logprobs = sampler.token_logprobs()
        prompt_len = batch["input_ids"].shape[1]
        # step i of the sampler produced generated[:, i]; after a row stops, generate() pads it
        generated = output[:, prompt_len:].cpu()
        groups = []
        for p_index, prompt in enumerate(prompts):
            completions = []
            for k in range(params.n):
                row = p_index * params.n + k
                completions.append(self._completion(generated[row], logprobs[row], stop, params.max_new_tokens))
            groups.append(RolloutGroup(prompt=prompt, prompt_token_ids=prompt_ids[p_index],
                                       completions=completions, weight_version=self.weight_version))
        return groups

    def _completion(self, ids: torch.Tensor, logprobs: torch.Tensor, stop: tuple[int, ...],
                    max_new_tokens: int) -> Completion:
        ids_list = ids.tolist()
        end = next((i for i, t in enumerate(ids_list) if t in stop), None)
        if end is None:
            token_ids, finish = ids_list[:max_new_tokens], "length"
            text_ids = token_ids
        else:
            token_ids, finish = ids_list[: end + 1], "stop"
            text_ids = token_ids[:-1]
        text = self.tokenizer.decode(text_ids, skip_special_tokens=False)
        return Completion(text=text, token_ids=token_ids, logprobs=logprobs[: len(token_ids)].tolist(),
                          finish_reason=finish)

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Copy tensors into the engine model by ``named_parameters`` / buffer name; unknown names fail."""
        params = dict(self.model.named_parameters())
        params.update(dict(self.model.named_buffers()))
        for name, tensor in named_tensors:
            if name not in params:
                raise KeyError(f"update_weights: the engine model has no parameter {name!r}")
            target = params[name]
            if target.shape != tensor.shape:
                raise ValueError(f"update_weights: {name!r} has shape {tuple(target.shape)} in the engine, "
                                 f"got {tuple(tensor.shape)}")
            if target.data_ptr() != tensor.data_ptr():
                target.copy_(tensor)
        self.weight_version = version
