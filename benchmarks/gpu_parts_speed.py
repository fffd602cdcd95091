"""The speed parts of the GPU validation pack (issue 28): what the machine offers, attention for
packed rows, the log-prob heads, SFT ablations, the world-model step's memory and rollout tokens/s.

Each part takes ``dry`` (tiny shapes on the CPU, for CI's dry run) and its work folder and returns
``{"figures": {...}, "notes": [...]}`` as the parts of ``gpu_suite_parts.py`` do; a part that
measures several things saves its figures so far after each (:func:`save_partial`), so a time box
or a crash keeps what was measured.
"""

from __future__ import annotations

import gc
import importlib
import inspect
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_sft_mfu import matmul_tflops, measure_sft, qwen2_1_5b_config, spec_peak_tflops, synchronize  # noqa: E402

Result = dict[str, Any]
PARTIAL = "partial.json"


def device() -> torch.device:
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def save_partial(work: Path, result: Result) -> None:
    """Write ``result`` to ``work/partial.json`` (read by ``gpu_suite.run_part`` if the part stops early)."""
    (work / PARTIAL).write_text(json.dumps(result, indent=1, default=str))


def _version(name: str) -> str | None:
    try:
        return importlib.import_module(name).__version__
    except Exception:
        return None


def probes(dry: bool, work: Path) -> Result:
    """What the machine offers: versions, the varlen / flash / fused-optimizer / compile APIs that
    exist, and whether each works on a small case (so the later parts' choices can be read)."""
    dev = device()
    figures: dict[str, Any] = {name: _version(name) for name in
                               ("torch", "transformers", "triton", "diffusers", "peft", "liger_kernel", "flash_attn")}
    figures["cuda"] = torch.version.cuda
    figures["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    if dev.type == "cuda":
        figures["gpu"] = torch.cuda.get_device_name(dev)
        figures["capability"] = ".".join(map(str, torch.cuda.get_device_capability(dev)))
        figures["flash_sdp_enabled"] = torch.backends.cuda.flash_sdp_enabled()
    notes = []
    try:
        from torch.nn.attention import varlen

        figures["varlen_attn_signature"] = str(inspect.signature(varlen.varlen_attn))
    except Exception as exc:
        figures["varlen_attn_signature"] = None
        notes.append(f"torch.nn.attention.varlen: {exc!r}")
    figures["aten_flash_attention_forward"] = hasattr(torch.ops.aten, "_flash_attention_forward")
    try:
        from torch.nn.attention.flex_attention import flex_attention  # noqa: F401

        figures["flex_attention"] = True
    except Exception:
        figures["flex_attention"] = False

    # fused AdamW: does a step run on this device, and does it match foreach?
    try:
        torch.manual_seed(0)
        ref = [torch.randn(64, 32, device=dev, requires_grad=True)]
        fused = [ref[0].detach().clone().requires_grad_(True)]
        for params, kwargs in ((ref, {"foreach": True}), (fused, {"fused": True})):
            opt = torch.optim.AdamW(params, lr=1e-2, **kwargs)
            params[0].grad = torch.ones_like(params[0])
            opt.step()
        figures["fused_adamw"] = True
        figures["fused_adamw_max_diff"] = float((ref[0] - fused[0]).abs().max())
    except Exception as exc:
        figures["fused_adamw"] = False
        notes.append(f"fused AdamW: {exc!r}")

    # torch.compile on a small function: does inductor work here, how long does a compile take?
    try:
        start = time.perf_counter()
        fn = torch.compile(lambda x: torch.nn.functional.silu(x) * x + 1.0, fullgraph=True)
        x = torch.randn(256, 256, device=dev)
        torch.testing.assert_close(fn(x), torch.nn.functional.silu(x) * x + 1.0)
        figures["compile_ok"] = True
        figures["compile_first_call_s"] = time.perf_counter() - start
    except Exception as exc:
        figures["compile_ok"] = False
        notes.append(f"torch.compile: {exc!r}"[:400])
    if dev.type == "cuda":
        figures["matmul_bf16_tflops"] = matmul_tflops(dev)
        n = 1 << 28
        a = torch.empty(n, dtype=torch.uint8, device=dev)
        b = torch.empty_like(a)
        b.copy_(a)
        synchronize(dev)
        start = time.perf_counter()
        for _ in range(10):
            b.copy_(a)
        synchronize(dev)
        figures["copy_gb_per_s"] = 2 * n * 10 / (time.perf_counter() - start) / 1e9
    return {"figures": figures, "notes": notes}


def attention(dry: bool, work: Path) -> Result:
    """Attention for packed rows at the SFT benchmark's shape (2 rows x 4,096 tokens, 12 heads / 2 KV
    heads of 128): transformers' SDPA with the dense packed mask (before), the library's varlen path,
    and causal SDPA over whole rows (an upper bound that ignores sample boundaries); forward +
    backward time and the profiler's top kernels of each."""
    from bench_attention import attention_variants

    out = attention_variants(device=device(), print_table=False)  # off CUDA it shrinks to a dry run
    figures = {k: out.get(k) for k in ("varlen_kernel", "available_kernels", "shape")}
    for name, variant in out["variants"].items():
        figures.update({f"{name}_{k}": v for k, v in variant.items() if k != "top_kernels"})
    return {"figures": figures, "notes": ["kernel names show which kernel ran"],
            "top_kernels": {name: v.get("top_kernels") for name, v in out["variants"].items()}}


HEAD_SHAPE = dict(tokens=8192, vocab=151936, hidden=1536)
DRY_HEAD_SHAPE = dict(tokens=256, vocab=2048, hidden=64)
HEAD_RUNS = [("naive", 1024), ("fused", 1024), ("grpo_fused", 1024), ("chunked", 1024), ("grpo_chunked", 1024),
             ("fused", 2048), ("grpo_fused", 2048), ("fused_eager", 1024), ("grpo_fused_eager", 1024),
             ("chunked_eager", 1024), ("fused_eager32768", 1024)]
"""(``bench_logprobs`` variant, chunk rows) timed by :func:`heads`: the library's defaults (a plain name:
compiled epilogue on CUDA) first, then other chunk sizes and the eager epilogues."""


def heads(dry: bool, work: Path) -> Result:
    """The log-prob heads of :data:`HEAD_RUNS` against the naive head (full float32 logits): forward
    + backward of ``sum(logprobs * g)`` at Qwen's vocabulary, bf16 on the GPU: time (median of 5)
    and peak memory above the inputs."""
    from bench_logprobs import LIBRARY_DEFAULTS, variant_loss

    dev = device()
    shape = DRY_HEAD_SHAPE if dry else HEAD_SHAPE
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    torch.manual_seed(0)
    hidden = (torch.randn(1, shape["tokens"], shape["hidden"], device=dev) * 0.5).to(dtype).requires_grad_(True)
    weight = (torch.randn(shape["vocab"], shape["hidden"], device=dev) * 0.05).to(dtype).requires_grad_(True)
    ids = torch.randint(0, shape["vocab"], (1, shape["tokens"]), device=dev)
    g = torch.rand(1, shape["tokens"], device=dev)

    def run(variant: str, chunk: int) -> None:
        variant_loss(variant, hidden, weight, ids, g, 64 if dry else chunk).backward()
        hidden.grad = weight.grad = None

    figures: dict[str, Any] = {**shape, "dtype": str(dtype), "defaults": LIBRARY_DEFAULTS}
    result = {"figures": figures, "notes": ["targets: time <= 1.0x naive, memory <= 1/10 of naive (bf16, GPU)"]}
    for variant, chunk in HEAD_RUNS:
        key = variant if chunk == 1024 else f"{variant}_c{chunk}"
        try:
            start = time.perf_counter()
            run(variant, chunk)  # warm-up: kernels, allocator, compiled epilogues
            synchronize(dev)
            figures[f"{key}_first_call_s"] = time.perf_counter() - start
            base = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else 0
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats(dev)
            times = []
            for _ in range(1 if dry else 5):
                synchronize(dev)
                start = time.perf_counter()
                run(variant, chunk)
                synchronize(dev)
                times.append(time.perf_counter() - start)
            figures[f"{key}_ms"] = sorted(times)[len(times) // 2] * 1e3
            figures[f"{key}_peak_mib"] = ((torch.cuda.max_memory_allocated(dev) - base) / 2**20
                                          if dev.type == "cuda" else None)
            if "naive_ms" in figures and key != "naive":
                figures[f"{key}_time_ratio"] = figures[f"{key}_ms"] / figures["naive_ms"]
                if figures.get("naive_peak_mib"):
                    figures[f"{key}_memory_ratio"] = figures[f"{key}_peak_mib"] / figures["naive_peak_mib"]
        except Exception as exc:
            result["notes"].append(f"{key}: {exc!r}"[:500])
        save_partial(work, result)
    return result


def _sdpa_baseline(policy: torch.nn.Module) -> None:
    """Put back transformers' SDPA (the dense packed mask) on a policy built with the varlen path."""
    policy.hf_model.config.get_text_config()._attn_implementation = "sdpa"


SFT_ABLATIONS: list[tuple[str, dict[str, Any], dict[str, Any], bool, int]] = [
    # (name, [policy] options, [train] options, varlen attention, micro-batches per optimizer step);
    # each row adds one fix to the last
    ("baseline", {}, {"optm_impl": "foreach", "fsdp_reshard_after_forward": "always", "compile": False}, False, 1),
    ("fused_adamw", {}, {"optm_impl": "fused", "fsdp_reshard_after_forward": "always", "compile": False}, False, 1),
    ("varlen", {}, {"optm_impl": "fused", "fsdp_reshard_after_forward": "always", "compile": False}, True, 1),
    ("reshard", {}, {"optm_impl": "fused", "fsdp_reshard_after_forward": "default", "compile": False}, True, 1),
    ("compile", {}, {"optm_impl": "fused", "fsdp_reshard_after_forward": "default", "compile": True}, True, 1),
    ("compile_accum4", {}, {"optm_impl": "fused", "fsdp_reshard_after_forward": "default", "compile": True}, True,
     4),
    ("baseline_again", {}, {"optm_impl": "foreach", "fsdp_reshard_after_forward": "always", "compile": False},
     False, 1),
]
"""The SFT ablations, in order; the baseline is today's behaviour (before issue 28) and is run again
last, so its spread shows the noise."""


def sft_ablations(dry: bool, work: Path, rows: tuple[str, ...] | None = None) -> Result:
    """SFT of the Qwen2.5-1.5B shape in bf16 (2 packed rows of 4,096 tokens, FSDP2 on one GPU, fused
    log-prob head), once per row of :data:`SFT_ABLATIONS` (or of its ``rows``): tokens/s, MFU, peak
    memory, first loss and the profiler's top kernels of one step."""
    from transformers import Qwen2Config

    dev = device()
    if dry:
        config = Qwen2Config(vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, use_cache=False)
        shape = dict(seq_len=256, rows=1, steps=2, warmup_steps=1, chunk_size=128)
        matmul = matmul_tflops(dev, n=256, iters=3)
    else:
        config = qwen2_1_5b_config()
        shape = dict(seq_len=4096, rows=2, steps=7, warmup_steps=2, chunk_size=1024)
        matmul = matmul_tflops(dev)
    config._attn_implementation = "sdpa"
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    peak = spec_peak_tflops(name)
    figures: dict[str, Any] = {"spec_peak_tflops": peak, "matmul_bf16_tflops": matmul, **shape}
    result: Result = {"figures": figures, "notes": ["target MFU >= 40 % of the spec peak (moonshot 50 %)"],
                      "top_kernels": {}}
    if dev.type != "cuda":
        result["notes"].append("[train] compile applies on CUDA only: the compile rows run eager here")
    for label, policy_options, train_options, varlen, micro_batches in SFT_ABLATIONS:
        if rows is not None and label not in rows:
            continue
        start = time.perf_counter()
        try:
            r = measure_sft(config, dtype="bfloat16", log=False, policy_options=policy_options,
                            train_options=train_options, profile=True, micro_batches=micro_batches,
                            after_build=None if varlen else _sdpa_baseline, **shape)
        except Exception:
            result["notes"].append(f"{label}: {traceback.format_exc()[-800:]}")
            save_partial(work, result)
            continue
        finally:
            gc.collect()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        achieved = r["achieved_tflops_per_device"]
        figures["model_params_b"] = r["params"] / 1e9
        figures[f"{label}_tokens_per_s"] = r["tokens_per_s_per_device"]
        figures[f"{label}_mfu"] = achieved / peak if peak else None
        figures[f"{label}_vs_matmul"] = achieved / matmul
        figures[f"{label}_peak_gib"] = r["peak_memory_gib"] if dev.type == "cuda" else None
        figures[f"{label}_first_loss"] = r["first_loss"]
        figures[f"{label}_wall_s"] = time.perf_counter() - start
        result["top_kernels"][label] = r["top_kernels"]
        save_partial(work, result)
    return result


def sft_recheck(dry: bool, work: Path) -> Result:
    """The SFT ablations that a change after the first run could move (the baseline again for the
    ratio): :func:`sft_ablations` on its rows ``baseline``, ``reshard``, ``compile``, ``compile_accum4``."""
    return sft_ablations(dry, work, rows=("baseline", "reshard", "compile", "compile_accum4"))


def rollout(dry: bool, work: Path) -> Result:
    """HF rollout engine tokens/s at 64 rows x 256 new tokens on the Qwen2.5-1.5B shape (bf16):
    today's engine (a sampler syncing at every step), the sync-free sampler, static cache + compiled
    decode; then a weight update seen under CUDA graphs and one image prompt compiled vs eager."""
    import bench_rollout_hf as bench
    from cosmos_primitives import testing as cpt

    dev = device()
    compile_config = None
    if dry:
        from transformers import CompileConfig

        model, rows, new_tokens = cpt.tiny_qwen2(seed=0).eval(), 4, 8
        compile_config = CompileConfig(backend="eager", mode=None, dynamic=False)
    else:
        model, rows, new_tokens = bench.qwen2_1_5b_model(dev), 64, 256
    tokenizer = cpt.qwen_tokenizer()
    figures: dict[str, Any] = {"rows": rows, "new_tokens": new_tokens}
    result: Result = {"figures": figures, "notes": ["target: >= 3x today's tokens/s (moonshot 5x)"], "details": {}}
    for variant in bench.VARIANTS:
        try:
            engine = bench.make_engine(model, tokenizer, variant, rows, compile_config)
            r = bench.rollout_tokens_per_s(model, tokenizer, rows=rows, new_tokens=new_tokens, variant=variant,
                                           device=dev, engine=engine)
            result["details"][variant] = r
            figures[f"{variant}_tokens_per_s"] = r["tokens_per_s"]
            figures[f"{variant}_warmup_s"] = r["warmup_s"]
            if variant == "static_compile":
                figures["static_graph_breaks"] = r.get("graph_breaks")
                figures["static_cudagraph_skips"] = r.get("cudagraph_skips")
                check = bench.check_weight_update(engine, new_tokens=min(32, new_tokens))
                result["details"]["weight_update"] = check
                figures["weight_update_seen"] = check["ok"]
            del engine
        except Exception:
            result["notes"].append(f"{variant}: {traceback.format_exc()[-800:]}")
        if "today_tokens_per_s" in figures and f"{variant}_tokens_per_s" in figures and variant != "today":
            figures[f"{variant}_speedup"] = figures[f"{variant}_tokens_per_s"] / figures["today_tokens_per_s"]
        save_partial(work, result)
    del model
    gc.collect()
    try:
        vl = cpt.tiny_qwen2_5_vl(seed=0).eval().to(dev)
        check = bench.check_vl_compiled_vs_eager(vl, cpt.tiny_qwen2_5_vl_processor(), device=dev,
                                                 compile_config=compile_config)
        result["details"]["vl"] = check
        figures["vl_compiled_equals_eager"] = check["ok"]
    except Exception:
        result["notes"].append(f"vl: {traceback.format_exc()[-800:]}")
    return result


def flowgrpo_memory(dry: bool, work: Path) -> Result:
    """One FlowGRPO step of the Cosmos-Predict2.5-2B-shaped transformer at the recipe's latent size
    (16 x 24 x 54 x 96, 31,104 tokens a sample; FSDP2 on one GPU, bf16 compute, LoRA r32), sharing one
    rollout, trained with and without activation checkpointing (micro-batch 1): seconds, peak memory
    (an out-of-memory is a figure, not a failure) and the memory plan's figure for the same moment."""
    from bench_wfm_memory import flowgrpo_memory_2b

    result = flowgrpo_memory_2b(dry, work)
    result.setdefault("notes", []).append("target: the recipe's step within 70 GiB of one GPU")
    return result
