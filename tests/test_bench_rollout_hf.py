"""benchmarks/bench_rollout_hf.py at tiny shapes on the CPU: every variant reports full rows and a
throughput, the weight-update and image checks pass, so the GPU pack's rollout part cannot rot."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from cosmos_primitives import testing as cpt

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench_rollout_hf import VARIANTS, check_weight_update, make_engine, run_rollout_bench


@pytest.fixture
def one_thread():
    """Tiny matmuls: one thread beats several fighting over a busy CPU (10x on a shared 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
def test_every_variant_and_both_checks_on_tiny_models(qwen_tokenizer, tiny_vl_processor) -> None:
    report = run_rollout_bench(cpt.tiny_qwen2(seed=0), qwen_tokenizer, device="cpu", rows=4, new_tokens=4,
                               vl_model=cpt.tiny_qwen2_5_vl(seed=0), vl_processor=tiny_vl_processor)
    for variant in VARIANTS:
        r = report[variant]
        assert r["every_row_full"] and r["tokens"] == 4 * 4 and r["tokens_per_s"] > 0, r
    assert report["static_compile"]["static_cache_shape"] == (4, 256)
    assert set(report["speedup_vs_today"]) == {"sync_free", "static_compile"}
    assert report["weight_update"]["ok"] and report["weight_update"]["parameter"] == "model.norm.weight"
    assert report["vl"]["ok"]


@pytest.mark.usefixtures("one_thread")
def test_weight_check_fails_when_the_engine_misses_the_update(qwen_tokenizer, monkeypatch) -> None:
    """The check can fail: an engine whose update_weights does nothing shows no change."""
    engine = make_engine(cpt.tiny_qwen2(seed=0), qwen_tokenizer, "static_compile", rows=4)
    monkeypatch.setattr(engine, "update_weights", lambda named, version: None)
    result = check_weight_update(engine, new_tokens=3)
    assert not result["ok"] and result["changed_by"] == 0.0
    assert torch.equal(engine.model.model.norm.weight, cpt.tiny_qwen2(seed=0).model.norm.weight)  # restored
