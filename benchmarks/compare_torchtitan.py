"""Our hand-written parallel pieces against torchtitan 0.3.0 / torchao counterparts (docs/torchtitan.md).

Runs from a side virtual environment that has torchtitan and torchao (they are not dependencies of
this library and CI never installs them):

    python -m venv /work/venvs/titan
    /work/venvs/titan/bin/pip install torch==2.14.1 torchvision==0.29.1 torchtitan==0.3.0 torchao \\
        transformers==5.24.0 msgspec attrs redis
    PYTHONPATH=src /work/venvs/titan/bin/python benchmarks/compare_torchtitan.py

CPU only (2 gloo ranks for the distributed parts). Every figure is a ratio against our piece
measured in the same run, or an equality check; a counterpart that cannot run on the HF models we
train prints the exact error. Sections:

1. gradient norm: ``parallel.clip_grad_norm_`` vs ``torch.nn.utils.clip_grad_norm_`` vs torchtitan's
   ``distributed.utils.clip_grad_norm_`` on FSDP2 (DTensor) gradients over 2 ranks, L2 and inf, and
   with one parameter left out of FSDP (a plain tensor beside DTensors);
2. mesh: ``ParallelMesh`` vs ``ParallelDims`` on 2 ranks (the FSDP mesh each hands out, build time);
3. activation checkpointing: ours vs torchtitan's ``FullAC`` on a tiny HF Qwen2 (state-dict names,
   gradients, forward + backward time);
4. compile: ours vs torchtitan's ``apply_compile`` (``eager`` backend: graph capture only);
5. float8 / MX through torchao on the same model (CPU: emulated float8 only);
6. MFU accounting: ``bench_sft_mfu.py``'s FLOP count vs torchtitan's dense-model formula on the
   Qwen2.5-1.5B shape with the benchmark's packed rows.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))


def median_ms(fn: Callable[[], object], repeats: int = 20, warmup: int = 3) -> float:
    """Median wall time of ``fn()`` in milliseconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def error_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def tiny_qwen2():
    """A 2-layer Qwen2 with every linear dimension a multiple of 16 (float8's requirement)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=False, use_cache=False, attn_implementation="sdpa")
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config)


# ---------------------------------------------------------------- 1 + 2: two gloo ranks


def _distributed_worker(rank: int, port: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    lines: list[str] = []
    try:
        lines += _grad_norm_section()
        lines += _mesh_section()
    except Exception:
        lines.append(traceback.format_exc())
    finally:
        if rank == 0:
            queue.put(lines)
        dist.barrier()
        dist.destroy_process_group()


def _sharded_model(plain_last: bool):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)])
    units = list(model)[:-1] if plain_last else list(model)
    for unit in units:
        fully_shard(unit, mesh=mesh)
    torch.manual_seed(1 + dist.get_rank())
    model(torch.randn(32, 256)).square().mean().backward()
    if plain_last:
        # a layer outside FSDP keeps plain tensors (replicated by hand here, as a piece kept off the
        # mesh would be): its gradient is averaged so both ranks hold the same one
        for p in model[-1].parameters():
            dist.all_reduce(p.grad)
            p.grad /= 2
    return model


def _grad_norm_section() -> list[str]:
    from torchtitan.distributed.utils import clip_grad_norm_ as titan_clip

    from cosmos_primitives.parallel.grad_norm import clip_grad_norm_ as ours_clip

    def torch_clip(params, max_norm, norm_type):
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    candidates = {"ours": ours_clip, "torch.nn.utils": torch_clip,
                  "torchtitan": lambda params, m, n: titan_clip(params, m, n)}
    lines = ["## 1. gradient norm (FSDP2 over 2 gloo ranks, 8 x Linear(256, 256), float32)"]
    for plain_last in (False, True):
        model = _sharded_model(plain_last)
        params = list(model.parameters())
        saved = [p.grad.to_local().clone() if hasattr(p.grad, "to_local") else p.grad.clone() for p in params]

        def restore(params=params, saved=saved) -> None:
            for p, g in zip(params, saved, strict=True):
                (p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad).copy_(g)

        layout = "7 FSDP units + 1 plain Linear" if plain_last else "8 FSDP units"
        for norm_type in (2.0, float("inf")):
            # reference: every gradient gathered whole, one norm in float64
            full = [(p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).double() for p in params]
            reference = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, norm_type) for g in full]),
                                                 norm_type).item()
            results = {}
            for name, fn in candidates.items():
                restore()
                try:
                    norm = float(fn(params, 1e-3, norm_type))
                    clipped = torch.linalg.vector_norm(torch.stack([
                        torch.linalg.vector_norm((p.grad.full_tensor() if hasattr(p.grad, "full_tensor")
                                                  else p.grad).double(), norm_type) for p in params]), norm_type)
                    results[name] = (norm, float(clipped))
                except Exception as exc:  # a counterpart's failure is a finding, printed as is
                    results[name] = error_line(exc)
            restore()
            # interleaved rounds: the shared machine's load drifts, each round times every candidate
            runnable = [name for name, result in results.items() if not isinstance(result, str)]
            times: dict[str, list[float]] = {name: [] for name in runnable}
            for _ in range(40):
                for name in runnable:
                    dist.barrier()
                    start = time.perf_counter()
                    candidates[name](params, 1e9, norm_type)
                    times[name].append((time.perf_counter() - start) * 1e3)
            for name in runnable:
                results[name] += (statistics.median(times[name][5:]),)
            base = results["ours"]
            for name, result in results.items():
                if isinstance(result, str):
                    lines.append(f"{layout}, norm {norm_type}: {name}: FAILS: {result}")
                    continue
                norm, clipped, ms = result
                ratio = f"{ms / base[2]:.2f}x ours" if not isinstance(base, str) else "n/a"
                lines.append(f"{layout}, norm {norm_type}: {name}: norm {norm:.9g} (rel. err. vs float64 "
                             f"whole {abs(norm - reference) / reference:.1e}), after clip to 1e-3: "
                             f"{clipped:.3e}; {ms:.3f} ms ({ratio})")
    return lines


def _mesh_section() -> list[str]:
    import torchtitan.distributed.parallel_dims as titan_dims
    from torchtitan.distributed.parallel_dims import ParallelDims

    from cosmos_primitives.config.policy import ParallelismConfig
    from cosmos_primitives.parallel.mesh import ParallelMesh

    lines = ["## 2. mesh (2 gloo ranks)"]
    try:
        ParallelDims(dp_replicate=1, dp_shard=-1, cp=1, tp=1, pp=1, ep=1, world_size=2).build_mesh()
        lines.append("torchtitan ParallelDims.build_mesh() on a CPU-only machine: ran")
    except Exception as exc:
        lines.append(f"torchtitan ParallelDims.build_mesh() on a CPU-only machine: FAILS: {error_line(exc)}")
    # its device type is a module global fixed at import ("cuda" when no accelerator is found)
    titan_dims.device_type = "cpu"
    for sizes in ({"dp_shard": -1}, {"dp_replicate": 2, "dp_shard": 1}, {"dp_shard": 1, "tp": 2},
                  {"dp_shard": 1, "cp": 2}):
        ours_cfg = ParallelismConfig(**{f"{k}_size": v for k, v in sizes.items()})
        ours_ms = median_ms(lambda cfg=ours_cfg: ParallelMesh(cfg, device_type="cpu"), repeats=5, warmup=1)
        ours = ParallelMesh(ours_cfg, device_type="cpu")
        ours_fsdp = ours.fsdp_mesh
        dims = dict(dp_replicate=sizes.get("dp_replicate", 1), dp_shard=sizes.get("dp_shard", 1),
                    cp=sizes.get("cp", 1), tp=sizes.get("tp", 1), pp=1, ep=1, world_size=2)

        def build_titan(dims=dims):
            parallel_dims = ParallelDims(**dims)
            parallel_dims.build_mesh()
            return parallel_dims

        try:
            titan_ms = median_ms(build_titan, repeats=5, warmup=1)
            titan = build_titan()
            one_d = {name: m.size() for name, m in titan.get_all_one_dimensional_meshes().items()}
            describe = f"1-D meshes {one_d}"
            lines.append(f"{sizes}: ours fsdp_mesh {(ours_fsdp.mesh_dim_names, tuple(ours_fsdp.shape))}, build "
                         f"{ours_ms:.2f} ms | torchtitan {describe}, build {titan_ms:.2f} ms "
                         f"({titan_ms / ours_ms:.2f}x ours)")
        except Exception as exc:
            lines.append(f"{sizes}: torchtitan FAILS: {error_line(exc)}")
    try:
        ParallelDims(dp_replicate=1, dp_shard=3, cp=1, tp=1, pp=1, ep=1, world_size=2)
    except Exception as exc:
        lines.append(f"bad sizes, torchtitan: {error_line(exc)}")
    try:
        ParallelMesh(ParallelismConfig(dp_shard_size=3), device_type="cpu")
    except Exception as exc:
        lines.append(f"bad sizes, ours: {error_line(exc)}")
    return lines


# ---------------------------------------------------------------- 3-6: one process


def _fwd_bwd(model, ids) -> None:
    model(input_ids=ids, labels=ids).loss.backward()


def _grads(model) -> dict[str, torch.Tensor]:
    return {n.replace("._checkpoint_wrapped_module", ""): p.grad.clone() for n, p in model.named_parameters()}


def activation_checkpoint_section() -> list[str]:
    from torchtitan.distributed.activation_checkpoint import FullAC

    from cosmos_primitives.parallel.activation_checkpoint import apply_activation_checkpointing

    lines = ["## 3. activation checkpointing (tiny Qwen2, 2 layers, batch 4 x 128 tokens, float32)"]
    ids = torch.randint(0, 512, (4, 128), generator=torch.Generator().manual_seed(0))
    plain = tiny_qwen2()
    names = [n for n, _ in plain.named_parameters()]
    _fwd_bwd(plain, ids)
    reference = _grads(plain)
    plain_ms = median_ms(lambda: _fwd_bwd(plain, ids), repeats=5, warmup=1)
    ours = tiny_qwen2()
    apply_activation_checkpointing(ours)
    titan = tiny_qwen2()
    try:
        FullAC(FullAC.Config()).apply(titan)
        lines.append("torchtitan FullAC.apply(Qwen2ForCausalLM): ran (unexpected)")
    except Exception as exc:
        lines.append(f"torchtitan FullAC.apply(Qwen2ForCausalLM): FAILS: {error_line(exc)}")
    titan = tiny_qwen2()
    FullAC(FullAC.Config()).apply(titan.model)  # the decoder has `.layers`; the HF wrapper does not
    for label, model in (("ours", ours), ("torchtitan FullAC on .model", titan)):
        _fwd_bwd(model, ids)
        grads = _grads(model)
        max_diff = max((grads[n] - reference[n]).abs().max().item() for n in reference)
        renamed = sum(a != b for a, b in zip(names, (n for n, _ in model.named_parameters()), strict=True))
        ms = median_ms(lambda model=model: _fwd_bwd(model, ids), repeats=5, warmup=1)
        lines.append(f"{label}: grads max |diff| vs no checkpointing {max_diff:.1e}; parameter names changed "
                     f"{renamed} / {len(names)}; fwd+bwd {ms:.1f} ms ({ms / plain_ms:.2f}x no checkpointing)")
    keys = list(tiny_qwen2().state_dict())
    lines.append(f"state-dict keys changed: ours {len(set(keys) ^ set(ours.state_dict()))}, torchtitan "
                 f"{len(set(keys) ^ set(titan.state_dict()))} / {len(keys)} (its wrapper strips its prefix there)")
    return lines


def compile_section() -> list[str]:
    from torchtitan.config.configs import CompileConfig
    from torchtitan.distributed.compile import apply_compile as titan_compile
    from torchtitan.distributed.parallel_dims import ParallelDims

    from cosmos_primitives.parallel.compile import apply_compile

    lines = ["## 4. compile appliers (backend 'eager': graph capture only, tiny Qwen2, 4 x 128 tokens)"]
    ids = torch.randint(0, 512, (4, 128), generator=torch.Generator().manual_seed(0))
    dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, world_size=1)
    config = CompileConfig(enable=True, backend="eager")
    before = (torch._dynamo.config.capture_scalar_outputs,
              torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint)
    for label, apply in (("ours", lambda m: apply_compile(m, backend="eager").summary()),
                         ("torchtitan on Qwen2ForCausalLM",
                          lambda m: titan_compile(m, compile_config=config, parallel_dims=dims)),
                         ("torchtitan on .model",
                          lambda m: titan_compile(m.model, compile_config=config, parallel_dims=dims))):
        torch._dynamo.reset()
        model = tiny_qwen2()
        try:
            summary = apply(model)
            start = time.perf_counter()
            _fwd_bwd(model, ids)
            first = time.perf_counter() - start
            ms = median_ms(lambda model=model: _fwd_bwd(model, ids), repeats=5, warmup=1)
            lines.append(f"{label}: {summary or 'applied'}; first fwd+bwd {first:.2f} s, then {ms:.1f} ms")
        except Exception as exc:
            lines.append(f"{label}: FAILS: {error_line(exc)}")
    after = (torch._dynamo.config.capture_scalar_outputs,
             torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint)
    lines.append(f"process-wide dynamo flags (capture_scalar_outputs, skip_fwd_side_effects_in_bwd_under_checkpoint):"
                 f" {before} before, {after} after torchtitan's applier")
    return lines


def low_precision_section() -> list[str]:
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    lines = ["## 5. float8 / MX training through torchao (tiny Qwen2 on the CPU)"]
    ids = torch.randint(0, 512, (4, 128), generator=torch.Generator().manual_seed(0))
    base = tiny_qwen2()
    base_loss = base(input_ids=ids, labels=ids).loss.item()
    base_ms = median_ms(lambda: _fwd_bwd(base, ids), repeats=5, warmup=1)
    for label, config in (("float8 tensorwise (hardware)", Float8LinearConfig()),
                          ("float8 emulated", Float8LinearConfig(emulate=True))):
        model = tiny_qwen2()
        try:
            # the LM head stays high precision, as torchtitan's filter does
            convert_to_float8_training(model, config=config, module_filter_fn=lambda m, fqn: fqn != "lm_head")
            converted = sum(type(m).__name__ == "Float8Linear" for m in model.modules())
            loss = model(input_ids=ids, labels=ids).loss.item()
            ms = median_ms(lambda model=model: _fwd_bwd(model, ids), repeats=5, warmup=1)
            lines.append(f"{label}: {converted} linears converted; loss {loss:.5f} vs float32 {base_loss:.5f} "
                         f"(rel. {abs(loss - base_loss) / base_loss:.1e}); fwd+bwd {ms:.1f} ms "
                         f"({ms / base_ms:.2f}x float32)")
        except Exception as exc:
            lines.append(f"{label}: FAILS: {error_line(exc)}")
    from torchao.prototype.moe_training.mxfp8_linear import MXFP8Linear
    from torchao.quantization.quantize_.common import KernelPreference

    for preference in (KernelPreference.AUTO, KernelPreference.EMULATED):
        label = f"MXFP8Linear ({preference.name})"
        model = tiny_qwen2()
        for module in list(model.model.modules()):
            for child_name, child in list(module.named_children()):
                if type(child) is torch.nn.Linear:
                    mx = MXFP8Linear(child.in_features, child.out_features, bias=child.bias is not None,
                                     kernel_preference=preference)
                    mx.load_state_dict(child.state_dict())
                    setattr(module, child_name, mx)
        try:
            loss = model(input_ids=ids, labels=ids).loss.item()
            ms = median_ms(lambda model=model: _fwd_bwd(model, ids), repeats=5, warmup=1)
            lines.append(f"{label}: loss {loss:.5f} vs float32 {base_loss:.5f} "
                         f"(rel. {abs(loss - base_loss) / base_loss:.1e}); fwd+bwd {ms:.1f} ms "
                         f"({ms / base_ms:.2f}x float32)")
        except Exception as exc:
            lines.append(f"{label}: FAILS: {error_line(exc)}")
    return lines


def mfu_section() -> list[str]:
    from torchtitan.models.utils import get_dense_model_nparams_and_flops
    from torchtitan.tools.utils import get_peak_flops
    from transformers import Qwen2ForCausalLM

    from bench_sft_mfu import PEAK_TFLOPS, packed_row, qwen2_1_5b_config

    lines = ["## 6. MFU accounting (Qwen2.5-1.5B shape, the benchmark's 2 packed rows of 4,096)"]
    config = qwen2_1_5b_config()
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    generator = torch.Generator().manual_seed(1000)
    rows = [packed_row(4096, config.vocab_size, generator) for _ in range(2)]
    tokens = sum(ids.numel() for ids, _, _ in rows)
    heads, head_dim = config.num_attention_heads, config.hidden_size // config.num_attention_heads
    n_params = sum(p.numel() for p in model.parameters())
    ours = 6.0 * n_params * tokens + 6.0 * config.num_hidden_layers * heads * head_dim * sum(
        n * n for _, _, lengths in rows for n in lengths)
    # torchtitan's formula looks for nn.Embedding among the direct children; the HF wrapper keeps it
    # one level down, and with tied weights nothing is subtracted anyway
    _, per_token = get_dense_model_nparams_and_flops(model, n_layers=config.num_hidden_layers, n_heads=heads,
                                                     head_dims=2 * head_dim, seq_len=4096,
                                                     enable_weight_tying=config.tie_word_embeddings)
    titan = per_token * tokens
    one_sample = 6.0 * n_params * 4096 + 6.0 * config.num_hidden_layers * heads * head_dim * 4096**2
    lines.append(f"params {n_params:,}; samples per row {[len(r[2]) for r in rows]}")
    lines.append(f"FLOPs of the 2 rows: ours {ours:.4e}, torchtitan {titan:.4e} ({titan / ours:.3f}x ours): "
                 "torchtitan counts full-row, non-causal attention")
    lines.append(f"one unpacked 4,096-token sample: torchtitan / ours = {per_token * 4096 / one_sample:.3f}")
    for name in ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA B200"):
        ours_peak = next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
        lines.append(f"peak {name}: ours {ours_peak} TFLOP/s, torchtitan {get_peak_flops(name) / 1e12:g} TFLOP/s")
    return lines


def main() -> int:
    import importlib.metadata as metadata

    import torch.multiprocessing as mp

    print(f"torch {torch.__version__}, torchtitan {metadata.version('torchtitan')}, torchao "
          f"{metadata.version('torchao')}, transformers {metadata.version('transformers')}, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    torch.set_num_threads(1)
    from cosmos_primitives.parallel.distributed import free_port

    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    mp.start_processes(_distributed_worker, args=(free_port(), queue), nprocs=2, start_method="spawn")
    print("\n".join(queue.get()))
    for section in (activation_checkpoint_section, compile_section, low_precision_section, mfu_section):
        try:
            print("\n".join(section()))
        except Exception:
            print(f"{section.__name__} crashed:\n{traceback.format_exc()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
