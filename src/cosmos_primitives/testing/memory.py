"""Peak memory of a training step, on the CPU (host memory) or on one CUDA device: what
``benchmarks/bench_memory.py`` reports and what the memory plan (``cosmos_primitives.plan``) is
checked against.

On a CUDA device (:func:`measure_training_peak_cuda`) the measure is torch's allocator
(``max_memory_allocated``): exact tensor bytes, without the allocator's cache. On the CPU
(:func:`measure_training_peak`) it is as follows.

The measure is the process's **peak resident set size** (Linux ``VmHWM``) over the training steps,
minus its resident size just before the model is built. To make it track live tensor bytes:

- glibc serves every allocation of 64 KiB and more with its own ``mmap`` (``mallopt``
  ``M_MMAP_THRESHOLD``, which also stops glibc raising the threshold after frees), so freed
  tensors leave the resident set at once instead of staying in the heap;
- a warm-up step on a one-layer copy of the model (same options) runs first, so the libraries and
  kernels that load lazily are resident before the baseline is taken;
- the peak counter is reset (``/proc/self/clear_refs``) after the model is built and sharded, so
  the full copy every rank builds before ``fully_shard`` keeps only its shard does not count.

torch's CPU allocator has no cache, so on the CPU the resident set is what tensors hold plus a few
MiB of interpreter noise. Linux only.

Without running anything, :class:`TensorMemoryTracker` counts the bytes of the tensors ops create
(meta or fake tensors included), so the peak memory of a GPU-sized computation can be checked on a
CPU in seconds.
"""

from __future__ import annotations

import ctypes
import gc
from pathlib import Path
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from cosmos_primitives.algo.sft_objective import sft_loss
from cosmos_primitives.config.policy import PolicyConfig
from cosmos_primitives.config.train import TrainConfig
from cosmos_primitives.parallel.grad_norm import clip_grad_norm_
from cosmos_primitives.parallel.mesh import ParallelMesh
from cosmos_primitives.policy.build import build_policy
from cosmos_primitives.policy.lm_policy import token_logprobs
from cosmos_primitives.policy.optim import build_optimizer

M_MMAP_THRESHOLD = -3  # glibc mallopt parameter


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field} (the memory measure needs Linux)")


def rss_bytes() -> int:
    """Resident set size of this process now."""
    return _status_kib("VmRSS") << 10


def peak_rss_bytes() -> int:
    """Peak resident set size since the process started or since :func:`reset_peak_rss`."""
    return _status_kib("VmHWM") << 10


def reset_peak_rss() -> None:
    """Set the peak resident set size back to the current one (Linux >= 4.0)."""
    Path("/proc/self/clear_refs").write_text("5")


def release_freed_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS."""
    gc.collect()
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc_trim(0)


def map_large_allocations() -> None:
    """Serve allocations of >= 64 KiB with mmap from now on, so frees shrink the resident set."""
    ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 64 << 10)


class TensorMemoryTracker(TorchDispatchMode):
    """Peak bytes of the tensors created while active, op by op (a ``TorchDispatchMode``).

    Every op's outputs whose storage is new (not one of its inputs', so views, in-place and
    ``out=`` ops add nothing) are live until the storage is freed; tensors that existed before
    the ``with`` block do not count. Works on ``meta`` and fake tensors, so the peak of a GPU-sized
    forward / backward can be found on a CPU without computing it. Only allocations made by
    dispatched ops count (not, e.g., a kernel's internal workspace).

    Attributes:
        peak: the most bytes live at once (after an op's outputs were counted).
        live: bytes live now.
        allocations: ``(dtype, shape)`` of every new output, in order.
    """

    def __init__(self) -> None:
        super().__init__()
        self.peak = 0
        self.allocations: list[tuple[torch.dtype, tuple[int, ...]]] = []
        self._storages: dict[int, tuple[StorageWeakRef, int]] = {}

    @property
    def live(self) -> int:
        self._storages = {k: v for k, v in self._storages.items() if not v[0].expired()}
        return sum(nbytes for _, nbytes in self._storages.values())

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.live  # noqa: B018 (forget freed storages first: a new one may reuse a freed one's address)
        inputs = {t.untyped_storage()._cdata for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            if storage._cdata in inputs or storage._cdata in self._storages:
                continue
            self._storages[storage._cdata] = (StorageWeakRef(storage), storage.nbytes())
            self.allocations.append((t.dtype, tuple(t.shape)))
        self.peak = max(self.peak, self.live)
        return out


def random_qwen2(config: dict[str, Any], seed: int = 0) -> torch.nn.Module:
    """A randomly initialised float32 ``Qwen2ForCausalLM`` from ``config.json`` fields."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(**config)).float()


def _train_steps(policy: torch.nn.Module, train: TrainConfig, mesh: ParallelMesh, tokens: int, steps: int,
                 vocab: int, device: torch.device | None = None) -> None:
    optimizer = build_optimizer(policy, train)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        ids = torch.randint(0, vocab, (1, tokens), generator=g).to(device or "cpu")
        out = token_logprobs(policy, {"input_ids": ids, "labels": ids})
        loss, _ = sft_loss(out.logprobs, ids, group=mesh.group("dp"))
        loss.backward()
        clip_grad_norm_(policy.parameters(), train.optm_grad_norm_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def measure_training_peak(model_config: dict[str, Any], policy_cfg: PolicyConfig, train: TrainConfig,
                          tokens: int, steps: int = 2) -> dict[str, int]:
    """Peak memory of ``steps`` SFT steps of one packed row of ``tokens`` random tokens (call on
    every rank of a gloo group, e.g. through :func:`cosmos_primitives.testing.run_distributed`).

    Args:
        model_config: Qwen2 ``config.json`` fields (random weights from it).
        policy_cfg: ``[policy]`` (dtype, ``model_gradient_checkpointing``, ``parallelism``).
        train: ``[train]`` (``fsdp_offload``, ``master_dtype``; AdamW settings).

    Returns:
        Bytes: ``peak`` (peak resident set over the steps above the baseline), ``model`` (resident
        after building and sharding, above the baseline) and ``baseline``.
    """
    map_large_allocations()
    mesh = ParallelMesh(policy_cfg.parallelism, device_type="cpu")
    warm = build_policy(policy_cfg, mesh, train=train,
                        hf_model=random_qwen2({**model_config, "num_hidden_layers": 1}))
    _train_steps(warm, train, mesh, min(tokens, 16), 1, model_config["vocab_size"])
    del warm
    release_freed_memory()
    baseline = rss_bytes()
    policy = build_policy(policy_cfg, mesh, train=train, hf_model=random_qwen2(model_config))
    release_freed_memory()
    model = rss_bytes() - baseline
    reset_peak_rss()
    _train_steps(policy, train, mesh, tokens, steps, model_config["vocab_size"])
    return {"peak": peak_rss_bytes() - baseline, "model": model, "baseline": baseline}


def measure_training_peak_cuda(model_config: dict[str, Any], policy_cfg: PolicyConfig, train: TrainConfig,
                               tokens: int, steps: int = 2) -> dict[str, int]:
    """Peak CUDA memory of ``steps`` SFT steps of one packed row of ``tokens`` random tokens, on
    this process's GPU (call on every rank of an initialised group, or in a plain process: a
    one-rank group is made). Call it once per process: the allocator's state of an earlier model
    would count.

    The float32 model is built on the host and ``build_policy`` moves (or, with
    ``fsdp_offload``, keeps) its shards; the peak counter is reset once it is placed.

    Returns:
        Bytes: ``peak`` (``max_memory_allocated`` over the steps above the baseline), ``model``
        (allocated after building and sharding, above the baseline), ``baseline`` and
        ``reserved`` (the allocator's peak reservation, cache included).
    """
    from cosmos_primitives.parallel.distributed import init_distributed

    info = init_distributed()
    mesh = ParallelMesh(policy_cfg.parallelism, device_type="cuda")
    baseline = torch.cuda.memory_allocated(info.device)
    policy = build_policy(policy_cfg, mesh, train=train, hf_model=random_qwen2(model_config))
    gc.collect()
    model = torch.cuda.memory_allocated(info.device) - baseline
    torch.cuda.reset_peak_memory_stats(info.device)
    _train_steps(policy, train, mesh, tokens, steps, model_config["vocab_size"], device=info.device)
    torch.cuda.synchronize(info.device)
    return {"peak": torch.cuda.max_memory_allocated(info.device) - baseline, "model": model,
            "baseline": baseline, "reserved": torch.cuda.max_memory_reserved(info.device)}
