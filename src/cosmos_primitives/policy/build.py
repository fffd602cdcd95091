"""``[policy]`` -> a ready-to-train :class:`CausalLMPolicy`: load, freeze, checkpointing, TP, FSDP2
(with the ``[train]`` memory options: CPU offload, bfloat16 master weights)."""

from __future__ import annotations

import torch

from cosmos_primitives.config.policy import PolicyConfig
from cosmos_primitives.config.train import TrainConfig
from cosmos_primitives.logging.console import get_logger
from cosmos_primitives.models.qwen_tensor_parallel import apply_tensor_parallel
from cosmos_primitives.parallel.activation_checkpoint import apply_activation_checkpointing
from cosmos_primitives.parallel.compile import COMPILE_DEVICE_TYPES, apply_compile
from cosmos_primitives.parallel.fsdp import apply_fsdp
from cosmos_primitives.parallel.mesh import ParallelMesh
from cosmos_primitives.parallel.varlen_attention import enable_varlen_attention
from cosmos_primitives.policy.hf_loading import load_hf_model, resolve_dtype
from cosmos_primitives.policy.lm_policy import CausalLMPolicy
from cosmos_primitives.policy.lora import apply_lora
from cosmos_primitives.policy.trainable import apply_trainable_patterns, trainable_summary

log = get_logger()

LORA_PARAMETERS = r"\.lora_(A|B)\."
"""Names of peft LoRA weights (``q_proj.lora_A.default.weight``): what trains with ``[policy.lora]``."""


def build_policy(
    cfg: PolicyConfig,
    mesh: ParallelMesh | None = None,
    *,
    hf_model: torch.nn.Module | None = None,
    device: torch.device | str | None = None,
    train: TrainConfig | None = None,
    frozen: bool = False,
) -> CausalLMPolicy:
    """Build the trainable policy described by ``[policy]``.

    Steps, in the order FSDP2 needs: load ``model_name_or_path`` (or take ``hf_model``), add LoRA
    adapters when ``[policy.lora]`` is set (then the adapters train and the base weights are frozen,
    unless ``trainable_patterns`` name more), apply ``trainable_patterns`` / ``freeze_patterns``
    (logging the trainable count),
    ``model_gradient_checkpointing``, wrap in :class:`CausalLMPolicy`, tensor-parallelise the
    Qwen2 layers over ``mesh["tp"]`` when ``tp_size > 1``, ``torch.compile`` each block with
    ``[train] compile`` (:func:`~cosmos_primitives.parallel.apply_compile`; on a CUDA device only,
    logged otherwise; not for ``frozen``), and shard with FSDP2 over ``mesh.fsdp_mesh`` (HSDP when
    ``dp_replicate_size > 1``), each unit resharded after its forward or not as ``[train]
    fsdp_reshard_after_forward`` says (:func:`~cosmos_primitives.parallel.fsdp.resolve_reshard_after_forward`).

    Precision: with a mesh, master weights are ``[train] master_dtype`` (float32 by default; AdamW
    state is float32 either way, see :func:`~cosmos_primitives.policy.build_optimizer`) and
    forward / backward compute in ``[policy] dtype`` (FSDP mixed precision, float32 gradient
    reduction). ``[train] fsdp_offload`` keeps the sharded parameters, gradients and optimizer
    state in host memory (FSDP2 ``CPUOffloadPolicy``; the optimizer steps on the CPU). Without a
    mesh the weights are loaded directly in ``[policy] dtype`` and moved to ``device``.

    ``frozen=True`` builds a model to evaluate, not to train (the GRPO KL reference): no adapters,
    no gradients, no checkpointing, weights stored in ``[policy] dtype`` and, with a mesh, sharded
    like the policy (TP, then FSDP2 over the same mesh, offloaded with ``fsdp_offload``), so each
    rank holds ``1 / dp_shard`` of it.

    Args:
        cfg: ``[policy]``.
        mesh: the trainer's mesh; None = no sharding (single process, e.g. a reference model).
        hf_model: an already built HF model to use instead of loading ``model_name_or_path``
            (cast to ``master_dtype`` master weights with a mesh, to ``[policy] dtype`` without).
        device: target device without a mesh (with one, FSDP places shards on the mesh device).
        train: ``[train]``, for ``fsdp_offload``, ``master_dtype``, ``compile`` and
            ``fsdp_reshard_after_forward`` (None: their defaults).
        frozen: build an evaluation-only copy (see above).

    Attention: a text decoder loaded with ``"sdpa"`` (``load_hf_model``'s default) is switched to
    :func:`~cosmos_primitives.parallel.enable_varlen_attention` (packed samples attend per sample,
    no ``[B, 1, T, T]`` mask; padded batches and ``generate`` as under SDPA), except with context
    parallel, which sets its own.

    Context parallel (``cp_size > 1``): the policy splits every row over ``mesh.group("cp")``
    (:mod:`cosmos_primitives.policy.cp_logprobs`; all ranks of a cp group take the same batch) and
    FSDP2 shards over dp_shard x cp; each cp rank's share of a gradient comes scaled by the cp
    size, so FSDP's average over dp_shard x cp is the data-parallel average of the full gradient.

    Raises:
        NotImplementedError: ``pp_size`` > 1.
        ValueError: ``master_dtype = "bfloat16"`` with a float32 ``[policy] dtype``.
        MissingExtraError: ``[policy.lora]`` without peft installed (the ``lora`` extra).
    """
    if mesh is not None and mesh.enabled("pp"):
        raise NotImplementedError(
            f"[policy.parallelism] pp_size={mesh.size('pp')}: pipeline parallelism is not supported by cp.policy; "
            "use dp_shard_size / dp_replicate_size / tp_size / cp_size"
        )
    compute_dtype = resolve_dtype(cfg.dtype)
    train = train if train is not None else TrainConfig()
    master_dtype = compute_dtype if frozen else resolve_dtype(train.master_dtype)
    if master_dtype.itemsize < compute_dtype.itemsize:
        raise ValueError(
            f"[train] master_dtype = {train.master_dtype!r} is narrower than [policy] dtype = {cfg.dtype!r}: "
            "master weights must hold at least the compute precision; set train.master_dtype=float32"
        )
    load_dtype = master_dtype if mesh is not None else compute_dtype
    if hf_model is None:
        if not cfg.model_name_or_path:
            raise ValueError("[policy] model_name_or_path is empty: set it to a model folder or Hub repo id")
        hf_model = load_hf_model(cfg.model_name_or_path, revision=cfg.model_revision, dtype=load_dtype)
    else:
        hf_model = hf_model.to(load_dtype)
    context_parallel = mesh is not None and mesh.enabled("cp")  # it sets its own attention
    if not context_parallel and hf_model.config.get_text_config()._attn_implementation == "sdpa":
        enable_varlen_attention(hf_model)
    if frozen:
        hf_model.requires_grad_(False)
        summary = trainable_summary(hf_model)
    elif cfg.lora is not None and cfg.lora.enabled:
        # adapters on the [policy.lora] target modules; they train, plus whatever trainable_patterns add
        apply_lora(hf_model, cfg.lora)
        summary = apply_trainable_patterns(hf_model, cfg.freeze_patterns, [LORA_PARAMETERS, *cfg.trainable_patterns])
    else:
        summary = apply_trainable_patterns(hf_model, cfg.freeze_patterns, cfg.trainable_patterns)
    log.info(f"{'frozen ' if frozen else ''}policy {type(hf_model).__name__}: {summary}")
    if cfg.model_gradient_checkpointing and not frozen:
        apply_activation_checkpointing(hf_model)
    cp_group = mesh.group("cp") if mesh is not None and mesh.enabled("cp") else None
    policy = CausalLMPolicy(hf_model, chunk_size=cfg.logprob_chunk_size, cp_group=cp_group)
    policy.trainable_summary = summary
    if mesh is not None and mesh.enabled("tp"):
        apply_tensor_parallel(hf_model, mesh["tp"])
    if train.compile and not frozen:
        # after checkpointing and TP, before FSDP2 (torchtitan's order): FSDP's hooks stay outside
        device_type = _device_type(hf_model, mesh, device)
        if device_type in COMPILE_DEVICE_TYPES:
            compiled = apply_compile(hf_model, compute_dtype=compute_dtype, device_type=device_type)
            log.info(f"[train] compile: {compiled.summary()}")
        else:
            log.info(f"[train] compile = true is not applied on {device_type!r} (only on "
                     f"{', '.join(COMPILE_DEVICE_TYPES)}): compiling there takes longer than the runs it is for")
    if mesh is not None and (mesh.fsdp_mesh.size() > 1 or compute_dtype != master_dtype or train.fsdp_offload):
        # the KL reference never runs a backward: gathered weights kept after its forward would stay
        reshard = "always" if frozen else train.fsdp_reshard_after_forward
        apply_fsdp(policy, mesh, param_dtype=compute_dtype, offload=train.fsdp_offload, reshard_after_forward=reshard)
    elif mesh is not None:
        # one FSDP rank shards nothing, and master weights already in the compute dtype need no
        # mixed precision: plain module, no per-step all-gather / reduce-scatter copies
        log.info(f"FSDP2 skipped: a single data-parallel rank with {master_dtype} weights and compute")
        policy.to(mesh.device_type)
    elif device is not None:
        policy.to(device)
    return policy.eval() if frozen else policy.train()


def _device_type(model: torch.nn.Module, mesh: ParallelMesh | None, device: torch.device | str | None) -> str:
    """Where ``model`` will run: the mesh's device type, else ``device``'s, else its weights'."""
    if mesh is not None:
        return mesh.device_type
    if device is not None:
        return torch.device(device).type
    return next(model.parameters()).device.type
