"""Bytes per GPU of a training run, from its config and the model's shape, before anything is built.

The model of memory (per rank; ``S`` = FSDP shard ranks ``dp_shard x cp``, ``tp`` = tensor-parallel
ranks, ``m`` / ``c`` = bytes of ``[train] master_dtype`` / ``[policy] dtype``, ``T`` = tokens of one
micro-batch; ``N`` parameters, ``N_t`` trainable, ``R`` outside the blocks, ``B`` the largest block):

- **parameters** ``N m / (S tp)``; **gradients** ``N_t m / (S tp)``; **optimizer** (AdamW, float32
  moments) ``8 N_t / (S tp)``. With ``[train] fsdp_offload`` these three live in host memory.
- **gathered units** (FSDP2 mixed precision): the root unit stays gathered from its forward to the
  end of the backward (``R c``) and one or two blocks are gathered at a time (``B c`` each, one
  prefetched); when the blocks are not resharded after forward (``[train]
  fsdp_reshard_after_forward``: ``"never"``, or ``"default"`` with one shard rank and no offload)
  the whole model is gathered at the end of the forward (``N c / tp``). At the end of the backward
  the root's unsharded gradient (``R c``) and its float32 copy for the reduce-scatter (``4 R``)
  exist together.
- **activations** per token and decoder layer (HF Qwen2 eager autograd, SDPA): ``c (6 h + 4 kv +
  4 I) + 8 h`` bytes (q / k / v / attention output, rotary copies, the four ``I``-wide MLP tensors,
  the float32 inputs of the two RMSNorms); with ``[policy] model_gradient_checkpointing`` each
  layer keeps only its input (``c h``) and one layer is recomputed at a time. Vision-tower
  activations are not counted (its blocks are usually frozen and its inputs short).
- **log-prob head** (``cp.algo`` chunked head): its backward holds the float32 gradient of the LM
  head weight ``4 V h``, its per-chunk low-precision product ``c V h``, and a float32 and a
  ``c`` buffer of ``min(chunk, T) x V``.
- **optimizer step** (``[train] optm_impl``): fused ``torch.optim.AdamW`` needs no temporaries;
  foreach holds one float32 copy of the trainable shard (``sqrt(exp_avg_sq)``) while it steps;
  for-loop a few float32 temporaries of the largest tensor (the embedding); ``BFloat16AdamW``
  updates slices (buckets) of 4 M elements with at most four float32 temporaries of one.
- **reference** (GRPO, ``kl_beta > 0`` without LoRA): ``N c / (S tp)``, sharded like the policy.
- **rollout engine** (colocated GRPO): vLLM takes ``gpu_memory_utilization`` of the device; the
  HF engine holds a full copy ``N c`` and the KV cache of one generate call.

The peak is the largest of four moments: end of forward, LM-head backward, end of backward (root
gradient reduce), optimizer step. On the CPU (``device = "cpu"``) offloading moves nothing, so the
offloaded states count where they are.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

from cosmos_primitives.config.root import Config
from cosmos_primitives.parallel.fsdp import resolve_reshard_after_forward
from cosmos_primitives.parallel.mesh import resolve_sizes
from cosmos_primitives.plan.shape import ModelShape
from cosmos_primitives.utils.engine_choice import resolve_backend

GIB = 1 << 30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class MemoryEstimate(NamedTuple):
    """Bytes per rank of each part (see the module docstring) and the peak they add up to."""

    parameters: int
    gradients: int
    optimizer: int
    gathered: int  # FSDP all-gathered units and unsharded root gradient at its worst moment
    activations: int
    logprob_head: int
    optimizer_step: int
    reference: int
    rollout_engine: int
    host: int  # offloaded parameters, gradients and optimizer state (host memory, not the device)
    total: int  # the peak on the device
    tokens: int
    activation_bytes_per_token: int
    notes: tuple[str, ...]

    def report(self, device_memory: int | None = None) -> str:
        """A log block: one line per part, the total, and a warning when it exceeds ``device_memory``."""
        rows = [("parameters", self.parameters), ("gradients", self.gradients), ("optimizer state", self.optimizer),
                ("gathered FSDP units", self.gathered),
                (f"activations ({self.tokens} tokens x {self.activation_bytes_per_token / 2**10:.0f} KiB)",
                 self.activations),
                ("log-prob head", self.logprob_head), ("optimizer step", self.optimizer_step),
                ("KL reference", self.reference), ("rollout engine", self.rollout_engine)]
        lines = ["memory plan per GPU (peak = largest moment of a step, not the sum of the lines):"]
        lines += [f"  {name:<44} {value / GIB:8.2f} GiB" for name, value in rows]
        if self.host:
            lines.append(f"  {'host memory (fsdp_offload)':<44} {self.host / GIB:8.2f} GiB")
        of = f" of {device_memory / GIB:.1f} GiB" if device_memory else ""
        lines.append(f"  {'peak':<44} {self.total / GIB:8.2f} GiB{of}")
        lines += [f"  note: {n}" for n in self.notes]
        if device_memory and self.total > device_memory:
            lines.append(
                f"WARNING: the estimated peak {self.total / GIB:.1f} GiB exceeds the device's "
                f"{device_memory / GIB:.1f} GiB: expect out-of-memory. Options: more ranks (dp_shard_size), "
                "[policy] model_gradient_checkpointing = true, [train] master_dtype = \"bfloat16\", "
                "[train] fsdp_offload = true, a smaller [train.train_policy] mini_batch / packing_budget, "
                "or a lower [rollout] gpu_memory_utilization")
        return "\n".join(lines)


def micro_batch_tokens(cfg: Config) -> int:
    """Tokens of one forward / backward: SFT packs ``mini_batch`` rows of ``packing_budget`` (or
    ``model_max_length``); GRPO rows are at most ``model_max_length`` long (an upper bound)."""
    policy = cfg.train.train_policy
    if policy.type == "sft":
        return max(1, policy.mini_batch) * (policy.packing_budget or cfg.policy.model_max_length)
    return max(1, policy.mini_batch) * cfg.policy.model_max_length


def activation_bytes_per_token(shape: ModelShape, compute_bytes: int, checkpointing: bool) -> int:
    """Saved-for-backward bytes per token of the whole decoder stack."""
    layer = compute_bytes * (6 * shape.hidden + 4 * shape.kv_dim + 4 * shape.intermediate) + 8 * shape.hidden
    if checkpointing:  # layer inputs kept, one layer recomputed at a time
        stack = shape.layers * compute_bytes * shape.hidden + layer
    else:
        stack = shape.layers * layer
    # embedding output, final norm (float32 input), hidden states into the head
    return stack + (3 * compute_bytes + 4) * shape.hidden


def estimate_memory(cfg: Config, shape: ModelShape, *, world_size: int,
                    mode: Literal["sft", "colocated", "disaggregated"] | None = None,
                    device: Literal["cuda", "cpu"] = "cuda", device_memory: int | None = None,
                    tokens: int | None = None) -> MemoryEstimate:
    """Estimate the peak bytes per trainer rank of ``cfg`` on ``world_size`` trainer ranks.

    Args:
        shape: :meth:`ModelShape.from_hf_config` of ``[policy] model_name_or_path``.
        world_size: ranks of the policy mesh (``[policy.parallelism]`` is resolved against it).
        mode: ``"sft"``, ``"colocated"`` (a rollout engine on every trainer GPU) or
            ``"disaggregated"`` (engines on other GPUs); default from ``[train.train_policy] type``
            (``"grpo"`` -> colocated).
        device: ``"cpu"`` counts offloaded states on the device (they are the same memory).
        device_memory: bytes of one device, for vLLM's ``gpu_memory_utilization`` share.
        tokens: tokens per micro-batch (default :func:`micro_batch_tokens`).
    """
    sizes = resolve_sizes(cfg.policy.parallelism, world_size)
    shards, tp = sizes["dp_shard"] * sizes["cp"], sizes["tp"]
    mode = mode or ("sft" if cfg.train.train_policy.type == "sft" else "colocated")
    c = DTYPE_BYTES[cfg.policy.dtype]
    m = DTYPE_BYTES[cfg.train.master_dtype]
    offload = cfg.train.fsdp_offload
    fsdp = shards > 1 or c != m or offload
    split = shards * tp
    tokens = tokens if tokens is not None else micro_batch_tokens(cfg)
    notes: list[str] = []

    parameters = math.ceil(shape.total_params * m / split)
    gradients = math.ceil(shape.trainable_params * m / split)
    optimizer = math.ceil(shape.trainable_params * 8 / split)
    host = 0
    if offload and device == "cuda":
        host = parameters + gradients + optimizer
        parameters = gradients = optimizer = 0
        notes.append("fsdp_offload: parameters, gradients and AdamW state in host memory; the optimizer steps on CPU")

    root, block = shape.root_params // tp, shape.block_params // tp
    reshard = resolve_reshard_after_forward(cfg.train.fsdp_reshard_after_forward, shard_size=shards, offload=offload)
    gathered_forward = ((root + 2 * block) * c if reshard.blocks else shape.total_params // tp * c) if fsdp else 0
    root_reduce = (root * c + root * 4 + block * c) if fsdp else 0  # unsharded root grad + its float32 copy

    per_token = activation_bytes_per_token(shape, c, cfg.policy.model_gradient_checkpointing)
    activations = per_token * tokens
    rows = min(cfg.policy.logprob_chunk_size, tokens)
    head_trains = shape.trainable_params > 0
    head_backward = rows * shape.vocab * (4 + c) + (shape.vocab * shape.hidden * (4 + c) if head_trains else 0)
    head_forward = rows * shape.vocab * 4

    largest_tensor = math.ceil(shape.vocab * shape.hidden / split)  # the embedding shard
    if cfg.train.master_dtype == "bfloat16":
        # BFloat16AdamW: at most four float32 temporaries of one slice or bucket (measured op by op)
        step = 4 * 4 * min(largest_tensor, 1 << 22)
    elif cfg.train.optm_impl == "fused":
        step = 0  # one kernel per tensor list, no temporaries (torch has fused AdamW for CUDA and CPU)
    elif cfg.train.optm_impl == "foreach":
        step = math.ceil(shape.trainable_params * 4 / split)  # sqrt(exp_avg_sq) of every tensor at once
    else:
        step = 2 * 4 * largest_tensor  # one tensor at a time
    if offload and device == "cuda":
        step = 0

    reference = 0
    if cfg.grpo.kl_beta and cfg.policy.lora is None and mode != "sft":
        reference = math.ceil(shape.total_params * c / split)
    engine = 0
    if mode == "colocated":
        if resolve_backend(cfg.rollout.backend, log=False) == "vllm":  # "auto": as the engine would be built here
            if device_memory:
                engine = int(cfg.rollout.gpu_memory_utilization * device_memory)
            else:
                notes.append("vLLM's gpu_memory_utilization share is not counted: device memory unknown")
        else:
            kv = cfg.rollout.batch_size * cfg.grpo.num_samples_per_prompt * cfg.policy.model_max_length
            engine = shape.total_params * c + kv * 2 * shape.layers * shape.kv_dim * c
    elif mode == "disaggregated":
        notes.append("disaggregated: the rollout engines run on their own GPUs (vLLM: gpu_memory_utilization of each)")

    resident = parameters + optimizer + reference + engine
    moments = (
        resident + gathered_forward + activations + head_forward,  # end of forward
        resident + gathered_forward + activations + head_backward,  # LM-head backward
        resident + gradients + root_reduce,  # end of backward: root gradient reduce-scatter
        resident + gradients + step,  # optimizer step
    )
    return MemoryEstimate(
        parameters=parameters, gradients=gradients, optimizer=optimizer,
        gathered=max(gathered_forward, root_reduce), activations=activations,
        logprob_head=head_backward, optimizer_step=step, reference=reference, rollout_engine=engine, host=host,
        total=max(moments), tokens=tokens, activation_bytes_per_token=per_token, notes=tuple(notes))
