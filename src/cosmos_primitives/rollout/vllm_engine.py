"""``VLLMRolloutEngine``: generation with vLLM (optional ``vllm`` extra, GPU only).

UNTESTED ON THE REAL THING: vLLM cannot be installed or run on the machines this library is
developed on. The engine is tested against a stand-in (``tests/standins/vllm``) that models the
documented behaviours below; docs/vllm.md lists, call by call, the vLLM versions each was checked
against. Check it on a GPU before relying on it.

How it drives vLLM (V1 engine, vLLM >= 0.20):

- The engine core runs in this process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` is set before ``LLM()``
  is built. ``collective_rpc`` then calls the worker directly (``InprocClient``), so the tensors handed
  to :meth:`VLLMRolloutEngine.update_weights` reach ``model.load_weights`` without being serialised.
  With multiprocessing on, vLLM would copy every tensor through its message serializer into the
  engine-core process.
- Inside a ``torchrun`` job (torch.distributed initialised, more than one rank) the engine uses
  ``distributed_executor_backend="external_launcher"``: vLLM's worker takes ``RANK`` / ``LOCAL_RANK``
  from the environment, so each rank's engine lands on its own local GPU (the uni-process executor
  would put every rank's engine on device 0), and vLLM's groups are built over torch's default group.
  Every rank of that group must therefore build an engine: an engine on only some ranks (the rollout
  ranks of a disaggregated job) is refused with a clear error rather than left to hang while vLLM
  builds groups that the trainer ranks never join.
- Weights are loaded by the worker extension (:class:`CosmosWorkerExtension`, ``worker_extension_cls``)
  through ``model.load_weights`` with HF checkpoint names; vLLM renames (``hf_to_vllm_mapper``) and
  fuses (``qkv_proj``, ``gate_up_proj``) them. The prefix cache is reset after every update, since
  cached KV blocks were computed with the old weights.
- Tensor parallel (``tensor_parallel_size = [rollout.parallelism] tp_size > 1`` under torchrun): vLLM's
  ``initialize_model_parallel`` (``vllm/distributed/parallel_state.py``) lays the ranks of its world out
  as "ExternalDP x DP x PP x PCP x TP", so with the external launcher a TP group is ``tp_size``
  consecutive ranks of the job and the job is ``world / tp_size`` independent engines ("ExternalDP":
  every group generates on its own, as verl runs it). These are the ``"tp"`` groups of a
  :class:`~cosmos_primitives.parallel.mesh.ParallelMesh` over ``[rollout.parallelism]`` (tp innermost);
  the engine checks the group it is given is that one. Every rank of a TP group runs its own scheduler
  and sampler over its shard of the model, so all of them must submit the same requests with the same
  engine seed: :meth:`VLLMRolloutEngine.generate` gathers the prompts (and each rank's sampling
  parameters) of the group, runs them all on every rank, with one ``SamplingParams`` per request
  (``LLM.generate`` pairs a list with the prompts), and returns this rank's own; the engine seed of
  the group's first rank is used by all. Weights still go in FULL: each rank's ``load_weights`` keeps
  its own slice (``weight_loader`` of ``ColumnParallelLinear`` / ``MergedColumnParallelLinear`` /
  ``QKVParallelLinear`` narrows the checkpoint tensor along the output dim at ``tp_rank * shard_size``,
  ``RowParallelLinear`` along the input dim, ``VocabParallelEmbedding`` / ``ParallelLMHead`` over the
  vocabulary: ``vllm/model_executor/layers/linear.py``, ``vocab_parallel_embedding.py``), so the
  trainer side sends every rank the same full tensors, in process (``InProcessSync``) or from a
  broadcast (``WeightReceiver``). The first-sync check cannot compare sums of shards with the full
  tensors (vLLM replicates KV heads when ``tp_size`` exceeds their number and pads the vocabulary), so
  under TP it checks that every one of the engine's tensors was loaded (:meth:`unloaded_weights`).
- Colocated with a resident trainer (``sleep_level=1``): ``enable_sleep_mode=True``; after each
  ``generate`` the engine sleeps (weights offloaded to CPU, KV cache freed), an update wakes only the
  weights, the next ``generate`` wakes the KV cache. torch's CUDA cache is emptied before every
  ``wake_up`` (vLLM 0.20 - 0.26 do not do it themselves, so blocks the trainer freed stay reserved by
  torch's allocator). ``PYTORCH_CUDA_ALLOC_CONF`` with ``expandable_segments:True`` breaks sleep mode on
  vLLM 0.20 and is refused there.

Second pass (issue 29), per vLLM's source:

- Weights are streamed: :meth:`VLLMRolloutEngine.update_weights` hands the worker one bucket of
  ``update_bucket_bytes`` at a time, so beside an FSDP2 trainer the extra memory is one bucket of
  gathered / cast tensors, not a copy of the whole model.
- After every weight update the multimodal encoder cache is reset too (``LLM.reset_encoder_cache``): it
  is keyed by the media's hash only, so a repeated image or video would otherwise keep the embedding the
  old weights computed.
- Every request gets its own seed (:func:`request_seed`: from the call's seed, the rank, the prompt's
  index; vLLM seeds child ``k`` of an ``n``-sample request with ``seed + k``), so prompts of one call do
  not draw the same noise and ranks do not collide.
- Qwen2.5-VL videos need vLLM >= 0.31: before, its input parser drops the per-video metadata and
  transformers takes 24 fps, so rollout positions would differ from the trainer's; such prompts are
  refused with an error on 0.20 - 0.30.
- ``finish_reason`` ``"repetition"`` is a finished completion; ``"abort"`` / ``"error"`` completions are
  dropped (counted in a warning and in :attr:`VLLMRolloutEngine.dropped`), never trained on.
- A prompt given as token ids with media (a multi-turn episode's next turn: the prompt's media plus the
  images the environment returned) goes as ``{"prompt_token_ids", "multi_modal_data"}`` with each
  expanded run of pads collapsed to one placeholder (:func:`vllm_token_prompt`: vLLM expands the
  placeholders of a token prompt itself and would read already expanded runs wrong).
- The worker extension reaches the model through ``model_runner.get_model()`` (``model_runner.model`` is
  the CUDA-graph wrapper unless ``enforce_eager``); the first-sync checksums reduce in float64 chunks
  of :data:`CHECKSUM_CHUNK` elements instead of a float64 copy of each tensor.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import attrs
import torch

from cosmos_primitives.data.prompt_inputs import render_prompt
from cosmos_primitives.data.records import Completion, Prompt, RolloutGroup, SamplingParams
from cosmos_primitives.utils.extras import require

WORKER_EXTENSION = "cosmos_primitives.rollout.vllm_engine.CosmosWorkerExtension"
# what vLLM's CompletionOutput.finish_reason can say of a finished request (vllm/v1/engine FinishReason):
# kept for training, or dropped (the request was aborted or failed: its tokens are not a sample)
FINISH_REASONS = ("stop", "length", "repetition")
DROPPED_FINISH_REASONS = ("abort", "error")
DEFAULT_GPU_MEMORY_UTILIZATION = 0.3
DEFAULT_UPDATE_BUCKET_BYTES = 512 << 20
CHECKSUM_CHUNK = 1 << 22  # elements per float64 partial sum in the first-sync checksums (32 MiB)
# Qwen2.5-VL's vLLM input parser keeps per-video metadata (fps) from this release on
QWEN2_5_VL_VIDEO_METADATA_SINCE = (0, 31)
_SEED_SPACE = 1 << 62  # request seeds; child k of a request takes seed + k, still below 2**63
logger = logging.getLogger(__name__)
_LAUNCHER_ENV = ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class CosmosWorkerExtension:
    """Methods mixed into every vLLM worker (``worker_extension_cls``); reached by ``collective_rpc``."""

    def _cosmos_model(self) -> Any:
        """The model itself: ``model_runner.model`` is vLLM's CUDA-graph wrapper unless enforce_eager."""
        runner = self.model_runner  # type: ignore[attr-defined]
        return runner.get_model() if hasattr(runner, "get_model") else runner.model

    def cosmos_load_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> list[str]:
        """Load full checkpoint-named tensors (each TP rank keeps its slice); the vLLM names loaded."""
        loaded = self._cosmos_model().load_weights(weights=named_tensors)
        return sorted(loaded) if loaded is not None else []

    def cosmos_parameter_names(self) -> list[str]:
        return [name for name, _ in self._cosmos_model().named_parameters()]

    def cosmos_weight_checksums(self, names: list[str]) -> dict[str, float]:
        """float64 sums of the named parameters, in vLLM's own names (fused tensors whole)."""
        params = dict(self._cosmos_model().named_parameters())
        return {n: chunked_sum(params[n]) for n in names if n in params}


def chunked_sum(tensor: torch.Tensor, chunk: int = CHECKSUM_CHUNK) -> float:
    """The float64 sum of ``tensor`` (any shape), reduced ``chunk`` elements at a time, so the float64
    temporaries stay at ``chunk`` elements (a 7B model's embedding would take 4.4 GB as one copy)."""
    flat = tensor.detach().reshape(-1)
    total = torch.zeros((), dtype=torch.float64, device=flat.device)
    for start in range(0, flat.numel(), chunk):
        total += flat[start:start + chunk].sum(dtype=torch.float64)
    return float(total)


def request_seed(seed: int, rank: int, index: int, n: int = 1) -> int:
    """The seed of one request: prompt ``index`` of a ``generate`` call with ``seed`` on global ``rank``.

    vLLM seeds child ``k`` of an ``n``-sample request with ``seed + k``; a hash of ``(seed, rank,
    index)`` spread over 2**62 values makes two requests' ranges ``[s, s + n)`` overlap with probability
    about ``2 n / 2**62`` per pair (call seeds that differ per step and rank, as the recipes pass, keep
    steps apart too).
    """
    digest = hashlib.blake2b(f"{seed}/{rank}/{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % (_SEED_SPACE - n)


def launcher_settings(engine_ranks: Sequence[int] | None = None, tensor_parallel_size: int = 1) -> dict[str, Any]:
    """The ``LLM()`` arguments that place this rank's engine, from the torchrun environment.

    Args:
        engine_ranks: the global ranks that build an engine; default: every rank of the job.
        tensor_parallel_size: ranks per engine; it must divide the job's size.

    Returns:
        ``{}`` in a single process (vLLM's uni-process executor, device 0 of those visible), else
        ``{"distributed_executor_backend": "external_launcher"}``.

    Raises:
        ValueError: the default process group holds ranks that build no engine (vLLM would build its
            groups over all of them), ``tensor_parallel_size`` does not divide it, or the launcher
            variables vLLM reads are missing.
    """
    import torch.distributed as dist

    world = dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return {}
    ranks = sorted(range(world) if engine_ranks is None else {int(r) for r in engine_ranks})
    if world % tensor_parallel_size:
        raise ValueError(
            f"[rollout.parallelism] tp_size = {tensor_parallel_size} does not divide the {world} ranks of the job: "
            "vLLM lays its world out as independent engines of tp_size consecutive ranks each"
        )
    if ranks != list(range(world)):
        raise ValueError(
            f"a vLLM engine on rollout ranks {ranks} of a job of {world} ranks: vLLM's external launcher builds "
            f"its process groups over torch.distributed's default group, i.e. all {world} ranks, trainers "
            "included, which never join them. Run the rollout ranks as their own torchrun job (their default "
            "group then holds only them), colocate the engine on every rank, or use [rollout] backend = \"hf\""
        )
    if not dist.is_initialized():
        raise ValueError(
            f"WORLD_SIZE={world} but torch.distributed is not initialised: call cp.parallel.init_distributed() "
            "before building the vLLM engine, so that vLLM joins the job's group (otherwise it would create a "
            "group of tensor_parallel_size ranks and fail)"
        )
    missing = [name for name in _LAUNCHER_ENV if name not in os.environ]
    if missing:
        raise ValueError(f"vLLM's external launcher reads {list(_LAUNCHER_ENV)} from the environment; {missing} "
                         "are not set (start the job with torchrun)")
    return {"distributed_executor_backend": "external_launcher"}


class VLLMRolloutEngine:
    """``n`` completions per prompt from a vLLM ``LLM`` running in this process.

    Args:
        model_path: HF folder or hub name (an exported ``safetensors/final`` folder works).
        processor: the HF processor / tokenizer, used to render the chat template.
        tensor_parallel_size: ``[rollout.parallelism] tp_size``. Under torchrun each engine spans this
            many consecutive ranks; in one process vLLM starts its own workers (no weight updates
            without a copy then).
        gpu_memory_utilization: the share of the GPU vLLM takes for weights and KV cache; it must be
            free when the engine starts, so beside a resident trainer keep it low (default 0.3).
        enforce_eager, dtype, max_model_len, seed: passed to ``LLM``.
        max_num_batched_tokens, limit_mm_per_prompt, mm_processor_kwargs: passed to ``LLM`` when given
            (``[rollout]`` keys of the same names): they bound vLLM's start-up profiling run (a batch of
            ``max_num_batched_tokens`` tokens, the largest media ``limit_mm_per_prompt`` allows, processed
            with ``mm_processor_kwargs`` such as ``max_pixels``).
        update_bucket_bytes: :meth:`update_weights` hands the worker tensors in buckets of about this
            many bytes (the extra memory of a sync is one bucket plus one tensor).
        sleep_level: 1 to sleep between rollouts (colocated with a trainer), 0 never.
        engine_ranks: the global ranks that build an engine (see :func:`launcher_settings`).
        tp_group: under torchrun with ``tensor_parallel_size > 1``, this rank's TP group (the
            ``"tp"`` group of a :class:`~cosmos_primitives.parallel.mesh.ParallelMesh` over the
            rollout sizes); default: built here from such a mesh. Collective: every rank builds its
            engine together.
        llm_kwargs: anything else for ``LLM``.

    Raises:
        ValueError: ``tp_group`` is not the ranks vLLM puts in this rank's TP group; ``sleep_level=1``
            with ``expandable_segments:True`` in ``PYTORCH_CUDA_ALLOC_CONF`` on vLLM 0.20.
    """

    def __init__(self, model_path: str, processor: Any, *, tensor_parallel_size: int = 1,
                 gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION, enforce_eager: bool = True,
                 dtype: str = "bfloat16", max_model_len: int | None = None, seed: int = 0, weight_version: int = 0,
                 sleep_level: int = 0, engine_ranks: Sequence[int] | None = None, tp_group: Any = None,
                 max_num_batched_tokens: int | None = None, limit_mm_per_prompt: dict[str, int] | None = None,
                 mm_processor_kwargs: dict[str, Any] | None = None,
                 update_bucket_bytes: int = DEFAULT_UPDATE_BUCKET_BYTES,
                 llm_kwargs: dict[str, Any] | None = None) -> None:
        if sleep_level not in (0, 1):
            raise ValueError(f"sleep_level must be 0 (never) or 1 (weights to CPU, KV cache freed), got {sleep_level}")
        vllm = require("vllm", "vLLM rollouts")
        self._vllm = vllm
        self.release = release(vllm)
        alloc_conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        if sleep_level and self.release < (0, 21) and "expandable_segments:True" in alloc_conf.replace(" ", ""):
            raise ValueError(
                f"PYTORCH_CUDA_ALLOC_CONF={alloc_conf!r} holds expandable_segments:True, which vLLM "
                f"{vllm.__version__}'s sleep mode cannot take (its memory pool refuses expandable segments). Unset "
                "it for the rollout process, use vLLM >= 0.21, or [rollout] on a GPU of its own (sleep_level 0)"
            )
        self.update_bucket_bytes = int(update_bucket_bytes)
        self.dropped: Counter[str] = Counter()
        self.processor = processor
        self.sleep_level = sleep_level
        self.tensor_parallel_size = tensor_parallel_size
        launcher = launcher_settings(engine_ranks, tensor_parallel_size)
        self._tp_group = None
        if tensor_parallel_size > 1 and launcher:
            self._tp_group = _tp_group(tensor_parallel_size, tp_group)
            seed = _group_seed(seed, self._tp_group)
        kwargs: dict[str, Any] = {
            "model": model_path,
            "tensor_parallel_size": tensor_parallel_size,
            "gpu_memory_utilization": gpu_memory_utilization,
            "enforce_eager": enforce_eager,
            "dtype": dtype,
            "seed": seed,
            "worker_extension_cls": WORKER_EXTENSION,
            # log-probs of the distribution sampled from: after temperature, top-k and top-p (renormalised)
            "logprobs_mode": "processed_logprobs",
            **launcher,
        }
        if sleep_level:
            kwargs["enable_sleep_mode"] = True
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        for key, value in (("max_num_batched_tokens", max_num_batched_tokens),
                           ("limit_mm_per_prompt", limit_mm_per_prompt), ("mm_processor_kwargs", mm_processor_kwargs)):
            if value is not None:
                kwargs[key] = value
        kwargs.update(llm_kwargs or {})
        # read by vLLM when the engine is built: keep the engine core (and its model) in this process
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        self.llm = vllm.LLM(**kwargs)
        client = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if client is not None and "MPClient" in type(client).__name__:  # SyncMPClient: ZMQ to another process
            raise RuntimeError(
                f"vLLM built its engine core behind {type(client).__name__}, i.e. in another process, although "
                "VLLM_ENABLE_V1_MULTIPROCESSING=0 was set (read earlier in this process?); weight updates would be "
                "serialised through it. Set VLLM_ENABLE_V1_MULTIPROCESSING=0 before vLLM is first imported"
            )
        self._asleep: set[str] = set()
        self._loaded: set[str] = set()
        self.weight_version = weight_version
        hf_config = getattr(getattr(self.llm.llm_engine, "model_config", None), "hf_config", None)
        self.model_type = getattr(hf_config, "model_type", None)

    @property
    def tp_group(self) -> Any:
        """This rank's TP group (``tensor_parallel_size`` consecutive ranks of the job) under torchrun with
        ``tensor_parallel_size > 1``, else None. Its ranks must call :meth:`generate` and
        :meth:`update_weights` together."""
        return self._tp_group

    # sleep mode ----------------------------------------------------------------------------------

    def _wake(self, tag: str) -> None:
        if tag in self._asleep:
            torch.cuda.empty_cache()  # hand what the trainer freed back to the driver before vLLM maps its pool
            self.llm.wake_up(tags=[tag])
            self._asleep.discard(tag)

    def sleep(self) -> None:
        """Free the KV cache and offload the weights to CPU (a no-op with ``sleep_level=0``)."""
        if self.sleep_level and not self._asleep:
            self.llm.sleep(level=self.sleep_level)
            self._asleep = {"weights", "kv_cache"}

    # generation ----------------------------------------------------------------------------------

    def _sampling_params(self, params: SamplingParams, seed: int | None = None) -> Any:
        kwargs: dict[str, Any] = {
            "n": params.num_samples_per_prompt,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k if params.top_k > 0 else 0,  # vLLM's "off" (its default)
            "repetition_penalty": params.repetition_penalty,
            "max_tokens": params.max_response_length,
            "logprobs": 0,  # the sampled token's log-prob only
            "seed": seed,
        }
        if params.stop_token_ids:
            kwargs["stop_token_ids"] = list(params.stop_token_ids)
        return self._vllm.SamplingParams(**kwargs)

    @staticmethod
    def _request(text: str, prompt: Prompt) -> dict[str, Any]:
        """One vLLM prompt dict. Each video goes with its own metadata (``fps``, frames already
        sampled), which is what the Qwen2.5-VL processor reads its per-video frame rate from;
        ``mm_processor_kwargs={"fps": ...}`` would apply one rate to every video of the prompt.
        Qwen3-VL (vLLM's ``Qwen3VLProcessingInfo._get_video_second_idx``) takes each frame's timestamp
        text as ``frames_indices[i] / fps`` and, without ``do_sample_frames`` in the metadata or the
        processor kwargs, does not sample again: frames sampled at ``fps`` get times ``i / fps``."""
        # vLLM's TokensPrompt (a multi-turn continuation): ids with one placeholder per media item
        # (vllm_token_prompt), vLLM expands them
        request: dict[str, Any] = {"prompt": text} if prompt.token_ids is None else {
            "prompt_token_ids": list(prompt.token_ids)}
        media: dict[str, Any] = {}
        if prompt.images:
            media["image"] = prompt.images if len(prompt.images) > 1 else prompt.images[0]
        if prompt.videos:
            if prompt.video_fps and len(prompt.video_fps) != len(prompt.videos):
                raise ValueError(f"prompt {prompt.prompt_id!r}: {len(prompt.videos)} videos but "
                                 f"{len(prompt.video_fps)} video_fps values; give one fps per video")
            fps = prompt.video_fps or [2.0] * len(prompt.videos)
            metas = prompt.video_metadata or [None] * len(prompt.videos)
            items = [(video, _video_metadata(len(video), f, m)) for video, f, m in zip(prompt.videos, fps, metas)]
            media["video"] = items if len(items) > 1 else items[0]
        if media:
            request["multi_modal_data"] = media
        return request

    def _collapsed(self, prompt: Prompt) -> Prompt:
        """A prompt given as token ids, with its media's expanded placeholders collapsed for vLLM."""
        if not (prompt.images or prompt.videos):
            return prompt
        tokenizer = getattr(self.processor, "tokenizer", self.processor)
        return attrs.evolve(prompt, token_ids=vllm_token_prompt(prompt, tokenizer, self.model_type))

    def _per_request(self, prompts: Sequence[Prompt], params: SamplingParams, rank: int) -> list[Any]:
        """One ``SamplingParams`` per prompt, each with its own :func:`request_seed` (None: unseeded)."""
        if params.seed is None:
            return [self._sampling_params(params)] * len(prompts)
        return [self._sampling_params(params, request_seed(params.seed, rank, i, params.num_samples_per_prompt))
                for i in range(len(prompts))]

    def _group_requests(self, prompts: Sequence[Prompt], params: SamplingParams) -> tuple[list[Prompt], Any, int]:
        """The requests this rank submits: its own, or under TP those of every rank of its group (in
        group order, each with its rank's sampling parameters and seeds), and where its own start."""
        import torch.distributed as dist

        if self._tp_group is None:
            return list(prompts), self._per_request(prompts, params, _global_rank()), 0
        members: list[Any] = [None] * self.tensor_parallel_size
        dist.all_gather_object(members, (list(prompts), params), group=self._tp_group)
        me = dist.get_rank(self._tp_group)
        ranks = dist.get_process_group_ranks(self._tp_group)
        everything, per_request, start = [], [], 0
        for index, (their_prompts, their_params) in enumerate(members):
            if index == me:
                start = len(everything)
            everything.extend(their_prompts)
            per_request.extend(self._per_request(their_prompts, their_params, ranks[index]))
        return everything, per_request, start

    def _check_video_timing(self, prompts: Sequence[Prompt]) -> None:
        """Refuse Qwen2.5-VL videos where vLLM would process them at 24 fps whatever their own rate."""
        if self.model_type != "qwen2_5_vl" or self.release >= QWEN2_5_VL_VIDEO_METADATA_SINCE:
            return
        with_video = [p.prompt_id for p in prompts if p.videos]
        if with_video:
            raise ValueError(
                f"prompts {with_video[:3]} hold videos, but vLLM {self._vllm.__version__}'s Qwen2.5-VL input "
                "parser drops the per-video metadata (before 0.31), so transformers would take 24 fps and "
                "the rollout's video positions (second_per_grid_ts) would differ from the trainer's. Use "
                "vLLM >= 0.31, or [rollout] backend = \"hf\" for video prompts"
            )

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[RolloutGroup]:
        everything, sampling, start = self._group_requests(prompts, params)
        self._check_video_timing(everything)
        requests = [self._request(render_prompt(self.processor, p), p) if p.token_ids is None else
                    self._request("", self._collapsed(p)) for p in everything]
        self._wake("weights")
        self._wake("kv_cache")
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        self.sleep()
        if len(outputs) != len(everything):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(everything)} prompts")
        outputs = outputs[start:start + len(prompts)]
        groups, dropped = [], Counter()
        for prompt, out in zip(prompts, outputs):
            completions = []
            for sample in out.outputs:
                token_ids = list(sample.token_ids)
                if sample.finish_reason in DROPPED_FINISH_REASONS:
                    dropped[str(sample.finish_reason)] += 1
                    continue
                if sample.logprobs is None:
                    raise RuntimeError("vLLM returned no log-probs although SamplingParams.logprobs=0 was set")
                if sample.finish_reason not in FINISH_REASONS:
                    raise RuntimeError(f"prompt {prompt.prompt_id!r}: vLLM returned an unfinished completion "
                                       f"(finish_reason={sample.finish_reason!r})")
                logprobs = [float(step[tok].logprob) for tok, step in zip(token_ids, sample.logprobs)]
                completions.append(Completion(text=sample.text, token_ids=token_ids, logprobs=logprobs,
                                              finish_reason=str(sample.finish_reason)))
            if completions:
                groups.append(RolloutGroup(prompt=prompt, prompt_token_ids=list(out.prompt_token_ids),
                                           completions=completions, weight_version=self.weight_version))
        if dropped:
            self.dropped.update(dropped)
            total = sum(len(out.outputs) for out in outputs)
            logger.warning("vLLM rollout: dropped %d of %d completions (%s) and %d of %d prompts left with none; "
                           "they are not trained on", sum(dropped.values()), total, dict(dropped),
                           len(prompts) - len(groups), len(prompts))
        return groups

    # weights -------------------------------------------------------------------------------------

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load HF-checkpoint-named tensors into the engine's model, reset the prefix and encoder
        caches, and tag later rollouts with ``version``.

        ``named_tensors`` is consumed lazily, ``update_bucket_bytes`` at a time: each bucket is loaded,
        then released, before the next is drawn, so an iterator that makes each tensor on demand (a
        gathered FSDP2 shard, a bf16 cast) keeps one bucket alive at a time."""
        self._wake("weights")
        bucket: list[tuple[str, torch.Tensor]] = []
        size = 0
        for name, tensor in named_tensors:
            bucket.append((name, tensor))
            size += tensor.numel() * tensor.element_size()
            del tensor
            if size >= self.update_bucket_bytes:
                self._load_bucket(bucket)
                bucket, size = [], 0
        if bucket:
            self._load_bucket(bucket)
        del bucket
        if self.llm.reset_prefix_cache() is False:
            raise RuntimeError("vLLM could not reset its prefix cache after a weight update (requests still "
                               "running?); cached KV would come from the old weights")
        reset_encoder = getattr(self.llm, "reset_encoder_cache", None)
        if reset_encoder is None:
            raise RuntimeError(f"vLLM {self._vllm.__version__} has no LLM.reset_encoder_cache(): images and videos "
                               "seen before the update would keep their old embeddings. Use a vLLM of the "
                               "supported range (>= 0.20)")
        reset_encoder()
        self.weight_version = version

    def _load_bucket(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        for loaded in self.llm.collective_rpc("cosmos_load_weights", args=(bucket,)):
            self._loaded.update(loaded)

    @property
    def checksum_layout(self) -> str | None:
        """The names :meth:`weight_checksums` answers to: vLLM's in-memory module tree, fused; None
        under TP, where a rank's tensors are shards (check with :meth:`unloaded_weights` instead)."""
        return "vllm" if self.tensor_parallel_size == 1 else None

    def unloaded_weights(self) -> list[str]:
        """vLLM's names of this rank's tensors that no :meth:`update_weights` has loaded yet."""
        self._wake("weights")
        held = self.llm.collective_rpc("cosmos_parameter_names")[0]
        return sorted(set(held) - self._loaded)

    def weight_checksums(self, names: Sequence[str]) -> dict[str, float]:
        """float64 sums of the engine's tensors, by vLLM's own parameter names (``checksum_layout``),
        for the first-sync equality check. Names the engine does not hold are left out.

        Raises:
            RuntimeError: under TP (each rank holds shards, whose sums say nothing of the full tensors).
        """
        if self.checksum_layout is None:
            raise RuntimeError(f"weight_checksums with tensor_parallel_size={self.tensor_parallel_size}: a rank "
                               "holds shards; check coverage with unloaded_weights()")
        self._wake("weights")
        return self.llm.collective_rpc("cosmos_weight_checksums", args=(list(names),))[0]


def _global_rank() -> int:
    """This process's rank in the job (0 outside torch.distributed): part of each request's seed."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def release(vllm: Any) -> tuple[int, ...]:
    """vLLM's release as ``(major, minor, patch)`` from ``vllm.__version__`` (``"0.30.1rc2"`` -> ``(0, 30, 1)``)."""
    numbers = re.findall(r"\d+", str(getattr(vllm, "__version__", "0")).split("+")[0])[:3]
    return tuple(int(n) for n in numbers) + (0,) * (3 - len(numbers))


def _tp_group(tp_size: int, given: Any) -> Any:
    """This rank's TP group, checked against vLLM's layout (``tp_size`` consecutive ranks)."""
    import torch.distributed as dist

    if given is None:
        from cosmos_primitives.config.policy import ParallelismConfig
        from cosmos_primitives.parallel.mesh import ParallelMesh

        given = ParallelMesh(ParallelismConfig(tp_size=tp_size)).group("tp")
    rank = dist.get_rank()
    expected = list(range(rank - rank % tp_size, rank - rank % tp_size + tp_size))
    ranks = dist.get_process_group_ranks(given)
    if ranks != expected:
        raise ValueError(f"rank {rank}'s TP group is ranks {ranks}, but vLLM's external launcher puts it with "
                         f"ranks {expected} (tp innermost); build the rollout mesh with tp as its last dim")
    return given


def _group_seed(seed: int, group: Any) -> int:
    """The seed of the group's first rank: a TP group samples in lockstep, so it needs one."""
    import torch.distributed as dist

    box = [seed]
    dist.broadcast_object_list(box, src=dist.get_process_group_ranks(group)[0], group=group)
    return int(box[0])


_TIMESTAMP = re.compile(r"<\d+(\.\d+)? seconds>")  # Qwen3-VL's text before each temporal patch of a video


def vllm_token_prompt(prompt: Prompt, tokenizer: Any, model_type: str | None) -> list[int]:
    """``prompt.token_ids`` (``[L]``, a multi-turn episode's tokens so far: its media already expanded
    by a processor into runs of pads) in the form vLLM takes a token prompt with media: ONE placeholder
    per image / video, which vLLM expands itself.

    Why, per vLLM's source (``vllm/multimodal/processing/processor.py``): for a prompt given as token
    ids ``BaseMultiModalProcessor._apply_hf_processor_main`` returns ``is_update_applied=False`` (only
    a text prompt may let the HF processor expand placeholders), so ``_maybe_apply_prompt_updates``
    calls ``_apply_prompt_updates`` -> ``apply_token_matches`` / ``_apply_matches``: item ``k`` of a
    modality replaces the FIRST match of its target at or after the end of item ``k - 1``'s match
    with its full expansion. The targets (``_get_prompt_updates`` of ``qwen2_vl.py``, which
    Qwen2.5-VL uses, and of ``qwen3_vl.py``) are one ``<|image_pad|>`` per image (expanded to
    ``t * h * w / merge**2`` pads), one ``<|video_pad|>`` per Qwen2.5-VL video, and the triple
    ``<|vision_start|><|video_pad|><|vision_end|>`` per Qwen3-VL video (expanded to one
    ``<t seconds><|vision_start|>pads<|vision_end|>`` block per temporal patch). Ids that already
    hold a run of N pads would get the first pad expanded to N and keep N - 1 stray pads after it
    (a second image's expansion would land inside the first image's run): the placeholders found
    then (``_find_mm_placeholders``) do not cover the stray pads, so vLLM would embed them as text.
    Each run (Qwen3-VL: each video's block of patches) is therefore collapsed to one placeholder.

    Raises:
        ValueError: the runs found differ in number from the prompt's images / videos, or the model
            type has no known placeholders.
    """
    ids = list(prompt.token_ids or [])
    if model_type not in ("qwen2_5_vl", "qwen3_vl"):
        raise ValueError(f"prompt {prompt.prompt_id!r} gives token_ids and media, but this adapter knows the "
                         f"media placeholders of Qwen2.5-VL and Qwen3-VL only, not of {model_type!r}")
    start, image, video, end = (tokenizer.convert_tokens_to_ids(t) for t in
                                ("<|vision_start|>", "<|image_pad|>", "<|video_pad|>", "<|vision_end|>"))
    ids, images = _collapse_runs(ids, image)
    if model_type == "qwen3_vl":
        ids, videos = _collapse_qwen3_videos(ids, tokenizer, start, video, end)
    else:
        ids, videos = _collapse_runs(ids, video)
    for name, found, given in (("<|image_pad|>", images, len(prompt.images)),
                               ("<|video_pad|>", videos, len(prompt.videos))):
        if found != given:
            raise ValueError(f"prompt {prompt.prompt_id!r}: its token_ids hold {found} runs of {name} but it gives "
                             f"{given} {name[2:7]}s; vLLM pairs each placeholder with one item, in order")
    return ids


def _collapse_runs(ids: list[int], pad: int) -> tuple[list[int], int]:
    """``ids`` with every run of ``pad`` made one ``pad``, and the number of runs."""
    out: list[int] = []
    runs = 0
    for i, tok in enumerate(ids):
        if tok == pad and i and ids[i - 1] == pad:
            continue
        runs += tok == pad
        out.append(tok)
    return out, runs


def _collapse_qwen3_videos(ids: list[int], tokenizer: Any, start: int, pad: int, end: int) -> tuple[list[int], int]:
    """Each Qwen3-VL video block (``<t seconds>`` + start + pads + end, once per temporal patch) made
    ``start, pad, end`` again, and the number of videos."""
    def timestamp_before(i: int, floor: int) -> int:  # where the timestamp text ending at i begins, or -1
        for k in range(1, min(16, i - floor) + 1):
            if _TIMESTAMP.fullmatch(tokenizer.decode(ids[i - k:i])):
                return i - k
        return -1

    out: list[int] = []
    videos, i = 0, 0
    while i < len(ids):
        if not (ids[i] == start and i + 1 < len(ids) and ids[i + 1] == pad):
            out.append(ids[i])
            i += 1
            continue
        head = timestamp_before(i, 0)
        if head >= 0 and out[len(out) - (i - head):] == ids[head:i]:
            del out[len(out) - (i - head):]
        while i < len(ids) and ids[i] == start and i + 1 < len(ids) and ids[i + 1] == pad:
            j = i + 1
            while j < len(ids) and ids[j] == pad:
                j += 1
            if j >= len(ids) or ids[j] != end:
                raise ValueError("a run of <|video_pad|> not closed by <|vision_end|>")
            i = j + 1
            k = i
            while k < len(ids) and k - i < 16 and ids[k] != start:
                k += 1
            if k < len(ids) and ids[k] == start and timestamp_before(k, i) == i and k + 1 < len(ids) \
                    and ids[k + 1] == pad:
                i = k  # the video's next temporal patch
        out += [start, pad, end]
        videos += 1
    return out, videos


def _video_metadata(num_frames: int, fps: float, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """vLLM's per-video metadata (the fields of ``transformers.video_utils.VideoMetadata``) for
    frames that are already sampled: the prompt's own (``Prompt.video_metadata``: source fps, source
    frame indices, frames in the sampled range; as the trainer's processor gets it, so Qwen3-VL's
    timestamps and Qwen2.5-VL's ``sampled_fps`` agree), else consecutive frames at ``fps``."""
    if metadata is None:
        return {"total_num_frames": num_frames, "fps": float(fps), "duration": num_frames / float(fps),
                "frames_indices": list(range(num_frames))}
    total, source_fps = int(metadata["total_num_frames"]), float(metadata["fps"])
    return {"total_num_frames": total, "fps": source_fps, "duration": total / source_fps,
            "frames_indices": [int(i) for i in metadata["frames_indices"]]}
