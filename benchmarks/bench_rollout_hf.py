"""HF rollout engine throughput: generated tokens/s of ``HFRolloutEngine`` in three ways (issue 28).

Variants, each on the same model, prompts and sampling (temperature 1, ``n = 8`` samples per
prompt, every row generating exactly ``new_tokens``: the stop token is one the model cannot emit):

- ``today``: the engine as it was before issue 28: dynamic KV cache, the sampler drawing its uniform
  on the CPU and copying the token and its log-prob to the host at every step
  (:class:`SyncEachStepSampler`, a copy of the old sampler, swapped in for this variant only);
- ``sync_free``: dynamic KV cache, the current sampler (nothing leaves the device until the end);
- ``static_compile``: ``HFRolloutEngine(static_cache=True)``: static KV cache, decode step compiled
  with ``mode="reduce-overhead"`` (inductor + CUDA graphs) on CUDA; on a CPU the same static cache
  without compile (or compiled by the given ``compile_config``, e.g. ``backend="eager"`` in the dry run);
- ``static_cudagraphs`` (optional): the static cache with torch's ``cudagraphs`` backend (CUDA
  graphs without inductor's kernels: a shorter compile).

Each variant runs one warm-up ``generate`` (timed apart as ``warmup_s``; for the static variants it
is full length, so that it compiles and records the very graph the timed call replays; for the
eager ones 16 tokens), then one timed ``generate``. Two checks go with it:

- :func:`check_weight_update`: under the compiled decode step, a weight update (``update_weights``,
  a copy into the existing storage) and a rebinding of the parameter to new storage (what an
  in-process sync sharing the trainer's tensors does) both show in the next rollout, equal to an
  eager run with the same weights. The final norm's weight is scaled, which changes every log-prob
  but no greedy token, so the comparison covers every position;
- :func:`check_vl_compiled_vs_eager`: one image prompt through a Qwen2.5-VL model, compiled static
  cache vs eager dynamic cache: the same greedy tokens.

    .venv/bin/python benchmarks/bench_rollout_hf.py --dry-run          # tiny models on the CPU, seconds
    .venv/bin/python benchmarks/bench_rollout_hf.py                    # Qwen2.5-1.5B shape on cuda:0
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import attrs
import torch
from transformers import LogitsProcessor

from cosmos_primitives.data.records import Prompt, RolloutGroup, SamplingParams
from cosmos_primitives.rollout import hf_engine
from cosmos_primitives.rollout.hf_engine import HFRolloutEngine

VARIANTS = ("today", "sync_free", "static_compile")
OPTIONAL_VARIANTS = ("static_cudagraphs",)


class SyncEachStepSampler(LogitsProcessor):
    """The engine's sampler before issue 28, kept to measure against: a CPU generator (reseeded from
    the generator it is given, whatever its device), the uniform sent to the logits' device, and
    ``.cpu()`` of the token and its log-prob at every step (three host syncs per step on a GPU)."""

    def __init__(self, temperature: float = 1.0, top_k: int = -1, top_p: float = 1.0,
                 generator: torch.Generator | None = None) -> None:
        self.temperature = temperature
        self.top_k = top_k
        self.top_p = top_p
        self.generator = torch.Generator()
        if generator is not None:
            self.generator.manual_seed(generator.initial_seed())
        self.steps: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        logits = scores.float()
        if self.temperature > 0:
            logits = logits / self.temperature
        logprobs = torch.log_softmax(logits, dim=-1)
        token = logprobs.argmax(dim=-1, keepdim=True) if self.temperature == 0 else self._sample(logprobs)
        self.steps.append((token.squeeze(-1).cpu(), logprobs.gather(-1, token).squeeze(-1).cpu()))
        return torch.full_like(scores, float("-inf")).scatter_(-1, token, 0.0)

    def _sample(self, logprobs: torch.Tensor) -> torch.Tensor:
        probs = logprobs.exp()
        if self.top_k > 0 and self.top_k < probs.shape[-1]:
            kth = probs.topk(self.top_k, dim=-1).values[:, -1:]
            probs = probs.masked_fill(probs < kth, 0.0)
        if self.top_p < 1.0:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            drop = sorted_probs.cumsum(-1) - sorted_probs >= self.top_p
            probs = probs.scatter(-1, order, sorted_probs.masked_fill(drop, 0.0))
        cdf = probs.cumsum(dim=-1)
        u = torch.rand(probs.shape[0], 1, generator=self.generator).to(cdf.device) * cdf[:, -1:]
        return torch.searchsorted(cdf, u).clamp_max(probs.shape[-1] - 1)

    def token_logprobs(self) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.steps:
            return torch.empty(0, 0, dtype=torch.long), torch.empty(0, 0)
        return torch.stack([t for t, _ in self.steps], 1), torch.stack([lp for _, lp in self.steps], 1)


# --- building blocks ---------------------------------------------------------------------------


def text_prompts(count: int) -> list[Prompt]:
    """``count`` chat prompts of different lengths (about 20 to 60 tokens), so rows are left-padded."""
    questions = [f"Question {i}: " + "why is the sky blue? " * (1 + i % 5) for i in range(count)]
    return [Prompt(conversation=[{"role": "user", "content": q}], prompt_id=f"q{i}") for i, q in enumerate(questions)]


def image_prompt() -> Prompt:
    from cosmos_primitives.testing import color_image

    conv = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is it?"}]}]
    return Prompt(conversation=conv, prompt_id="image", images=[color_image("red")])


def never_emitted_token(model: Any) -> int:
    """A token id past the vocabulary: as the stop token, every row generates ``max_response_length``
    (a random-weight model emits EOS at random)."""
    return model.config.get_text_config().vocab_size


def greedy_full_length(model: Any, new_tokens: int) -> SamplingParams:
    """Greedy, 2 samples per prompt, every row ``new_tokens`` long."""
    return SamplingParams(num_samples_per_prompt=2, temperature=0.0, max_response_length=new_tokens,
                          stop_token_ids=(never_emitted_token(model),))


def variant_compile_config(variant: str, compile_config: Any = None) -> Any:
    """The engine's ``compile_config`` for ``variant`` (None: the engine's default)."""
    if variant == "static_cudagraphs":
        from transformers import CompileConfig

        return CompileConfig(backend="cudagraphs", mode=None, dynamic=False)
    return compile_config if variant == "static_compile" else None


def make_engine(model: Any, processor: Any, variant: str, rows: int, compile_config: Any = None) -> HFRolloutEngine:
    """The engine of ``variant`` with ``rows`` sequences per ``generate`` call."""
    if variant not in VARIANTS + OPTIONAL_VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {VARIANTS + OPTIONAL_VARIANTS}")
    static = variant.startswith("static")
    return HFRolloutEngine(model, processor, max_batch_sequences=rows, static_cache=static,
                           compile_config=variant_compile_config(variant, compile_config) if static else None)


@contextlib.contextmanager
def sampler_of(variant: str) -> Iterator[None]:
    """Swap in the old sampler for ``today``; nothing for the others."""
    if variant == "today":
        with mock.patch.object(hf_engine, "InverseCDFSampler", SyncEachStepSampler):
            yield
    else:
        yield


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _compile_counters() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {"compiled_graphs": counters["stats"]["unique_graphs"],
            "graph_breaks": sum(counters["graph_break"].values()),
            "cudagraph_skips": counters["inductor"]["cudagraph_skips"]}


def compare_rollouts(a: Sequence[RolloutGroup], b: Sequence[RolloutGroup]) -> dict[str, float]:
    """``tokens_equal_rows``: fraction of rows with the same tokens; ``max_logprob_diff``: largest
    log-prob difference over each row's common prefix (positions before the first differing token)."""
    rows = equal = 0
    max_diff = 0.0
    for ga, gb in zip(a, b, strict=True):
        for ca, cb in zip(ga.completions, gb.completions, strict=True):
            rows += 1
            equal += ca.token_ids == cb.token_ids
            for ta, tb, la, lb in zip(ca.token_ids, cb.token_ids, ca.logprobs, cb.logprobs):
                if ta != tb:
                    break
                max_diff = max(max_diff, abs(la - lb))
    return {"tokens_equal_rows": equal / rows, "max_logprob_diff": max_diff}


# --- the measurements --------------------------------------------------------------------------


def rollout_tokens_per_s(model: Any, processor: Any, *, rows: int = 64, new_tokens: int = 256,
                         variant: str = "sync_free", device: str | torch.device = "cuda",
                         samples_per_prompt: int = 8, engine: HFRolloutEngine | None = None,
                         compile_config: Any = None) -> dict[str, Any]:
    """Generated tokens/s of one ``variant`` (see the module docstring) at ``rows`` sequences
    (``rows / samples_per_prompt`` prompts) x ``new_tokens`` new tokens each, after one warm-up call.

    ``model`` is moved to ``device``; ``engine``: reuse one made by :func:`make_engine` (a static
    engine keeps its compiled graph for :func:`check_weight_update`); ``compile_config``: the
    ``static_compile`` variant's (default: the engine's own, compiled on CUDA only).

    Returns:
        ``variant``, ``device``, ``rows``, ``new_tokens``, ``tokens`` (generated in the timed call),
        ``every_row_full`` (each row made ``new_tokens``), ``seconds``, ``tokens_per_s``,
        ``warmup_s`` (first call: the compile and graph recording for the static variants),
        ``compiled_graphs`` / ``graph_breaks`` / ``cudagraph_skips`` (torch's counters over both
        calls), ``static_cache_shape`` ((rows, max_cache_len) or None).
    """
    device = torch.device(device)
    model.to(device)
    engine = engine or make_engine(model, processor, variant, rows, compile_config)
    n = min(samples_per_prompt, rows)
    prompts = text_prompts(max(1, rows // n))
    params = SamplingParams(num_samples_per_prompt=n, temperature=1.0, max_response_length=new_tokens, seed=0,
                            stop_token_ids=(never_emitted_token(model),))
    before = _compile_counters()
    with sampler_of(variant):
        _synchronize(device)
        start = time.perf_counter()
        # warm-up: kernels, allocator; for a static engine the compile and CUDA graph of this very cache shape
        warm = params if engine.static_cache else attrs.evolve(params, max_response_length=min(16, new_tokens))
        engine.generate(prompts, warm)
        _synchronize(device)
        warmup_s = time.perf_counter() - start
        start = time.perf_counter()
        groups = engine.generate(prompts, params)
        _synchronize(device)
        seconds = time.perf_counter() - start
    after = _compile_counters()
    tokens = sum(len(c.token_ids) for g in groups for c in g.completions)
    return {"variant": variant, "device": str(device), "rows": len(prompts) * n, "new_tokens": new_tokens,
            "tokens": tokens, "every_row_full": tokens == len(prompts) * n * new_tokens, "seconds": seconds,
            "tokens_per_s": tokens / seconds, "warmup_s": warmup_s,
            **{k: after[k] - before[k] for k in after}, "static_cache_shape": engine.static_cache_shape}


def _final_norm(model: Any) -> tuple[str, torch.nn.Parameter]:
    """The language model's final norm weight (before the LM head)."""
    found = [(n, p) for n, p in model.named_parameters()
             if n.endswith("norm.weight") and ".layers." not in n and "visual" not in n]
    if len(found) != 1:
        raise ValueError(f"expected one final norm weight outside the layers, found {[n for n, _ in found]}")
    return found[0]


@torch.no_grad()
def check_weight_update(engine: HFRolloutEngine, *, new_tokens: int = 32, rows: int | None = None) -> dict[str, Any]:
    """Is a weight update seen by the static engine's compiled decode step (CUDA graphs)?

    ``engine``: a static-cache engine, ideally the one :func:`rollout_tokens_per_s` warmed up
    (its graph is reused when ``new_tokens`` fits its cache). Greedy rollouts before and after
    scaling the final norm weight (x2 through ``update_weights``, then x3 by rebinding the
    parameter to new storage) are compared with an eager dynamic-cache engine over the same model.
    The model's weights are restored at the end.

    Returns:
        ``changed_by``: the largest log-prob change the update made (> 0.1 expected);
        ``copy_vs_eager`` / ``rebind_vs_eager``: :func:`compare_rollouts` of the compiled engine
        against eager after each update; ``ok``: both changed, and both within 25 % of the change
        (a stale graph: ~100 %).
    """
    model = engine.model
    rows = rows or engine.max_batch_sequences
    eager = HFRolloutEngine(model, engine.processor, max_batch_sequences=rows)
    prompts = text_prompts(max(1, rows // 2)) if not _is_vl(model) else [image_prompt()] * max(1, rows // 2)
    params = greedy_full_length(model, new_tokens)
    name, weight = _final_norm(model)
    storage, saved = weight.data, weight.detach().clone()
    try:
        before = engine.generate(prompts, params)
        engine.update_weights([(name, saved * 2)], version=engine.weight_version + 1)
        copied, copied_eager = engine.generate(prompts, params), eager.generate(prompts, params)
        weight.data = saved * 3  # new storage: the captured graph must be re-recorded
        rebound, rebound_eager = engine.generate(prompts, params), eager.generate(prompts, params)
    finally:
        weight.data = storage
        storage.copy_(saved)
    changed_by = compare_rollouts(before, copied)["max_logprob_diff"]
    copy_vs_eager, rebind_vs_eager = compare_rollouts(copied, copied_eager), compare_rollouts(rebound, rebound_eager)
    rebind_changed = compare_rollouts(copied, rebound)["max_logprob_diff"]
    # a stale graph would stay as far from eager as the update moved it (ratio ~1); on an H100 in bf16
    # (2026-11-27) compiled vs eager differed by 3.6 % (copy) and 6.8 % (rebind) of the change: the
    # inductor kernels round differently, and the tripled norm scales that noise up with the logits
    ok = (changed_by > 0.1 and rebind_changed > 0.1 and copy_vs_eager["max_logprob_diff"] < 0.25 * changed_by
          and rebind_vs_eager["max_logprob_diff"] < 0.25 * rebind_changed)
    return {"parameter": name, "changed_by": changed_by, "rebind_changed_by": rebind_changed,
            "copy_vs_eager": copy_vs_eager, "rebind_vs_eager": rebind_vs_eager, "ok": ok}


def _is_vl(model: Any) -> bool:
    return hasattr(model.config, "vision_config")


@torch.no_grad()
def check_vl_compiled_vs_eager(model: Any, processor: Any, *, device: str | torch.device = "cuda",
                               new_tokens: int = 16, compile_config: Any = None) -> dict[str, Any]:
    """One image prompt (2 greedy rows) through a Qwen2.5-VL model: static cache + compiled decode
    step vs the eager dynamic cache. ``ok``: the same tokens in every row.

    Returns:
        ``tokens_equal_rows``, ``max_logprob_diff`` (:func:`compare_rollouts`), ``warmup_s`` (the
        compiled engine's first call), ``compiled_graphs``, ``graph_breaks``, ``cudagraph_skips``, ``ok``.
    """
    device = torch.device(device)
    model.to(device)
    params = greedy_full_length(model, new_tokens)
    compiled = HFRolloutEngine(model, processor, max_batch_sequences=2, static_cache=True,
                               compile_config=compile_config)
    before = _compile_counters()
    start = time.perf_counter()
    compiled.generate([image_prompt()], params)
    _synchronize(device)
    warmup_s = time.perf_counter() - start
    got = compiled.generate([image_prompt()], params)
    after = _compile_counters()
    expected = HFRolloutEngine(model, processor, max_batch_sequences=2).generate([image_prompt()], params)
    result = compare_rollouts(got, expected)
    return {**result, "warmup_s": warmup_s, **{k: after[k] - before[k] for k in after},
            "ok": result["tokens_equal_rows"] == 1.0}


def run_rollout_bench(model: Any, processor: Any, *, device: str | torch.device = "cuda", rows: int = 64,
                      new_tokens: int = 256, variants: Sequence[str] = VARIANTS, vl_model: Any = None,
                      vl_processor: Any = None, compile_config: Any = None) -> dict[str, Any]:
    """Every variant of ``variants`` at ``rows`` x ``new_tokens``, the weight-update check on the
    ``static_compile`` engine (when measured), and the VL check when ``vl_model`` is given.

    Returns:
        ``{variant: rollout_tokens_per_s(...)}`` plus ``speedup_vs_today`` (tokens/s ratios, when
        ``today`` ran), ``weight_update`` and ``vl`` (the checks' dicts), ``versions``.
    """
    import transformers

    report: dict[str, Any] = {"versions": {"torch": torch.__version__, "transformers": transformers.__version__}}
    for variant in variants:
        engine = make_engine(model, processor, variant, rows, compile_config)
        report[variant] = rollout_tokens_per_s(model, processor, rows=rows, new_tokens=new_tokens, variant=variant,
                                               device=device, engine=engine)
        if variant == "static_compile":
            report["weight_update"] = check_weight_update(engine, new_tokens=min(32, new_tokens))
        del engine
    if "today" in report:
        report["speedup_vs_today"] = {v: report[v]["tokens_per_s"] / report["today"]["tokens_per_s"]
                                      for v in variants if v != "today"}
    if vl_model is not None:
        report["vl"] = check_vl_compiled_vs_eager(vl_model, vl_processor, device=device, compile_config=compile_config)
    return report


def qwen2_1_5b_model(device: str | torch.device, dtype: torch.dtype = torch.bfloat16) -> Any:
    """A random-weight Qwen2.5-1.5B-shaped ``Qwen2ForCausalLM`` in ``dtype`` on ``device``."""
    from transformers import Qwen2ForCausalLM

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_sft_mfu import qwen2_1_5b_config

    torch.manual_seed(0)
    with torch.device(device):
        return Qwen2ForCausalLM(qwen2_1_5b_config()).to(dtype).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny Qwen2 and Qwen2.5-VL on the CPU (seconds)")
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--new-tokens", type=int, default=None)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--no-vl", action="store_true", help="skip the image-prompt check")
    parser.add_argument("--out", type=Path, default=None, help="write the report as JSON here")
    args = parser.parse_args()
    from cosmos_primitives import testing as cpt

    compile_config = None
    if args.dry_run:
        from transformers import CompileConfig

        device = torch.device("cpu")
        # tiny matmuls: one thread beats several fighting over a shared CPU (10x here with 2 busy cores)
        torch.set_num_threads(1)
        model, rows, new_tokens = cpt.tiny_qwen2(seed=0).eval(), args.rows or 4, args.new_tokens or 8
        # the compile path without inductor: dynamo's graph capture, guards and recompiles
        compile_config = CompileConfig(backend="eager", mode=None, dynamic=False)
    else:
        device = torch.device("cuda", 0)
        model, rows, new_tokens = qwen2_1_5b_model(device), args.rows or 64, args.new_tokens or 256
    vl = None if args.no_vl else cpt.tiny_qwen2_5_vl(seed=0).eval()
    report = run_rollout_bench(model, cpt.qwen_tokenizer(), device=device, rows=rows, new_tokens=new_tokens,
                               variants=args.variants.split(","), vl_model=vl,
                               vl_processor=None if vl is None else cpt.tiny_qwen2_5_vl_processor(),
                               compile_config=compile_config)
    text = json.dumps(report, indent=1, default=str)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
