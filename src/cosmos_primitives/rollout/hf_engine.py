"""``HFRolloutEngine``: batched HF ``generate`` with a KV cache, on CPU or GPU.

Two ways to decode. The default grows a dynamic KV cache in each call and runs every decode step
eagerly. ``static_cache=True`` decodes into one preallocated ``StaticCache`` kept across calls, with
a constant number of rows per call; on CUDA the decode step then runs through ``torch.compile``
with CUDA graphs (``mode="reduce-overhead"``): one graph replay instead of hundreds of kernel
launches per step. The compiled step sees only the cache's shape ``[rows, heads, max_cache_len,
head_dim]`` (the prompt is prefilled eagerly, and ``generate`` builds the attention mask at the
cache's length outside the graph), so prompts need no padding to fixed lengths: the cache length is
rounded up to a multiple of ``cache_len_multiple`` and only ever grows, so the number of graphs is
the number of times it grew.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from transformers import StoppingCriteria

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
        static_cache: decode into a static KV cache kept across calls (``[rollout] hf_static_cache``),
            compiled with CUDA graphs on CUDA. Every call then has ``max_batch_sequences // k * k``
            rows (``k = params.num_samples_per_prompt``): a short last chunk is padded with copies of
            its last prompt, whose rows stop after one token and are dropped. The cache stays
            allocated between calls (``rows x max_cache_len x layers x 2 x kv_heads x head_dim``
            elements in the model's dtype), also while a colocated trainer steps. Off by default until
            measured on a GPU.
        cache_len_multiple: the static cache holds ``prompt + max_response_length`` tokens rounded up to
            this multiple (a longer request grows it: one more compiled graph).
        compile_config: ``transformers.CompileConfig`` of the static-cache decode step; default:
            ``CompileConfig(dynamic=False, mode="reduce-overhead")`` on CUDA and no compile
            elsewhere. One given here compiles on any device (on a CPU: ``backend="eager"``
            checks the graph without inductor).
    """

    def __init__(self, model: Any, processor: Any, *, max_batch_sequences: int = 64,
                 stop_token_ids: Sequence[int] | None = None, weight_version: int = 0,
                 static_cache: bool = False, cache_len_multiple: int = 256, compile_config: Any = None) -> None:
        if cache_len_multiple < 1:
            raise ValueError(f"HFRolloutEngine: cache_len_multiple must be >= 1, got {cache_len_multiple}")
        self.model = model
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.max_batch_sequences = max_batch_sequences
        eos = stop_token_ids or model.generation_config.eos_token_id or self.tokenizer.eos_token_id
        self.stop_token_ids = tuple(eos if isinstance(eos, (list, tuple)) else [eos])
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else self.stop_token_ids[0]
        self.weight_version = weight_version
        self.static_cache = static_cache
        self.cache_len_multiple = cache_len_multiple
        self.compile_config = compile_config
        self._cache: Any = None  # the StaticCache reused across calls
        self._cache_shape: tuple[int, int] | None = None  # its (rows, max_cache_len)
        self._cache_device: torch.device | None = None
        self._resolved_compile: dict[str, Any] = {}  # device type -> CompileConfig or None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def static_cache_shape(self) -> tuple[int, int] | None:
        """``(rows, max_cache_len)`` of the static cache held now (None: none yet, or ``static_cache`` off)."""
        return self._cache_shape

    @torch.no_grad()
    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[RolloutGroup]:
        """``params.num_samples_per_prompt`` completions per prompt (prompt order kept; copies of a prompt adjacent).

        The same ``params.seed`` on the same device and engine settings gives the same rollouts;
        the uniforms are drawn on the model's device, so a CPU and a GPU run of one seed differ.
        """
        if params.num_samples_per_prompt < 1:
            raise ValueError(f"SamplingParams.num_samples_per_prompt must be >= 1, got {params.num_samples_per_prompt}")
        generator = torch.Generator(device=self.device)
        if params.seed is not None:
            generator.manual_seed(params.seed)
        else:
            generator.seed()  # a fresh seed for this generator only; torch's global RNG is left alone
        per_call = max(1, self.max_batch_sequences // params.num_samples_per_prompt)
        was_training = self.model.training
        self.model.eval()
        try:
            groups: list[RolloutGroup] = []
            for start in range(0, len(prompts), per_call):
                groups.extend(self._generate_chunk(prompts[start:start + per_call], params, generator, per_call))
            return groups
        finally:
            self.model.train(was_training)

    def _generate_chunk(self, prompts: Sequence[Prompt], params: SamplingParams, generator: torch.Generator,
                        per_call: int) -> list[RolloutGroup]:
        real_prompts = len(prompts)
        if self.static_cache and real_prompts < per_call:
            # a constant number of rows keeps the compiled decode step's shapes (and its graph) fixed
            prompts = list(prompts) + [prompts[-1]] * (per_call - real_prompts)
        batch = encode_prompts(self.processor, prompts)
        prompt_ids = [row[mask.bool()].tolist()
                      for row, mask in zip(batch["input_ids"][:real_prompts], batch["attention_mask"][:real_prompts])]
        batch = repeat_batch(batch, prompts, params.num_samples_per_prompt)
        batch = {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in batch.items()}
        sampler = InverseCDFSampler(params.temperature, params.top_k, params.top_p, generator)
        stop = tuple(params.stop_token_ids) or self.stop_token_ids
        kwargs: dict[str, Any] = {}
        if params.repetition_penalty != 1.0:
            kwargs["repetition_penalty"] = params.repetition_penalty
        if self.static_cache:
            rows, prompt_len = batch["input_ids"].shape
            kwargs.update(self._static_cache_kwargs(rows, prompt_len + params.max_response_length,
                                                    real_rows=real_prompts * params.num_samples_per_prompt))
        output = self.model.generate(
            **batch,
            max_new_tokens=params.max_response_length,
            do_sample=False,
            logits_processor=[sampler],
            eos_token_id=list(stop),
            pad_token_id=self.pad_token_id,
            use_cache=True,  # a config saved for training may say use_cache=false
            **kwargs,
        )
        _, logprobs = sampler.token_logprobs()
        prompt_len = batch["input_ids"].shape[1]
        # step i of the sampler produced generated[:, i]; after a row stops, generate() pads it
        generated = output[:real_prompts * params.num_samples_per_prompt, prompt_len:].cpu()
        groups = []
        for p_index, prompt in enumerate(prompts[:real_prompts]):
            completions = []
            for k in range(params.num_samples_per_prompt):
                row = p_index * params.num_samples_per_prompt + k
                completions.append(self._completion(generated[row], logprobs[row], stop, params.max_response_length))
            groups.append(RolloutGroup(prompt=prompt, prompt_token_ids=prompt_ids[p_index],
                                       completions=completions, weight_version=self.weight_version))
        return groups

    def _static_cache_kwargs(self, rows: int, needed: int, real_rows: int) -> dict[str, Any]:
        """``generate`` keyword arguments decoding ``rows`` sequences of up to ``needed`` tokens
        (prompt + new) into the engine's static cache, allocated or grown here."""
        from transformers import StaticCache, StoppingCriteriaList

        held = self._cache_shape
        if held is None or held[0] != rows or held[1] < needed or self._cache_device != self.device:
            cache_len = -(-needed // self.cache_len_multiple) * self.cache_len_multiple
            if held is not None and held[0] == rows:
                cache_len = max(cache_len, held[1])
            self._cache = None  # let the old cache go before the new one is allocated
            self._cache = StaticCache(config=self.model.config, max_cache_len=cache_len)
            self._cache_shape = (rows, cache_len)
            self._cache_device = self.device
        else:
            # zeroed in place: the compiled graph captured these tensors' addresses
            self._cache.reset()
        kwargs: dict[str, Any] = {_cache_kwarg(): self._cache}
        if getattr(self.model.generation_config, "cache_implementation", None) is not None:
            kwargs["cache_implementation"] = None  # generate refuses a cache object beside a cache_implementation
        if real_rows < rows:
            kwargs["stopping_criteria"] = StoppingCriteriaList([_PaddingRowsStop(real_rows, rows, self.device)])
        compile_config = self._compile_config()
        if compile_config is not None:
            kwargs["compile_config"] = compile_config
        return kwargs

    def _compile_config(self) -> Any:
        """The ``CompileConfig`` of the decode step on this device, or None (no compile); built once,
        since ``generate`` compiles anew whenever the config it gets differs from the last one."""
        device_type = self.device.type
        if device_type not in self._resolved_compile:
            if self.compile_config is not None:
                config = copy.copy(self.compile_config)
                # transformers' (private) flag to compile on devices it would skip, such as the CPU (5.17 to 5.24)
                config._compile_all_devices = True
            elif device_type == "cuda":
                from transformers import CompileConfig

                # dynamic=False: a grown cache gets its own static graph rather than a dynamic-shape one
                config = CompileConfig(dynamic=False, mode="reduce-overhead")
            else:
                config = None
            self._resolved_compile[device_type] = config
        return self._resolved_compile[device_type]

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
        """Copy tensors into the engine model by ``named_parameters`` / buffer name; unknown names fail.

        The copy goes into each parameter's existing storage, so a compiled decode step's CUDA graph
        (which captured those addresses) reads the new values. A sync that instead rebinds a
        parameter to other storage (``cp.sync.InProcessSync`` sharing the trainer's tensors does so
        on its first sync) makes torch re-record the graph on the next call: correct, one recording
        slower.
        """
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


class _PaddingRowsStop(StoppingCriteria):
    """A ``StoppingCriteria`` marking the padding rows ``[real_rows, rows)`` finished from the first
    step, so they never keep ``generate`` running after the real rows stopped (no host sync: the
    mask is made once, on the device)."""

    def __init__(self, real_rows: int, rows: int, device: torch.device) -> None:
        self.done = torch.arange(rows, device=device) >= real_rows  # [rows] bool

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        return self.done


def _cache_kwarg() -> str:
    """The ``generate`` keyword taking a cache object: ``cache`` in transformers >= 5.2x (where
    ``past_key_values`` is a deprecated alias), ``past_key_values`` before."""
    from transformers.generation import utils

    return "cache" if "cache" in getattr(utils, "ALL_CACHE_NAMES", ()) else "past_key_values"
