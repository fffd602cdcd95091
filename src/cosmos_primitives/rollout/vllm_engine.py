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
  weights, the next ``generate`` wakes the KV cache.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from cosmos_primitives.data.prompt_inputs import render_prompt
from cosmos_primitives.data.records import Completion, Prompt, RolloutGroup, SamplingParams
from cosmos_primitives.utils.extras import require

WORKER_EXTENSION = "cosmos_primitives.rollout.vllm_engine.CosmosWorkerExtension"
# what vLLM's CompletionOutput.finish_reason can say of a finished request (vllm/v1/engine FinishReason)
FINISH_REASONS = ("stop", "length", "abort", "error")
DEFAULT_GPU_MEMORY_UTILIZATION = 0.3
_LAUNCHER_ENV = ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class CosmosWorkerExtension:
    """Methods mixed into every vLLM worker (``worker_extension_cls``); reached by ``collective_rpc``."""

    def cosmos_load_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> list[str]:
        """Load full checkpoint-named tensors (each TP rank keeps its slice); the vLLM names loaded."""
        model = self.model_runner.model  # type: ignore[attr-defined]
        loaded = model.load_weights(weights=named_tensors)
        return sorted(loaded) if loaded is not None else []

    def cosmos_parameter_names(self) -> list[str]:
        return [name for name, _ in self.model_runner.model.named_parameters()]  # type: ignore[attr-defined]

    def cosmos_weight_checksums(self, names: list[str]) -> dict[str, float]:
        """float64 sums of the named parameters, in vLLM's own names (fused tensors whole)."""
        params = dict(self.model_runner.model.named_parameters())  # type: ignore[attr-defined]
        return {n: float(params[n].detach().double().sum()) for n in names if n in params}


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
        sleep_level: 1 to sleep between rollouts (colocated with a trainer), 0 never.
        engine_ranks: the global ranks that build an engine (see :func:`launcher_settings`).
        tp_group: under torchrun with ``tensor_parallel_size > 1``, this rank's TP group (the
            ``"tp"`` group of a :class:`~cosmos_primitives.parallel.mesh.ParallelMesh` over the
            rollout sizes); default: built here from such a mesh. Collective: every rank builds its
            engine together.
        llm_kwargs: anything else for ``LLM``.

    Raises:
        ValueError: ``tp_group`` is not the ranks vLLM puts in this rank's TP group.
    """

    def __init__(self, model_path: str, processor: Any, *, tensor_parallel_size: int = 1,
                 gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION, enforce_eager: bool = True,
                 dtype: str = "bfloat16", max_model_len: int | None = None, seed: int = 0, weight_version: int = 0,
                 sleep_level: int = 0, engine_ranks: Sequence[int] | None = None, tp_group: Any = None,
                 llm_kwargs: dict[str, Any] | None = None) -> None:
        if sleep_level not in (0, 1):
            raise ValueError(f"sleep_level must be 0 (never) or 1 (weights to CPU, KV cache freed), got {sleep_level}")
        vllm = require("vllm", "vLLM rollouts")
        self._vllm = vllm
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
            # log-probs of the temperature-scaled distribution, as HFRolloutEngine reports them
            "logprobs_mode": "processed_logprobs",
            **launcher,
        }
        if sleep_level:
            kwargs["enable_sleep_mode"] = True
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
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

    @property
    def tp_group(self) -> Any:
        """This rank's TP group (``tensor_parallel_size`` consecutive ranks of the job) under torchrun with
        ``tensor_parallel_size > 1``, else None. Its ranks must call :meth:`generate` and
        :meth:`update_weights` together."""
        return self._tp_group

    # sleep mode ----------------------------------------------------------------------------------

    def _wake(self, tag: str) -> None:
        if tag in self._asleep:
            self.llm.wake_up(tags=[tag])
            self._asleep.discard(tag)

    def sleep(self) -> None:
        """Free the KV cache and offload the weights to CPU (a no-op with ``sleep_level=0``)."""
        if self.sleep_level and not self._asleep:
            self.llm.sleep(level=self.sleep_level)
            self._asleep = {"weights", "kv_cache"}

    # generation ----------------------------------------------------------------------------------

    def _sampling_params(self, params: SamplingParams) -> Any:
        kwargs: dict[str, Any] = {
            "n": params.n,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k if params.top_k > 0 else 0,  # vLLM's "off" (its default)
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
        """One vLLM prompt dict. Each video goes with its own metadata (``fps``, frames already
        sampled), which is what the Qwen2.5-VL processor reads its per-video frame rate from;
        ``mm_processor_kwargs={"fps": ...}`` would apply one rate to every video of the prompt.
        Qwen3-VL (vLLM's ``Qwen3VLProcessingInfo._get_video_second_idx``) takes each frame's timestamp
        text as ``frames_indices[i] / fps`` and, without ``do_sample_frames`` in the metadata or the
        processor kwargs, does not sample again: frames sampled at ``fps`` get times ``i / fps``."""
        request: dict[str, Any] = {"prompt": text}
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

    def _group_requests(self, prompts: Sequence[Prompt], params: SamplingParams) -> tuple[list[Prompt], Any, int]:
        """The requests this rank submits: its own, or under TP those of every rank of its group (in
        group order, each with its rank's sampling parameters), and where its own start."""
        if self._tp_group is None:
            return list(prompts), self._sampling_params(params), 0
        import torch.distributed as dist

        members: list[Any] = [None] * self.tensor_parallel_size
        dist.all_gather_object(members, (list(prompts), params), group=self._tp_group)
        me = dist.get_rank(self._tp_group)
        everything, per_request, start = [], [], 0
        for index, (their_prompts, their_params) in enumerate(members):
            if index == me:
                start = len(everything)
            everything.extend(their_prompts)
            sent = self._sampling_params(their_params)  # one object per rank: vLLM seeds each request
            per_request.extend([sent] * len(their_prompts))
        return everything, per_request, start

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[RolloutGroup]:
        everything, sampling, start = self._group_requests(prompts, params)
        requests = [self._request(render_prompt(self.processor, p), p) for p in everything]
        self._wake("weights")
        self._wake("kv_cache")
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        self.sleep()
        if len(outputs) != len(everything):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(everything)} prompts")
        outputs = outputs[start:start + len(prompts)]
        groups = []
        for prompt, out in zip(prompts, outputs):
            completions = []
            for sample in out.outputs:
                token_ids = list(sample.token_ids)
                if sample.logprobs is None:
                    raise RuntimeError("vLLM returned no log-probs although SamplingParams.logprobs=0 was set")
                if sample.finish_reason not in FINISH_REASONS:
                    raise RuntimeError(f"prompt {prompt.prompt_id!r}: vLLM returned an unfinished completion "
                                       f"(finish_reason={sample.finish_reason!r})")
                logprobs = [float(step[tok].logprob) for tok, step in zip(token_ids, sample.logprobs)]
                completions.append(Completion(text=sample.text, token_ids=token_ids, logprobs=logprobs,
                                              finish_reason=str(sample.finish_reason)))
            groups.append(RolloutGroup(prompt=prompt, prompt_token_ids=list(out.prompt_token_ids),
                                       completions=completions, weight_version=self.weight_version))
        return groups

    # weights -------------------------------------------------------------------------------------

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load HF-checkpoint-named tensors into the engine's model, reset the prefix cache, and tag
        later rollouts with ``version``. The tensors are read during the call only."""
        batch = list(named_tensors)
        self._wake("weights")
        for loaded in self.llm.collective_rpc("cosmos_load_weights", args=(batch,)):
            self._loaded.update(loaded)
        if self.llm.reset_prefix_cache() is False:
            raise RuntimeError("vLLM could not reset its prefix cache after a weight update (requests still "
                               "running?); cached KV would come from the old weights")
        self.weight_version = version

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
