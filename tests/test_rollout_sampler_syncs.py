"""The HF engine's sampler never makes the host wait for the GPU inside a decode step.

There is no GPU here, so the sampler runs on fake CUDA tensors (``FakeTensorMode``: shapes and
devices, no data) under a dispatch mode that records every op that would sync on a real GPU: a
value read on the host (``.item()``, ``bool(t)``: ``aten._local_scalar_dense``), an op whose output
size depends on values (``nonzero``), and any copy between devices (``.cpu()``, or a CPU-drawn random
number sent to the GPU: ``aten._to_copy`` / ``copy_`` across devices). The sampler before issue 28
did three per step (two ``.cpu()``, one host-to-device uniform)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from cosmos_primitives.rollout.token_sampler import InverseCDFSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench_rollout_hf import SyncEachStepSampler

aten = torch.ops.aten
VALUE_DEPENDENT = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default,
                   aten.unique_dim.default, aten._unique2.default}


class HostSyncCounter(TorchDispatchMode):
    """Records, in ``self.syncs``, the ops that would stall the host on a GPU."""

    def __init__(self) -> None:
        super().__init__()
        self.syncs: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in VALUE_DEPENDENT:
            self.syncs.append(str(func))
        elif func is aten._to_copy.default:
            src, dst = args[0].device, kwargs.get("device") or args[0].device
            if src != dst:
                self.syncs.append(f"_to_copy {src} -> {dst}")
        elif func is aten.copy_.default and args[0].device != args[1].device:
            self.syncs.append(f"copy_ {args[1].device} -> {args[0].device}")
        return func(*args, **kwargs)


def decode_steps_on_fake_cuda(sampler, steps: int = 3, rows: int = 4, vocab: int = 50) -> list[str]:
    """Run ``steps`` sampler calls on fake ``cuda`` logits ``[rows, vocab]``; the host syncs they made."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        input_ids = torch.zeros(rows, 1, dtype=torch.long, device="cuda")
        counter = HostSyncCounter()
        for _ in range(steps):
            scores = torch.randn(rows, vocab, device="cuda")
            with counter:
                out = sampler(input_ids, scores)
            assert out.shape == (rows, vocab) and out.device.type == "cuda"
        tokens, logprobs = sampler.token_logprobs()  # the one copy to the host, after generate
        assert tokens.shape == logprobs.shape == (rows, steps) and tokens.device.type == "cpu"
    return counter.syncs


@pytest.mark.parametrize("settings", [dict(temperature=1.0), dict(temperature=0.7, top_k=5, top_p=0.9),
                                      dict(temperature=0.0)], ids=["plain", "top_k_top_p", "greedy"])
def test_no_host_sync_in_a_decode_step(settings) -> None:
    assert decode_steps_on_fake_cuda(InverseCDFSampler(**settings)) == []


def test_the_counter_sees_the_syncs_of_the_old_sampler() -> None:
    """The old behaviour (kept in the benchmark as its ``today`` variant) is caught: per step two
    copies to the host and one CPU-drawn uniform sent to the device."""
    syncs = decode_steps_on_fake_cuda(SyncEachStepSampler(temperature=1.0, generator=torch.Generator().manual_seed(0)))
    assert len(syncs) == 3 * 3
    assert syncs[:3] == ["_to_copy cpu -> cuda:0", "_to_copy cuda:0 -> cpu", "_to_copy cuda:0 -> cpu"]


def test_a_generator_on_another_device_is_refused_by_name() -> None:
    sampler = InverseCDFSampler(temperature=1.0, generator=torch.Generator().manual_seed(0))
    with FakeTensorMode(allow_non_fake_inputs=True):
        scores = torch.randn(2, 10, device="cuda")
        with pytest.raises(ValueError, match=r"generator is on cpu but the logits are on cuda:0.*torch\.Generator"):
            sampler(torch.zeros(2, 1, dtype=torch.long, device="cuda"), scores)


def test_same_generator_seed_same_draws_on_the_logits_device() -> None:
    scores = torch.randn(64, 1000)

    def draw(seed: int) -> list[int]:
        sampler = InverseCDFSampler(temperature=1.0, generator=torch.Generator().manual_seed(seed))
        for _ in range(3):
            sampler(torch.zeros(64, 1, dtype=torch.long), scores)
        return sampler.token_logprobs()[0].flatten().tolist()

    assert draw(3) == draw(3)
    assert draw(3) != draw(4)


class VocabularyPasses(TorchDispatchMode):
    """Records, in ``self.passes``, the compute ops that read a whole ``[rows, vocab]`` tensor."""

    HEAVY = frozenset({aten.cumsum.default, aten._log_softmax.default, aten._softmax.default, aten.exp.default,
             aten.sort.default, aten.sort.stable, aten.argmax.default, aten.max.dim, aten.sum.dim_IntList})

    def __init__(self, full: int) -> None:
        super().__init__()
        self.full = full
        self.passes: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.HEAVY and isinstance(args[0], torch.Tensor) and args[0].numel() == self.full:
            self.passes.append(func.__name__)
        return func(*args, **(kwargs or {}))


def test_an_unfiltered_draw_makes_one_softmax_pass_and_no_cumulative_sum_over_the_vocabulary() -> None:
    """What sets the sampler's cost per decode step (``benchmarks/bench_token_sampler.py``): the full
    CDF over a 152k vocabulary was a log-softmax, its ``exp`` and a ``[B, V]`` cumulative sum; the
    block search reads the vocabulary once more only to sum it by blocks (a strided view, not
    counted here as a full-size pass)."""
    rows, vocab = 8, 5000
    scores = torch.randn(rows, vocab)
    counter = VocabularyPasses(rows * vocab)
    with counter:
        InverseCDFSampler(temperature=0.7)(torch.zeros(rows, 1, dtype=torch.long), scores)
    assert counter.passes == ["_softmax.default"]
    filtered = VocabularyPasses(rows * vocab)
    with filtered:  # top-p needs the sorted distribution: the sort stays, the full cumulative sum goes
        InverseCDFSampler(temperature=0.7, top_p=0.9)(torch.zeros(rows, 1, dtype=torch.long), scores)
    assert "sort.default" in filtered.passes or "sort.stable" in filtered.passes
    assert filtered.passes.count("cumsum.default") == 1  # the top-p mass over the sorted row, not the draw's
