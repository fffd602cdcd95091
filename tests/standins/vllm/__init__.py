"""A stand-in for the parts of vLLM that ``VLLMRolloutEngine`` uses. It is NOT vLLM: the real engine is
untested here. It samples from a small HF model on the CPU so that outputs and log-probs are real, and
models the documented behaviours the adapter depends on, as vLLM 0.20 - 0.33 has them:

- ``vllm/envs.py`` ``VLLM_ENABLE_V1_MULTIPROCESSING`` (default ``1``) and ``vllm/v1/engine/core_client.py``:
  with multiprocessing on, the engine core (executor, worker, model) lives in another process; every
  ``collective_rpc`` goes through a serializer (here: pickle; tensors are copied and their bytes are
  recorded in :data:`SERIALIZED`), and ``LLM.llm_engine`` has no ``model_executor``. With it off
  (``InprocClient``), ``collective_rpc`` calls the worker directly and
  ``llm.llm_engine.model_executor.driver_worker.worker.model_runner.model`` is the model.
- ``vllm/v1/executor/uniproc_executor.py``: the uni-process executor takes device index 0 (of the
  ``device`` given, default ``cuda``); ``ExecutorWithExternalLauncher`` asserts multiprocessing is off
  and takes ``RANK`` / ``LOCAL_RANK`` from the environment (``env://``: ``MASTER_ADDR`` / ``MASTER_PORT``);
  ``vllm/distributed/parallel_state.py`` builds vLLM's world over torch's default group when one
  exists (all its ranks), else initialises one of ``tensor_parallel_size`` ranks; the external launcher
  needs a ``seed`` (``ModelConfig.verify_with_parallel_config``).
- the start-up memory check of ``vllm/v1/worker/gpu_worker.py``: ``gpu_memory_utilization`` x total
  memory must be free when the engine starts (:data:`GPU` sets what other users of the GPU hold).
- automatic prefix caching (on by default in V1): a prompt whose prefix was computed before reuses
  that KV cache, computed with whatever weights were loaded then, until ``reset_prefix_cache()``.
- sleep mode (``enable_sleep_mode=True``): ``sleep(level=1)`` offloads the weights and drops the KV
  cache, ``wake_up(tags)`` brings back ``"weights"`` and/or ``"kv_cache"``; the model cannot be
  written or run while asleep.
- parameter names: ``vllm/model_executor/models/qwen2.py`` / ``qwen3.py`` / ``qwen2_5_vl.py`` /
  ``qwen3_vl.py``. The in-memory model fuses ``q/k/v_proj`` into ``qkv_proj`` and ``gate/up_proj`` into
  ``gate_up_proj`` (the vision MLP of Qwen2.5-VL too; Qwen3-VL's vision MLP is ungated ``linear_fc1`` /
  ``linear_fc2`` and stays as it is); both VL models nest the language model as ``language_model.model.*``
  and hold the vision tower as ``visual.*``; a tied ``lm_head`` is not a parameter of its own.
  ``load_weights`` takes checkpoint names (each model's ``hf_to_vllm_mapper`` prefixes, :data:`HF_TO_VLLM`,
  and ``stacked_params_mapping``) and returns the vLLM names it loaded; a name no rule maps and the model
  does not hold is a ``KeyError``, as in vLLM.
- tensor parallelism under the external launcher (``vllm/distributed/parallel_state.py``
  ``initialize_model_parallel``: ranks laid out "ExternalDP x DP x PP x PCP x TP", so a TP group is
  ``tensor_parallel_size`` consecutive ranks of torch's default group and the world must divide by it);
  each rank's model holds only its shard of every weight, and ``load_weights`` takes FULL checkpoint
  tensors and keeps this rank's slice (``vllm/model_executor/layers/linear.py``: column-parallel
  ``qkv_proj`` / ``gate_up_proj`` / ``lm_head`` / ``embed_tokens`` cut along dim 0 per fused part,
  row-parallel ``o_proj`` / ``down_proj`` along dim 1, norms whole). Every rank of a TP group must
  submit the same requests with the same sampling seeds (each rank runs its own scheduler and sampler;
  the stand-in checks this instead of deadlocking or diverging). Simplifications: the stand-in
  computes by gathering the shards into one full model before each ``generate`` (same values, not
  vLLM's sharded kernels); a VL model's vision tower is held whole; head counts and the vocabulary must
  divide by the TP size (vLLM would replicate KV heads and pad the vocabulary). Without the external
  launcher, ``tensor_parallel_size > 1`` (vLLM's multiprocessing executor) is not modelled.
- ``vllm/entrypoints/llm.py`` ``LLM.generate``: ``sampling_params`` is one object for every prompt or
  a list paired with the prompts; the stand-in draws from one generator per distinct object, in
  request order.
- ``vllm/sampling_params.py``: ``top_k`` 0 (default) or -1 disables it; ``vllm/outputs.py``:
  ``CompletionOutput.finish_reason`` is ``"stop"``, ``"length"`` or ``"abort"``; a video item is
  ``frames`` or ``(frames, metadata)`` with the metadata's ``fps``; ``mm_processor_kwargs["fps"]``
  applies to every video of the prompt.
- Qwen3-VL media (``vllm/model_executor/models/qwen3_vl.py``, ``Qwen3VLMultiModalProcessor``): a video
  must come with its metadata (``video_needs_metadata=True``); its frames go through the model's video
  processor without resampling unless the metadata says ``do_sample_frames``; the prompt's
  ``<|vision_start|><|video_pad|><|vision_end|>`` is replaced WHOLE (``PromptReplacement`` target) by one
  block per temporal patch: the tokens of ``<{t:.1f} seconds>`` (``_get_video_second_idx`` /
  ``_calculate_timestamps``: the mean of the patch's source frame indices over the source fps), then
  ``<|vision_start|>``, ``h * w / merge**2`` video pads, ``<|vision_end|>``; each ``<|image_pad|>`` by
  ``t * h * w / merge**2`` image pads. ``RequestOutput.prompt_token_ids`` is that expanded prompt, and
  the model runs it with the media. (transformers 5's ``Qwen3VLProcessor`` keeps the template's outer
  ``<|vision_start|>`` / ``<|vision_end|>`` around a video: its prompt is two tokens longer per video.)
  A prompt with media is not prefix-cached here (vLLM keys such blocks by the media's hash).
- Qwen2.5-VL media (``qwen2_vl.py`` ``_get_prompt_updates``, which Qwen2.5-VL uses): each
  ``<|image_pad|>`` / ``<|video_pad|>`` becomes ``t * h * w / merge**2`` pads; a video is processed at
  the fps its metadata gives (``second_per_grid_ts = temporal_patch_size / fps``; 24 fps before 0.31,
  below). Text models take the prompt alone.
- token prompts with media (``{"prompt_token_ids": ..., "multi_modal_data": ...}``): placeholders are
  matched as ``vllm/multimodal/processing/processor.py`` ``_apply_matches`` does for text and token
  prompts alike (vLLM never lets the HF processor expand a token prompt): item ``k`` takes the first
  target at or after item ``k - 1``'s; placeholder tokens left over would be embedded as text by vLLM,
  and the stand-in refuses them (already expanded runs of pads in the ids, say).

Second pass (issue 29); behaviours that change between releases follow :data:`__version__` (set it
in a test to model an older release; :func:`reset` puts back the newest):

- Qwen2.5-VL video metadata (``Qwen2_5_VLMultiModalProcessor``'s data parser): before 0.31 it does
  not ask for video metadata (``video_needs_metadata`` off), so a ``(frames, metadata)`` item loses its
  metadata and transformers 5's processor falls back to ``VideoMetadata.sampled_fps`` = 24 fps;
  Qwen3-VL's parser always keeps it. The fps each video is processed at is recorded in :data:`CALLS`.
- the multimodal encoder cache (``vllm/v1/core/encoder_cache_manager.py``): encoder outputs are keyed
  by the media's hash only (``mm_hash``), so a repeated image / video reuses the embedding computed with
  the weights loaded then, until ``reset_encoder_cache()`` (or sleep, which drops it); the stand-in
  records, per media item, a fingerprint of the weights its embedding came from.
- per-request seeds (``vllm/v1/worker/gpu_input_batch.py``: one ``torch.Generator`` per seeded request;
  ``vllm/v1/engine/parallel_sampling.py``: child ``k`` of an ``n > 1`` request is seeded ``seed + k``);
  unseeded requests draw from the engine's one generator (seeded from ``LLM(seed=...)``).
- log-probs (``vllm/v1/sample/ops/topk_topp_sampler.py``): ``processed_logprobs`` is the log-softmax of
  the logits after temperature, top-k and top-p masking (so it is renormalised over the kept tokens);
  ``raw_logprobs`` of the model's logits. Top-k keeps the logits at least the k-th largest; top-p sorts
  ascending and masks the tokens whose cumulative probability is at most ``1 - top_p`` (the largest
  always kept).
- ``model_runner.model`` is the CUDA-graph wrapper unless ``enforce_eager`` (``CUDAGraphWrapper``, no
  ``load_weights``); ``model_runner.get_model()`` unwraps it.
- sleep mode with ``PYTORCH_CUDA_ALLOC_CONF`` holding ``expandable_segments:True`` fails in 0.20 (the
  cumem allocator's pool cannot take expandable segments): modelled as an ``AssertionError`` at
  ``sleep()``.
- ``finish_reason`` may also be ``"repetition"`` and ``"error"`` (:data:`FORCE_FINISH` sets one per
  request index).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import os
import pickle
from types import SimpleNamespace
from typing import Any

import torch

__version__ = "0.33.0"
_NEWEST = __version__
_LLM_KWARGS = {
    "model", "tensor_parallel_size", "gpu_memory_utilization", "enforce_eager", "dtype", "seed",
    "worker_extension_cls", "logprobs_mode", "max_model_len", "distributed_executor_backend",
    "enable_sleep_mode", "enable_prefix_caching", "max_num_batched_tokens", "limit_mm_per_prompt",
    "mm_processor_kwargs",
}
_LOGPROBS_MODES = {"raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits"}
CALLS: list[tuple[str, Any]] = []
REQUESTS: list[dict[str, Any]] = []  # every prompt dict LLM.generate was given, in order
SERIALIZED: list[tuple[str, int]] = []  # (collective_rpc method, tensor bytes copied through the serializer)
GPU = {"total_bytes": 80 << 30, "used_by_others": 0}
ABORT_AFTER_TOKENS: int | None = None  # test knob: requests still running after this many tokens are aborted
FORCE_FINISH: dict[int, str] = {}  # test knob: request index (within a generate call) -> its finish_reason
RPC_TENSOR_BYTES: list[tuple[str, int]] = []  # (collective_rpc method, bytes of the tensors in its arguments)
TRANSFORMERS_FALLBACK_FPS = 24.0  # transformers.video_utils.VideoMetadata.sampled_fps without an fps


def reset() -> None:
    CALLS.clear()
    REQUESTS.clear()
    SERIALIZED.clear()
    RPC_TENSOR_BYTES.clear()
    FORCE_FINISH.clear()
    GPU.update(total_bytes=80 << 30, used_by_others=0)
    global ABORT_AFTER_TOKENS, __version__
    ABORT_AFTER_TOKENS = None
    __version__ = _NEWEST


def version() -> tuple[int, ...]:
    """:data:`__version__` as a tuple of ints (``(0, 30, 0)``)."""
    return tuple(int(part) for part in __version__.split(".")[:3])


@dataclasses.dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    max_tokens: int = 16
    logprobs: int | None = None
    seed: int | None = None
    stop_token_ids: list[int] | None = None

    def __post_init__(self) -> None:
        if self.top_k < -1:
            raise ValueError(f"top_k must be 0 or -1 (disable), or at least 1, got {self.top_k}.")


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


# vLLM's names -------------------------------------------------------------------------------------

# hf_to_vllm_mapper (``WeightsMapper(orig_to_new_prefix=...)``) per HF model_type; text models keep their names.
# Qwen2.5-VL: checkpoint names (``model.*``, ``visual.*``) and transformers 5's in-memory ones. Qwen3-VL
# (vLLM v0.11.0 ... main): its checkpoints already hold the in-memory names.
HF_TO_VLLM = {
    "qwen2_5_vl": (("model.language_model.", "language_model.model."), ("model.visual.", "visual."),
                   ("lm_head.", "language_model.lm_head."), ("model.", "language_model.model."),
                   ("visual.", "visual.")),
    "qwen3_vl": (("model.visual.", "visual."), ("lm_head.", "language_model.lm_head."),
                 ("model.language_model.", "language_model.model.")),
}
# the HF class vLLM's model stands in for, per model_type (others: AutoModelForCausalLM)
_HF_CLASSES = {"qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration", "qwen3_vl": "Qwen3VLForConditionalGeneration"}
_FUSED_MODULES = ((".qkv_proj", ("q_proj", "k_proj", "v_proj")), (".gate_up_proj", ("gate_proj", "up_proj")))
# stacked_params_mapping: (fused module, part module, shard index)
_STACKED = ((".qkv_proj", ".q_proj", 0), (".qkv_proj", ".k_proj", 1), (".qkv_proj", ".v_proj", 2),
            (".gate_up_proj", ".gate_proj", 0), (".gate_up_proj", ".up_proj", 1))


def _to_vllm_name(name: str, model_type: str) -> str:
    for old, new in HF_TO_VLLM.get(model_type, ()):
        if name.startswith(old):
            return new + name[len(old):]
    return name


class _VLLMModel:
    """The worker's ``model_runner.model``: vLLM's parameter names over a HF model whose q/k/v and
    gate/up weights are views into fused ``qkv_proj`` / ``gate_up_proj`` tensors."""

    def __init__(self, hf_model: Any) -> None:
        self.hf_model = hf_model
        self.model_type = hf_model.config.model_type
        self.tied = bool(getattr(hf_model.config.get_text_config(), "tie_word_embeddings", False))
        self.shards: dict[str, list[tuple[int, int]]] = {}  # fused name -> (offset, rows) per shard
        names: dict[str, torch.nn.Parameter] = {}
        for module_name, module in hf_model.named_modules():
            for fused, parts in _FUSED_MODULES:
                if all(isinstance(getattr(module, p, None), torch.nn.Linear) for p in parts):
                    for leaf in ("weight", "bias"):
                        pieces = [getattr(getattr(module, p), leaf) for p in parts]
                        if pieces[0] is None:
                            continue
                        whole = torch.nn.Parameter(torch.cat([p.detach() for p in pieces]), requires_grad=False)
                        offset, spans = 0, []
                        for p, piece in zip(parts, pieces):
                            view = whole.data.narrow(0, offset, piece.shape[0])
                            setattr(getattr(module, p), leaf, torch.nn.Parameter(view, requires_grad=False))
                            spans.append((offset, piece.shape[0]))
                            offset += piece.shape[0]
                        name = _to_vllm_name(f"{module_name}{fused}.{leaf}", self.model_type)
                        names[name] = whole
                        self.shards[name] = spans
        fused_parts = {id(getattr(getattr(m, p), leaf)) for _, m in hf_model.named_modules()
                       for p in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
                       if isinstance(getattr(m, p, None), torch.nn.Linear)
                       for leaf in ("weight", "bias") if getattr(getattr(m, p), leaf) is not None}
        for name, param in hf_model.named_parameters():  # tied duplicates are listed once, as in vLLM
            if id(param) in fused_parts or (self.tied and name.endswith("lm_head.weight")):
                continue
            names[_to_vllm_name(name, self.model_type)] = param
        self.by_name = names

    def named_parameters(self):
        return iter(self.by_name.items())

    @torch.no_grad()
    def load_weights(self, weights):
        loaded = set()
        for target, tensor, shard in _load_targets(weights, self.model_type, self.tied):
            if shard is None:
                self.by_name[target].data.copy_(tensor)  # KeyError on an unknown name, as vLLM
            else:
                offset, rows = self.shards[target][shard]
                self.by_name[target].data.narrow(0, offset, rows).copy_(tensor)
            loaded.add(target)
        return loaded


def _load_targets(weights, model_type: str, tied: bool):
    """``(vLLM name, tensor, part index or None)`` per checkpoint tensor vLLM loads: a q/k/v or gate/up
    part names its fused tensor (``stacked_params_mapping``); a tied head is skipped."""
    for name, tensor in weights:
        target = _to_vllm_name(name, model_type)
        if tied and target.endswith("lm_head.weight"):
            continue
        for fused, part, shard in _STACKED:
            if part in target:
                yield target.replace(part, fused), tensor, shard
                break
        else:
            yield target, tensor, None


def _shard_dim(name: str) -> int | None:
    """The dim vLLM's parallel layer cuts ``name`` along, None for a replicated tensor."""
    if name.startswith("visual."):
        return None
    if name.endswith((".o_proj.weight", ".down_proj.weight")):
        return 1
    if name.endswith((".qkv_proj.weight", ".qkv_proj.bias", ".gate_up_proj.weight", ".gate_up_proj.bias",
                      "embed_tokens.weight", "lm_head.weight")):
        return 0
    return None


class _ShardedVLLMModel:
    """``model_runner.model`` of one TP rank: its shard of each of vLLM's tensors (a fused tensor is the
    concatenation of this rank's slice of every part). ``full`` is a whole-model :class:`_VLLMModel`
    that the shards are gathered into before generating."""

    def __init__(self, full: _VLLMModel, tp_rank: int, tp_size: int, group: Any) -> None:
        self.full, self.tp_rank, self.tp_size, self.group = full, tp_rank, tp_size, group
        self.model_type = full.model_type
        self.by_name: dict[str, torch.Tensor] = {}
        for name, whole in full.by_name.items():
            dim = _shard_dim(name)
            if dim is None:
                self.by_name[name] = whole.detach().clone()
                continue
            spans = full.shards.get(name, [(0, whole.shape[dim])])
            for _, rows in spans:
                if rows % tp_size:
                    raise ValueError(f"{name}: {rows} rows along dim {dim} are not divisible by "
                                     f"tensor_parallel_size={tp_size}")
            pieces = [self._slice(whole.narrow(dim, offset, rows), dim) for offset, rows in spans]
            self.by_name[name] = torch.cat(pieces, dim).clone()

    def _slice(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        size = tensor.shape[dim] // self.tp_size
        return tensor.narrow(dim, self.tp_rank * size, size)

    def named_parameters(self):
        return iter(self.by_name.items())

    @torch.no_grad()
    def load_weights(self, weights):
        loaded = set()
        for target, tensor, shard in _load_targets(weights, self.model_type, self.full.tied):
            dim = _shard_dim(target)
            if shard is None:
                self.by_name[target].copy_(tensor if dim is None else self._slice(tensor, dim))
            elif dim is None:  # a fused tensor of the vision tower, held whole
                offset, rows = self.full.shards[target][shard]
                self.by_name[target].narrow(0, offset, rows).copy_(tensor)
            else:  # this rank's rows of the part, at the part's place in its fused shard
                rows = [r // self.tp_size for _, r in self.full.shards[target]]
                self.by_name[target].narrow(0, sum(rows[:shard]), rows[shard]).copy_(self._slice(tensor, 0))
            loaded.add(target)
        return loaded

    @torch.no_grad()
    def gather(self) -> None:
        """Write the whole weights, gathered from the TP group's shards, into ``full``."""
        import torch.distributed as dist

        for name, local in self.by_name.items():
            dim = _shard_dim(name)
            if dim is None:
                self.full.by_name[name].data.copy_(local)
                continue
            shards = [torch.empty_like(local) for _ in range(self.tp_size)]
            dist.all_gather(shards, local.contiguous(), group=self.group)
            spans = self.full.shards.get(name, [(0, self.full.by_name[name].shape[dim])])
            offset = 0
            for start, rows in spans:
                part = torch.cat([s.narrow(dim, offset, rows // self.tp_size) for s in shards], dim)
                self.full.by_name[name].data.narrow(dim, start, rows).copy_(part)
                offset += rows // self.tp_size


class _CUDAGraphWrapper:
    """``vllm/compilation/cuda_graph.py``: what ``model_runner.model`` is when CUDA graphs are on; it
    runs the model but does not expose ``load_weights`` / ``named_parameters``."""

    def __init__(self, runnable: Any) -> None:
        self.runnable = runnable

    def unwrap(self) -> Any:
        return self.runnable


class _ModelRunner:
    def __init__(self, model: _VLLMModel, cuda_graphs: bool = False) -> None:
        self.model = _CUDAGraphWrapper(model) if cuda_graphs else model

    def get_model(self) -> Any:
        """``GPUModelRunner.get_model``: the model, unwrapped from a CUDA-graph wrapper."""
        return self.model.unwrap() if isinstance(self.model, _CUDAGraphWrapper) else self.model


class _Worker:
    """vLLM's GPU worker (``vllm/v1/worker/gpu_worker.py``): device from its local rank."""

    def __init__(self, model: _VLLMModel, local_rank: int, rank: int, cuda_graphs: bool = False) -> None:
        self.model_runner = _ModelRunner(model, cuda_graphs)
        self.local_rank, self.rank = local_rank, rank
        self.device = f"cuda:{local_rank}"


class _WorkerWrapper:
    def __init__(self, worker: Any) -> None:
        self.worker = worker


class _Executor:
    def __init__(self, worker: Any) -> None:
        self.driver_worker = _WorkerWrapper(worker)


class InprocClient:
    """``vllm/v1/engine/core_client.py``: the engine core in this process."""

    def __init__(self, worker: Any) -> None:
        self.engine_core = SimpleNamespace(model_executor=_Executor(worker))


class SyncMPClient:
    """``vllm/v1/engine/core_client.py``: the engine core in a background process, reached over ZMQ."""


class _LLMEngine:
    """``LLM.llm_engine``: its ``engine_core`` client, and ``model_executor`` only with the engine core
    in this process."""

    def __init__(self, worker: Any, in_process: bool, hf_config: Any) -> None:
        self.model_config = SimpleNamespace(hf_config=hf_config)
        self.engine_core = InprocClient(worker) if in_process else SyncMPClient()
        if in_process:
            self.model_executor = self.engine_core.engine_core.model_executor


def _env_flag(name: str, default: str) -> bool:
    return bool(int(os.environ.get(name, default)))


def _tensor_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(o) for o in obj)
    if isinstance(obj, dict):
        return sum(_tensor_bytes(o) for o in obj.values())
    return 0


class LLM:
    def __init__(self, **kwargs: Any) -> None:
        unknown = set(kwargs) - _LLM_KWARGS
        if unknown:
            raise TypeError(f"stand-in LLM got unexpected arguments {sorted(unknown)}")
        if kwargs.get("logprobs_mode", "raw_logprobs") not in _LOGPROBS_MODES:
            raise ValueError(f"bad logprobs_mode {kwargs['logprobs_mode']!r}")
        CALLS.append(("LLM", dict(kwargs)))
        self.in_process = not _env_flag("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
        self.backend = kwargs.get("distributed_executor_backend")
        tp = int(kwargs.get("tensor_parallel_size", 1))
        import torch.distributed as dist

        if self.backend == "external_launcher":
            assert self.in_process, "To get deterministic execution, please set VLLM_ENABLE_V1_MULTIPROCESSING=0"
            assert kwargs.get("seed") is not None, "Seed must be set when using external launcher backend"
            rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
            if not dist.is_initialized() and not {"MASTER_ADDR", "MASTER_PORT"} <= set(os.environ):
                raise ValueError("env:// initialisation needs MASTER_ADDR and MASTER_PORT")
        elif self.backend is None:
            rank, local_rank = 0, 0
        else:
            raise ValueError(f"stand-in supports no executor backend {self.backend!r}")
        # parallel_state.init_distributed_environment: the world is torch's default group when there is one
        self.world_size = dist.get_world_size() if dist.is_initialized() else tp
        if rank >= self.world_size:
            raise ValueError(f"RANK {rank} is outside a world of {self.world_size} (vLLM would initialise "
                             f"torch.distributed with world_size = tensor_parallel_size = {tp})")
        self.device_index = local_rank
        self.tp_size, self.tp_rank, self.tp_group = tp, 0, None
        if tp > 1:
            if self.backend != "external_launcher":
                raise NotImplementedError("the stand-in models tensor_parallel_size > 1 under the external "
                                          "launcher only (vLLM's multiprocessing executor is not modelled)")
            if self.world_size % tp:
                raise ValueError(f"a world of {self.world_size} ranks cannot be laid out as ExternalDP x TP with "
                                 f"tensor_parallel_size={tp}")
            # initialize_model_parallel: every rank creates every TP group (new_group is collective)
            for start in range(0, self.world_size, tp):
                group = dist.new_group(list(range(start, start + tp)))
                if start <= rank < start + tp:
                    self.tp_group, self.tp_rank = group, rank - start
            seeds: list[Any] = [None] * tp
            dist.all_gather_object(seeds, kwargs.get("seed"), group=self.tp_group)
            if len(set(seeds)) != 1:
                raise ValueError(f"the ranks of one TP group were given seeds {seeds}: their samplers would "
                                 "diverge; give every rank of a TP group the same seed")
        utilization = float(kwargs.get("gpu_memory_utilization", 0.9))
        free = GPU["total_bytes"] - GPU["used_by_others"]
        if utilization * GPU["total_bytes"] > free:
            raise ValueError(
                f"Free memory on device cuda:{local_rank} ({free / 2**30:.2f}/{GPU['total_bytes'] / 2**30:.2f} GiB) "
                f"on startup is less than desired GPU memory utilization ({utilization}, "
                f"{utilization * GPU['total_bytes'] / 2**30:.2f} GiB). Decrease GPU memory utilization or reduce "
                "GPU memory used by other processes."
            )
        self.sleep_enabled = bool(kwargs.get("enable_sleep_mode", False))
        self.prefix_caching = bool(kwargs.get("enable_prefix_caching", True))
        self.asleep: set[str] = set()
        self._prefix_cache: dict[tuple[int, ...], Any] = {}
        self._model_path = kwargs["model"]
        self.hf_model = self._load(kwargs["model"], kwargs.get("dtype", "auto"))
        self._tokenizer = None
        self._processor = None
        module, _, cls = kwargs["worker_extension_cls"].rpartition(".")
        extension = getattr(importlib.import_module(module), cls)
        worker_cls = type("StandInWorker", (_Worker, extension), {})
        model: Any = _VLLMModel(self.hf_model)
        if self.tp_group is not None:
            model = _ShardedVLLMModel(model, self.tp_rank, tp, self.tp_group)
        self.worker = worker_cls(model, local_rank=local_rank, rank=rank,
                                 cuda_graphs=not kwargs.get("enforce_eager", False))
        self.llm_engine = _LLMEngine(self.worker, self.in_process, self.hf_model.config)
        self.logprobs_mode = kwargs.get("logprobs_mode", "raw_logprobs")
        self._encoder_cache: dict[str, float] = {}  # mm_hash -> fingerprint of the weights that embedded it
        self._engine_gen = torch.Generator().manual_seed(int(kwargs.get("seed") or 0))

    @staticmethod
    def _load(path: str, dtype: str) -> Any:
        import transformers

        config = transformers.AutoConfig.from_pretrained(path)
        torch_dtype = None if dtype == "auto" else getattr(torch, dtype)
        cls = getattr(transformers, _HF_CLASSES.get(config.model_type, "AutoModelForCausalLM"))
        return cls.from_pretrained(path, dtype=torch_dtype).eval()

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self._model_path)
        return self._tokenizer

    @property
    def processor(self) -> Any:
        if self._processor is None:
            from transformers import AutoProcessor

            self._processor = AutoProcessor.from_pretrained(self._model_path)
        return self._processor

    def _vl_inputs(self, request: dict[str, Any], prompt_ids: list[int]) -> tuple[list[int], dict[str, Any]]:
        """``prompt_ids`` with the media placeholders expanded as vLLM's Qwen2.5-VL / Qwen3-VL processor
        expands them, and the model's media inputs (``pixel_values`` / ``image_grid_thw``,
        ``pixel_values_videos`` / ``video_grid_thw`` (/ ``second_per_grid_ts``), ``mm_token_type_ids``
        ``[1, P]``); unchanged ids and no inputs for a text model or a request without media.

        The placeholders are matched as ``_apply_matches`` (``vllm/multimodal/processing/processor.py``)
        matches them, whether the prompt is text or token ids (a token prompt is never expanded by the HF
        processor: ``_apply_hf_processor_main`` returns ``is_update_applied=False`` for it): item ``k``
        takes the first target at or after the end of item ``k - 1``'s; placeholders left over once every
        item has its match are not placeholders of any item (``_find_mm_placeholders`` does not cover
        them), so vLLM would embed them as text tokens. The stand-in refuses such a prompt instead of
        running it as vLLM would, misread (e.g. token ids that hold already expanded runs of pads)."""
        data = request.get("multi_modal_data") or {}
        config = self.hf_model.config
        if config.model_type not in ("qwen2_5_vl", "qwen3_vl") or not data:
            return prompt_ids, {}
        from transformers.video_utils import VideoMetadata

        qwen3 = config.model_type == "qwen3_vl"
        processor, merge = self.processor, config.vision_config.spatial_merge_size ** 2
        inputs: dict[str, Any] = {}
        images = data.get("image")
        images = [] if images is None else images if isinstance(images, list) else [images]
        image_blocks: list[list[int]] = []
        if images:
            out = processor.image_processor(images=images, return_tensors="pt")
            inputs["pixel_values"], inputs["image_grid_thw"] = out["pixel_values"], out["image_grid_thw"]
            image_blocks = [[config.image_token_id] * (int(g.prod()) // merge) for g in out["image_grid_thw"]]
        videos = data.get("video")
        videos = [] if videos is None else videos if isinstance(videos, list) else [videos]
        video_blocks: list[list[int]] = []
        pixels, grids, seconds_per_grid = [], [], []
        for item, fps in zip(videos, self._video_fps(request)):
            if not qwen3:
                frames = item[0] if isinstance(item, tuple) else item
                out = processor.video_processor(videos=[frames], do_sample_frames=False, return_tensors="pt")
                grid = out["video_grid_thw"][0]
                video_blocks.append([config.video_token_id] * (int(grid.prod()) // merge))
                seconds_per_grid.append(processor.video_processor.temporal_patch_size / float(fps))
                pixels.append(out["pixel_values_videos"])
                grids.append(out["video_grid_thw"])
                continue
            if not isinstance(item, tuple):
                raise ValueError("Qwen3-VL needs each video as (frames, metadata): its processor reads the frame "
                                 "timestamps from the metadata (video_needs_metadata=True)")
            frames, metadata = item
            sample = bool(metadata.get("do_sample_frames", False))
            meta = VideoMetadata(**{k: v for k, v in metadata.items() if k != "do_sample_frames"})
            out = processor.video_processor(videos=[frames], video_metadata=[meta], do_sample_frames=sample,
                                            return_metadata=True, return_tensors="pt")
            grid = out["video_grid_thw"][0]
            indices = list(out["video_metadata"][0].frames_indices if sample else metadata["frames_indices"])
            pairs = processor.video_processor.merge_size
            indices += [indices[-1]] * (-len(indices) % pairs)
            seconds = [sum(indices[i:i + pairs]) / pairs / float(metadata["fps"])
                       for i in range(0, len(indices), pairs)]
            if len(seconds) != int(grid[0]):
                raise AssertionError(f"{len(seconds)} timestamps for {int(grid[0])} temporal patches")
            block: list[int] = []
            for t in seconds:
                block += self.tokenizer.encode(f"<{t:.1f} seconds>", add_special_tokens=False)
                block += ([config.vision_start_token_id] + [config.video_token_id] * (int(grid[1:].prod()) // merge)
                          + [config.vision_end_token_id])
            video_blocks.append(block)
            pixels.append(out["pixel_values_videos"])
            grids.append(out["video_grid_thw"])
        if videos:
            inputs["pixel_values_videos"], inputs["video_grid_thw"] = torch.cat(pixels), torch.cat(grids)
            if not qwen3:
                inputs["second_per_grid_ts"] = torch.tensor(seconds_per_grid)
        # the targets of each family's _get_prompt_updates: Qwen3-VL replaces a video's whole triple
        video_target = ([config.vision_start_token_id, config.video_token_id, config.vision_end_token_id]
                        if qwen3 else [config.video_token_id])
        expanded: list[int] = []
        images_left, videos_left = iter(image_blocks), iter(video_blocks)
        stray = {"image": 0, "video": 0}
        i = 0
        while i < len(prompt_ids):
            if prompt_ids[i:i + len(video_target)] == video_target:
                block = next(videos_left, None)
                if block is not None:
                    expanded += block
                    i += len(video_target)
                    continue
            if prompt_ids[i] in (config.image_token_id, config.video_token_id):
                kind = "image" if prompt_ids[i] == config.image_token_id else "video"
                block = next(images_left, None) if kind == "image" else None
                if block is None:
                    stray[kind] += 1
                expanded += block if block is not None else [prompt_ids[i]]
            else:
                expanded.append(prompt_ids[i])
            i += 1
        if next(images_left, None) is not None or next(videos_left, None) is not None:
            raise ValueError(f"the prompt has fewer placeholders than the {len(image_blocks)} images and "
                             f"{len(video_blocks)} videos given")
        if any(stray.values()):
            raise ValueError(f"the prompt holds {stray['image']} <|image_pad|> and {stray['video']} <|video_pad|> "
                             f"tokens beyond one placeholder per item ({len(image_blocks)} images, "
                             f"{len(video_blocks)} videos given): vLLM expands the first placeholder of each item "
                             "and would embed the rest as text (give one placeholder per item, not expanded runs)")
        ids = torch.tensor(expanded)
        inputs["mm_token_type_ids"] = ((ids == config.image_token_id).long()
                                       + 2 * (ids == config.video_token_id).long())[None]
        return expanded, inputs

    def collective_rpc(self, method: str, timeout: float | None = None, args: tuple = (), kwargs: dict | None = None):
        CALLS.append(("collective_rpc", method))
        kwargs = kwargs or {}
        RPC_TENSOR_BYTES.append((method, _tensor_bytes(args) + _tensor_bytes(kwargs)))
        if "weights" in self.asleep:
            raise RuntimeError(f"collective_rpc({method!r}) while the weights sleep: their memory is unmapped; "
                               "wake_up(tags=['weights']) first")
        if self.in_process:
            return [getattr(self.worker, method)(*args, **kwargs)]
        # the engine core runs in another process: the message is serialised, tensors are copied
        SERIALIZED.append((method, _tensor_bytes(args) + _tensor_bytes(kwargs)))
        args, kwargs = pickle.loads(pickle.dumps((args, kwargs)))
        return pickle.loads(pickle.dumps([getattr(self.worker, method)(*args, **kwargs)]))

    def sleep(self, level: int = 1) -> None:
        CALLS.append(("sleep", level))
        assert self.sleep_enabled, "Sleep mode is not enabled in the model config"
        if level != 1:
            raise ValueError("the stand-in models sleep level 1 only")
        if version() < (0, 21) and "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
            raise AssertionError("Expandable segments are not compatible with memory pool.")
        self.asleep = {"weights", "kv_cache"}
        self._encoder_cache.clear()

    def wake_up(self, tags: list[str] | None = None) -> None:
        CALLS.append(("wake_up", tags))
        assert self.sleep_enabled, "Sleep mode is not enabled in the model config"
        self.asleep -= set(tags or ("weights", "kv_cache"))

    def reset_prefix_cache(self) -> bool:
        CALLS.append(("reset_prefix_cache", None))
        self._prefix_cache.clear()
        return True

    def reset_encoder_cache(self) -> None:
        CALLS.append(("reset_encoder_cache", None))
        self._encoder_cache.clear()

    def _weights_fingerprint(self) -> float:
        """What an embedding depends on: the vision tower's weights (all weights for a text model)."""
        model = self.worker.model_runner.get_model()
        full = model.full if isinstance(model, _ShardedVLLMModel) else model
        named = [(n, p) for n, p in full.by_name.items() if n.startswith("visual.")] or list(full.by_name.items())
        return float(sum(p.detach().double().sum() for _, p in named))

    def _encode(self, request: dict[str, Any]) -> list[float]:
        """The encoder outputs of a request's media, from the encoder cache when their hash is there."""
        import hashlib

        out = []
        for modality, items in sorted((request.get("multi_modal_data") or {}).items()):
            for item in items if isinstance(items, list) else [items]:
                data = item[0] if isinstance(item, tuple) else item
                raw = data.tobytes() if hasattr(data, "tobytes") else pickle.dumps(data)
                key = hashlib.sha256(modality.encode() + raw).hexdigest()
                if key not in self._encoder_cache:
                    self._encoder_cache[key] = self._weights_fingerprint()
                out.append(self._encoder_cache[key])
        return out

    def _video_fps(self, request: dict[str, Any]) -> list[float | None]:
        videos = (request.get("multi_modal_data") or {}).get("video")
        if videos is None:
            return []
        items = videos if isinstance(videos, list) else [videos]
        shared = (request.get("mm_processor_kwargs") or {}).get("fps")
        # before 0.31 Qwen2.5-VL's parser drops the metadata; transformers then assumes 24 fps
        keeps_metadata = self.hf_model.config.model_type != "qwen2_5_vl" or version() >= (0, 31)
        fps = []
        for item in items:
            if isinstance(item, tuple) and keeps_metadata:
                _, metadata = item
                fps.append(shared if shared is not None else metadata.get("fps"))
            elif self.hf_model.config.model_type == "qwen2_5_vl":
                fps.append(TRANSFORMERS_FALLBACK_FPS)
            else:
                fps.append(shared)
        return fps

    def _prompt_state(self, prompt_ids: list[int], media: dict[str, Any] | None = None) -> tuple[Any, torch.Tensor]:
        """KV of ``prompt_ids[:-1]`` (from the prefix cache when there; never with ``media``) and the
        last position's logits."""
        key = tuple(prompt_ids[:-1])
        caching = self.prefix_caching and not media
        cache = self._prefix_cache.get(key) if caching else None
        inner = getattr(self.hf_model, "model", None)
        if hasattr(inner, "rope_deltas"):  # mRoPE offsets of the previous request must not carry over
            inner.rope_deltas = None
        if cache is None:
            extra = dict(media or {})
            if "mm_token_type_ids" in extra:
                extra["mm_token_type_ids"] = extra["mm_token_type_ids"][:, :-1]
            out = self.hf_model(input_ids=torch.tensor([prompt_ids[:-1]]), use_cache=True, **extra)
            cache = out.past_key_values
            if caching:
                self._prefix_cache[key] = copy.deepcopy(cache)
        else:
            cache = copy.deepcopy(cache)
        out = self.hf_model(input_ids=torch.tensor([prompt_ids[-1:]]), past_key_values=cache, use_cache=True)
        return out.past_key_values, out.logits[0, -1].float()

    def _check_same_requests(self, prompts: list[dict[str, Any]], params: list[SamplingParams]) -> None:
        """Every rank of a TP group runs the same schedule: same prompts, same sampling parameters."""
        import torch.distributed as dist

        mine = ([r["prompt"] for r in prompts], [dataclasses.asdict(p) for p in params])
        seen: list[Any] = [None] * self.tp_size
        dist.all_gather_object(seen, mine, group=self.tp_group)
        if any(other != seen[0] for other in seen):
            raise RuntimeError("the ranks of a TP group called generate() with different requests; vLLM's TP "
                               "workers would deadlock or diverge. Submit the same requests on every rank of "
                               "the group")

    @torch.no_grad()
    def generate(self, prompts: list[dict[str, Any]], sampling_params: SamplingParams | list[SamplingParams],
                 use_tqdm: bool = True):
        if self.asleep:
            raise RuntimeError(f"generate() while {sorted(self.asleep)} sleep: wake_up() first")
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(params)} sampling params for {len(prompts)} prompts")
        CALLS.append(("generate", len(prompts)))
        CALLS.append(("video_fps", [self._video_fps(r) for r in prompts]))
        if self.tp_group is not None:
            self._check_same_requests(prompts, params)
            self.worker.model_runner.get_model().gather()
        CALLS.append(("encoder_outputs", [self._encode(r) for r in prompts]))
        results = []
        for i, (request, sampling_params) in enumerate(zip(prompts, params)):
            eos = set(sampling_params.stop_token_ids or []) | {self.tokenizer.convert_tokens_to_ids("<|im_end|>")}
            given = request.get("prompt_token_ids")  # a TokensPrompt: the ids as they are
            REQUESTS.append(request)
            prompt_ids, media = self._vl_inputs(
                request, list(given) if given is not None else self.tokenizer(request["prompt"])["input_ids"])
            outs = []
            for k in range(sampling_params.n):
                if sampling_params.seed is None:
                    gen = self._engine_gen
                else:  # parallel sampling: child k of a seeded request is seeded seed + k
                    gen = torch.Generator().manual_seed(sampling_params.seed + (k if sampling_params.n > 1 else 0))
                cache, logits = self._prompt_state(prompt_ids, media)
                token_ids, logprobs, finish = [], [], "length"
                for step in range(sampling_params.max_tokens):
                    if ABORT_AFTER_TOKENS is not None and step >= ABORT_AFTER_TOKENS:
                        finish = "abort"
                        break
                    masked = top_k_top_p(logits / sampling_params.temperature, sampling_params.top_k,
                                         sampling_params.top_p)
                    tok = int(torch.multinomial(torch.softmax(masked, -1), 1, generator=gen))
                    reported = masked if self.logprobs_mode == "processed_logprobs" else logits
                    token_ids.append(tok)
                    logprobs.append({tok: Logprob(logprob=float(torch.log_softmax(reported, -1)[tok]), rank=1)})
                    if tok in eos:
                        finish = "stop"
                        break
                    out = self.hf_model(input_ids=torch.tensor([[tok]]), past_key_values=cache, use_cache=True)
                    cache, logits = out.past_key_values, out.logits[0, -1].float()
                finish = FORCE_FINISH.get(i, finish)
                text_ids = token_ids[:-1] if finish == "stop" else token_ids
                outs.append(CompletionOutput(k, self.tokenizer.decode(text_ids), token_ids, None, logprobs, finish))
            results.append(RequestOutput(str(i), request.get("prompt"), prompt_ids, outs))
        return results


def top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """vLLM's top-k / top-p masking of temperature-scaled ``logits`` ``[V]``: masked entries -inf.

    Top-k (``0`` or ``-1``: off) keeps the logits at least the k-th largest; top-p sorts ascending and
    masks every token whose cumulative probability is at most ``1 - top_p``, the largest always kept.
    """
    out = logits.clone()
    if 0 < top_k < out.numel():
        kth = torch.topk(out, top_k).values[-1]
        out[out < kth] = float("-inf")
    if top_p < 1.0:
        ascending, order = torch.sort(out)
        cumulative = torch.cumsum(torch.softmax(ascending, -1), -1)
        drop = cumulative <= 1 - top_p
        drop[-1] = False
        out[order[drop]] = float("-inf")
    return out
