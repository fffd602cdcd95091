"""``[policy]`` -> a ready-to-train :class:`CausalLMPolicy`: load, freeze, checkpointing, TP, FSDP2."""

from __future__ import annotations

import torch

from cosmos_primitives.checkpoint.hf_loading import load_hf_model, resolve_dtype
from cosmos_primitives.config.policy import PolicyConfig
from cosmos_primitives.logging.console import get_logger
from cosmos_primitives.parallel.activation_checkpoint import apply_activation_checkpointing
from cosmos_primitives.parallel.fsdp import apply_fsdp
from cosmos_primitives.parallel.mesh import ParallelMesh
from cosmos_primitives.parallel.tensor_parallel import apply_tensor_parallel
from cosmos_primitives.policy.lm_policy import CausalLMPolicy
from cosmos_primitives.policy.lora import apply_lora
from cosmos_primitives.policy.trainable import apply_trainable_patterns

log = get_logger()

LORA_PARAMETERS = r"\.lora_(A|B)\."
"""Names of peft LoRA weights (``q_proj.lora_A.default.weight``): what trains with ``[policy.lora]``."""


def build_policy(
    cfg: PolicyConfig,
    mesh: ParallelMesh | None = None,
    *,
    hf_model: torch.nn.Module | None = None,
    device: torch.device | str | None = None,
) -> CausalLMPolicy:
    """Build the trainable policy described by ``[policy]``.

    Steps, in the order FSDP2 needs: load ``model_name_or_path`` (or take ``hf_model``), add LoRA
    adapters when ``[policy.lora]`` is set (then the adapters train and the base weights are frozen,
    unless ``trainable_patterns`` name more), apply ``trainable_patterns`` / ``freeze_patterns``
    (logging the trainable count),
    ``model_gradient_checkpointing``, wrap in :class:`CausalLMPolicy`, tensor-parallelise the
    Qwen2 layers over ``mesh["tp"]`` when ``tp_size > 1``, and shard with FSDP2 over
    ``mesh.fsdp_mesh`` (HSDP when ``dp_replicate_size > 1``).

    Precision: with a mesh, master weights (and AdamW state) are ``[policy] master_dtype`` (float32
    by default; cosmos-rl's ``train.master_dtype``) and forward / backward compute in ``[policy]
    dtype`` (FSDP mixed precision, float32 gradient reduction). Without a
    mesh the weights are loaded directly in ``[policy] dtype`` and moved to ``device``.

    Args:
        cfg: ``[policy]``.
        mesh: the trainer's mesh; None = no sharding (single process, e.g. a reference model).
        hf_model: an already built HF model to use instead of loading ``model_name_or_path``
            (cast to ``master_dtype`` master weights with a mesh, to ``[policy] dtype`` without).
        device: target device without a mesh (with one, FSDP places shards on the mesh device).

    Context parallel (``cp_size > 1``): the policy splits every row over ``mesh.group("cp")``
    (:mod:`cosmos_primitives.policy.cp_logprobs`; all ranks of a cp group take the same batch) and
    FSDP2 shards over dp_shard x cp; each cp rank's share of a gradient comes scaled by the cp
    size, so FSDP's average over dp_shard x cp is the data-parallel average of the full gradient.

    Raises:
        NotImplementedError: ``pp_size`` > 1.
        MissingExtraError: ``[policy.lora]`` without peft installed (the ``lora`` extra).
    """
    if mesh is not None and mesh.enabled("pp"):
        raise NotImplementedError(
            f"[policy.parallelism] pp_size={mesh.size('pp')}: pipeline parallelism is not supported by cp.policy; "
            "use dp_shard_size / dp_replicate_size / tp_size / cp_size"
        )
    compute_dtype = resolve_dtype(cfg.dtype)
    master_dtype = resolve_dtype(cfg.master_dtype)
    if hf_model is None:
        if not cfg.model_name_or_path:
            raise ValueError("[policy] model_name_or_path is empty: set it to a model folder or Hub repo id")
        hf_model = load_hf_model(cfg.model_name_or_path, revision=cfg.model_revision,
                                 dtype=master_dtype if mesh is not None else compute_dtype)
    else:
        hf_model = hf_model.to(master_dtype if mesh is not None else compute_dtype)
    if cfg.lora is not None and cfg.lora.enabled:
        # adapters on the [policy.lora] target modules; they train, plus whatever trainable_patterns add
        apply_lora(hf_model, cfg.lora)
        summary = apply_trainable_patterns(hf_model, cfg.freeze_patterns, [LORA_PARAMETERS, *cfg.trainable_patterns])
    else:
        summary = apply_trainable_patterns(hf_model, cfg.freeze_patterns, cfg.trainable_patterns)
    log.info(f"policy {type(hf_model).__name__}: {summary}")
    if cfg.model_gradient_checkpointing:
        apply_activation_checkpointing(hf_model)
    cp_group = mesh.group("cp") if mesh is not None and mesh.enabled("cp") else None
    policy = CausalLMPolicy(hf_model, chunk_size=cfg.logprob_chunk_size, cp_group=cp_group)
    policy.trainable_summary = summary
    if mesh is not None and mesh.enabled("tp"):
        apply_tensor_parallel(hf_model, mesh["tp"])
    if mesh is not None and (mesh.fsdp_mesh.size() > 1 or compute_dtype != master_dtype):
        apply_fsdp(policy, mesh, param_dtype=compute_dtype if compute_dtype != master_dtype else None)
    elif mesh is not None:
        # one FSDP rank shards nothing and computing in the stored dtype needs no mixed precision:
        # plain module, no per-step all-gather / reduce-scatter copies
        log.info(f"FSDP2 skipped: a single data-parallel rank computing in its {cfg.master_dtype} weights")
        policy.to(mesh.device_type)
    elif device is not None:
        policy.to(device)
    policy.train()
    return policy

