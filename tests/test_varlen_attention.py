"""Variable-length attention for packed rows (``cosmos_primitives.parallel.varlen_attention``): no
``[B, 1, T, T]`` mask, each packed sample scored as if alone, transformers' SDPA for padding and
``generate``, and the host-side sample offsets."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

import cosmos_primitives as cp
from cosmos_primitives import testing as cpt
from cosmos_primitives.config.policy import PolicyConfig
from cosmos_primitives.data.mrope import MRopeSpec
from cosmos_primitives.data.packing import collate_packed, collate_padded, model_inputs
from cosmos_primitives.data.qwen_vl_encoding import EncodedSample, encode_conversation
from cosmos_primitives.parallel.varlen_attention import (
    VARLEN_ATTENTION,
    available_varlen_kernels,
    enable_varlen_attention,
    packed_attention_kwargs,
    varlen_attention,
    varlen_attention_enabled,
    varlen_attention_forward,
)

PAD = 151643
ROWS = [[7, 5, 9], [11, 4]]  # sample lengths per packed row


def _text_sample(length: int, seed: int) -> EncodedSample:
    ids = torch.randint(0, 5000, (length,), generator=torch.Generator().manual_seed(seed))
    return EncodedSample(input_ids=ids, labels=ids.clone(), position_ids=torch.arange(length))


def _packed_text(rows: list[list[int]] = ROWS, tail: int = 3) -> tuple[dict, list[list[EncodedSample]]]:
    samples = [[_text_sample(n, seed=10 * r + i) for i, n in enumerate(row)] for r, row in enumerate(rows)]
    width = max(sum(row) for row in rows) + tail
    return collate_packed(samples, PAD, pad_to=width), samples


def _policy(hf_model: torch.nn.Module, **cfg) -> torch.nn.Module:
    return cp.policy.build_policy(PolicyConfig(dtype="float32", **cfg), hf_model=hf_model)


def _alone(policy: torch.nn.Module, sample: EncodedSample) -> torch.Tensor:
    """``[L]`` log-probs of one sample scored on its own (a padded batch of one)."""
    with torch.no_grad():
        return cp.policy.token_logprobs(policy, collate_padded([sample], PAD)).logprobs[0]


@pytest.mark.parametrize("via", ["token_logprobs", "model call"])
def test_packed_rows_reach_attention_without_a_dense_mask(monkeypatch, via: str) -> None:
    from transformers import AttentionInterface

    policy = _policy(cpt.tiny_qwen2(seed=0))
    assert policy.hf_model.config._attn_implementation == VARLEN_ATTENTION  # build_policy switched sdpa
    calls = []

    def spy(module, query, key, value, attention_mask, **kwargs):
        calls.append((attention_mask, kwargs.get("cu_seq_lens_q")))
        return varlen_attention_forward(module, query, key, value, attention_mask, **kwargs)

    sdpa_masks = []
    real_sdpa = F.scaled_dot_product_attention

    def sdpa_spy(*args, attn_mask=None, **kwargs):
        sdpa_masks.append(attn_mask)
        return real_sdpa(*args, attn_mask=attn_mask, **kwargs)

    monkeypatch.setitem(AttentionInterface._global_mapping, VARLEN_ATTENTION, spy)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa_spy)
    batch, _ = _packed_text()
    with torch.no_grad():
        if via == "token_logprobs":
            cp.policy.token_logprobs(policy, batch)
        else:
            policy.hf_model(**model_inputs(batch))
    assert len(calls) == policy.config.num_hidden_layers
    assert all(mask is None for mask, _ in calls)
    # token_logprobs hands over the offsets computed on the host: 3 + 2 samples and the 2 padding tails
    given = [cu for _, cu in calls]
    assert all(cu is None for cu in given) if via == "model call" else all(cu.numel() == 8 for cu in given)
    assert sdpa_masks and all(mask is None for mask in sdpa_masks)


@pytest.mark.parametrize("builder", [cpt.tiny_qwen2, cpt.tiny_qwen3])
def test_packed_text_logprobs_equal_each_sample_alone(builder) -> None:
    policy = _policy(builder(seed=0))
    assert policy.config.num_attention_heads != policy.config.num_key_value_heads  # GQA
    batch, samples = _packed_text()
    with torch.no_grad():
        packed = cp.policy.token_logprobs(policy, batch).logprobs
        called = policy.hf_model(**model_inputs(batch)).logits.log_softmax(-1)
    for b, row in enumerate(samples):
        offset = 0
        for s in row:
            n = len(s)
            alone = _alone(policy, s)
            torch.testing.assert_close(packed[b, offset + 1:offset + n], alone[1:], atol=1e-5, rtol=1e-5)
            gathered = called[b, offset:offset + n - 1].gather(-1, s.input_ids[1:, None])[:, 0]
            torch.testing.assert_close(gathered, alone[1:], atol=1e-5, rtol=1e-5)
            offset += n
    # positions that never restart make one sample of each row: the second sample then scores differently
    leaky = dict(batch, position_ids=torch.arange(batch["input_ids"].shape[1]).expand_as(batch["input_ids"]))
    with torch.no_grad():
        mixed = cp.policy.token_logprobs(policy, leaky).logprobs
    first = len(samples[0][0])
    assert (mixed[0, first + 1:first + len(samples[0][1])] - packed[0, first + 1:first + len(samples[0][1])]
            ).abs().max() > 1e-3


@pytest.mark.parametrize("checkpointing", [False, True])
def test_packed_gradients_equal_sdpa_with_its_dense_mask(checkpointing: bool) -> None:
    policy = _policy(cpt.tiny_qwen2(seed=3), model_gradient_checkpointing=checkpointing)
    batch, _ = _packed_text()
    weights = cp.algo.sft_token_weights(batch["labels"])

    def grads() -> dict[str, torch.Tensor]:
        policy.zero_grad()
        cp.policy.token_logprobs(policy, batch, loss_weights=weights).weighted_sum.backward()
        return {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}

    ours = grads()
    policy.hf_model.config._attn_implementation = "sdpa"  # transformers' block-diagonal [B, 1, T, T] mask
    theirs = grads()
    assert ours.keys() == theirs.keys() and len(ours) > 10
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], atol=1e-5, rtol=1e-4, msg=name)


IMAGE_CONV = [
    {"role": "user", "content": [{"type": "image", "image": "red.png"}, {"type": "text", "text": "Which colour?"}]},
    {"role": "assistant", "content": "<think>It is red.</think>\n\n<answer>A</answer>"},
]
TEXT_CONV = [
    {"role": "user", "content": "Say hello."},
    {"role": "assistant", "content": "Hello! Nice to meet you."},
]


def test_packed_vl_rows_with_an_image_equal_each_sample_alone(tiny_vl_processor) -> None:
    policy = _policy(cpt.tiny_qwen2_5_vl(seed=0))
    assert policy.hf_model.config.vision_config._attn_implementation == "sdpa"  # the vision tower keeps its own
    spec = MRopeSpec.from_config(policy.hf_model.config)
    image = encode_conversation(tiny_vl_processor, IMAGE_CONV, mrope=spec, images=[cpt.color_image("red")])
    text = encode_conversation(tiny_vl_processor, TEXT_CONV, mrope=spec)
    rows = [[text, image], [image, text]]
    batch = collate_packed(rows, PAD, pad_to=len(image) + len(text) + 5)
    assert batch["position_ids"].shape[0] == 4
    with torch.no_grad():
        packed = cp.policy.token_logprobs(policy, batch).logprobs
        called = policy.hf_model(**model_inputs(batch)).logits.log_softmax(-1)
    alone = {id(s): _alone(policy, s) for s in (image, text)}
    for b, row in enumerate(rows):
        offset = 0
        for s in row:
            n, scored = len(s), s.labels[1:] != -100
            torch.testing.assert_close(packed[b, offset + 1:offset + n][scored], alone[id(s)][1:][scored],
                                       atol=1e-5, rtol=1e-5)
            gathered = called[b, offset:offset + n - 1].gather(-1, s.input_ids[1:, None])[:, 0]
            torch.testing.assert_close(gathered, _alone_every_token(policy, s), atol=1e-5, rtol=1e-5)
            offset += n


def _alone_every_token(policy: torch.nn.Module, sample: EncodedSample) -> torch.Tensor:
    """``[L - 1]`` log-probs of every next token of one sample run on its own (logits of the HF model)."""
    with torch.no_grad():
        logits = policy.hf_model(**model_inputs(collate_padded([sample], PAD))).logits[0, :-1]
    return logits.log_softmax(-1).gather(-1, sample.input_ids[1:, None])[:, 0]


def test_qwen3_vl_text_rows_packed_with_4_row_positions_equal_each_sample_alone() -> None:
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    text = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16,
                rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [4, 2, 2],
                                 "mrope_interleaved": True})
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                  deepstack_visual_indexes=[0])
    torch.manual_seed(0)
    model = Qwen3VLForConditionalGeneration(Qwen3VLConfig(text_config=text, vision_config=vision)).eval()
    lengths = [5, 7, 3]
    ids = torch.randint(0, 900, (1, sum(lengths)))
    positions = torch.cat([torch.arange(n) for n in lengths]).expand(4, 1, -1)
    assert enable_varlen_attention(model) and model.config.vision_config._attn_implementation == "sdpa"
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=positions, use_cache=False,
                       **packed_attention_kwargs(ids, positions)).logits[0]
        offset = 0
        for n in lengths:
            alone = model(input_ids=ids[:, offset:offset + n], use_cache=False).logits[0]
            torch.testing.assert_close(packed[offset:offset + n], alone, atol=1e-5, rtol=1e-5)
            offset += n


def _left_padded(lengths: list[int]) -> dict[str, torch.Tensor]:
    width = max(lengths)
    ids = torch.full((len(lengths), width), PAD)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, width - n:] = torch.randint(0, 5000, (n,), generator=torch.Generator().manual_seed(b))
        mask[b, width - n:] = 1
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": positions}


def test_a_padded_batch_is_transformers_sdpa() -> None:
    model = cpt.tiny_qwen2(seed=2).eval()
    batch = _left_padded([9, 4, 6])
    with torch.no_grad():
        reference = model(**batch, use_cache=False).logits
        assert enable_varlen_attention(model)
        ours = model(**batch, use_cache=False).logits
        # the same positions on real tokens, counting on through the padding: one sample per row, padding seen
        through = torch.arange(batch["input_ids"].shape[1]) - (1 - batch["attention_mask"]).sum(1, keepdim=True)
        unmasked = model(input_ids=batch["input_ids"], position_ids=through, use_cache=False).logits
    real = batch["attention_mask"].bool()
    assert torch.equal(through[real], batch["position_ids"][real])
    torch.testing.assert_close(ours[real], reference[real], atol=1e-6, rtol=1e-6)
    assert (unmasked[real] - reference[real]).abs().max() > 1e-3  # the padding mask matters here


@pytest.mark.parametrize("lengths", [[7], [9, 4, 6]])
def test_generate_with_a_kv_cache_gives_the_same_tokens_as_sdpa(lengths: list[int]) -> None:
    model = cpt.tiny_qwen2(seed=4).eval()
    batch = _left_padded(lengths)
    batch.pop("position_ids")

    def generate() -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(0)
        with torch.no_grad():
            out = model.generate(**batch, max_new_tokens=8, do_sample=True, pad_token_id=PAD, output_logits=True,
                                 return_dict_in_generate=True)
        return out.sequences, torch.stack(out.logits)

    reference, reference_logits = generate()
    assert enable_varlen_attention(model)
    ours, logits = generate()
    assert torch.equal(ours, reference)
    torch.testing.assert_close(logits, reference_logits, atol=1e-5, rtol=1e-5)  # prefill and every cached step
    assert len(set(reference[0, -8:].tolist())) > 1  # sampled tokens that differ from step to step


def test_packed_attention_kwargs_offsets_over_flattened_rows() -> None:
    positions = torch.tensor([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1]])  # row 0: samples 3, 2, tail 1
    ids = torch.zeros_like(positions)
    got = packed_attention_kwargs(ids, positions)
    assert got["cu_seq_lens_q"].dtype == torch.int32 and got["cu_seq_lens_q"] is got["cu_seq_lens_k"]
    assert got["cu_seq_lens_q"].tolist() == [0, 3, 5, 6, 10, 12]
    assert got["max_length_q"] == got["max_length_k"] == 4 and isinstance(got["max_length_q"], int)
    mrope = torch.stack([positions, positions * 0, positions * 0, positions * 0])  # [4, B, T]: row 0 decides
    assert packed_attention_kwargs(ids, mrope)["cu_seq_lens_q"].tolist() == [0, 3, 5, 6, 10, 12]
    for whole_rows in (None, mrope[1:]):  # no text positions: one sample per row, as transformers assumes
        assert packed_attention_kwargs(ids, whole_rows)["cu_seq_lens_q"].tolist() == [0, 6, 12]
    jump = packed_attention_kwargs(ids[:1], torch.tensor([[0, 1, 5, 6, 7, 0]]))  # not +1: a new sample
    assert jump["cu_seq_lens_q"].tolist() == [0, 2, 5, 6] and jump["max_length_q"] == 3
    with pytest.raises(ValueError, match="do not fit"):
        packed_attention_kwargs(ids, positions[:, :4])


def test_enable_is_idempotent_and_leaves_other_models_alone() -> None:
    model = cpt.tiny_qwen2(seed=0)
    assert not varlen_attention_enabled(model)
    assert enable_varlen_attention(model) and enable_varlen_attention(model)
    assert varlen_attention_enabled(model) and varlen_attention_enabled(_policy(model))
    sliding = cpt.tiny_qwen2(seed=0)
    sliding.config.layer_types = ["sliding_attention", "full_attention"]
    assert not enable_varlen_attention(sliding) and sliding.config._attn_implementation == "sdpa"
    eager = cpt.tiny_qwen2(seed=0)
    eager.config._attn_implementation = "eager"
    assert _policy(eager).hf_model.config._attn_implementation == "eager"  # build_policy switches sdpa only


def test_per_sample_path_matches_sdpa_on_each_sample() -> None:
    lengths = [5, 1, 9]
    cu = torch.tensor([0, 5, 6, 15], dtype=torch.int32)
    q, k, v = (torch.randn(15, h, 8, generator=torch.Generator().manual_seed(h)) for h in (4, 2, 2))
    out = varlen_attention(q, k, v, cu, cu, max(lengths), max(lengths), scale=0.3)
    for start, end in zip(cu[:-1].tolist(), cu[1:].tolist()):
        ref = F.scaled_dot_product_attention(q[None, start:end].transpose(1, 2),
                                             k[None, start:end].repeat_interleave(2, 2).transpose(1, 2),
                                             v[None, start:end].repeat_interleave(2, 2).transpose(1, 2),
                                             is_causal=True, scale=0.3)
        torch.testing.assert_close(out[start:end], ref[0].transpose(0, 1), atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="not available"):
        varlen_attention(q, k, v, cu, cu, 9, 9, kernel="no_such_kernel")


def test_attention_benchmark_dry_run_on_cpu(monkeypatch) -> None:
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bench_attention import attention_variants

    report = attention_variants(device="cpu", print_table=False)
    assert report["dry_run"] and report["varlen_kernel"] == "sdpa_per_sample" and report["dense_mask_error"] is None
    assert set(report["variants"]) == {"dense_mask", "varlen", "causal_rows"}
    assert all(entry["ms"] > 0 and entry["top_kernels"] for entry in report["variants"].values())
    assert [sum(row) for row in report["sample_lengths"]] == [report["shape"]["seq_len"]] * report["shape"]["rows"]


GPU_LENGTHS = [300, 17, 1, 700, 1024]  # samples of one flattened batch
GPU_HEADS, GPU_KV_HEADS, GPU_DIM = 12, 2, 128


def _cuda_qkv(dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """``q [N, 12, 128]``, ``k``, ``v [N, 2, 128]`` leaves, the upstream gradient, and the offsets."""
    make = torch.Generator(device="cuda").manual_seed(0)
    n = sum(GPU_LENGTHS)
    q, k, v, grad = (torch.randn(n, h, GPU_DIM, device="cuda", generator=make)
                     for h in (GPU_HEADS, GPU_KV_HEADS, GPU_KV_HEADS, GPU_HEADS))
    cu = torch.tensor([0, *torch.tensor(GPU_LENGTHS).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    return (*(x.to(dtype).requires_grad_() for x in (q, k, v)), grad.to(dtype), cu)


def _attend(q, k, v, grad, cu, kernel: str) -> list[torch.Tensor]:
    """Output and q / k / v gradients (float32) of :func:`varlen_attention` through ``kernel``."""
    longest = max(GPU_LENGTHS)
    out = varlen_attention(q, k, v, cu, cu, longest, longest, scale=GPU_DIM ** -0.5, kernel=kernel)
    out.backward(grad)
    return [x.float() for x in (out, q.grad, k.grad, v.grad)]


@pytest.mark.gpu
def test_cuda_varlen_kernels_match_per_sample_sdpa_in_bfloat16(monkeypatch) -> None:
    module = importlib.import_module("cosmos_primitives.parallel.varlen_attention")  # not cp.parallel's function

    kernels = available_varlen_kernels()
    assert kernels, "no varlen kernel on this CUDA machine"
    reference = _attend(*_cuda_qkv(torch.float32), kernel="sdpa_per_sample")
    for kernel in ["sdpa_per_sample", *kernels]:  # the bfloat16 per-sample path sets the error scale
        for got, want, what in zip(_attend(*_cuda_qkv(torch.bfloat16), kernel=kernel), reference,
                                   ("out", "dq", "dk", "dv")):
            error = ((got - want).norm() / want.norm()).item()
            assert error < 2e-2, f"{kernel} {what}: relative error {error:.2e} against float32 per-sample SDPA"
    # the default takes a kernel (not the per-sample loop) and, given the offsets, never waits for the device
    monkeypatch.setattr(module, "_per_sample_sdpa", None)
    q, k, v, _, cu = _cuda_qkv(torch.bfloat16)
    n, longest = sum(GPU_LENGTHS), max(GPU_LENGTHS)
    layer = torch.nn.Module()
    layer.is_causal, layer.num_key_value_groups = True, GPU_HEADS // GPU_KV_HEADS
    hf_q, hf_k, hf_v = (x.detach().view(1, n, -1, GPU_DIM).transpose(1, 2) for x in (q, k, v))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out, _ = varlen_attention_forward(layer, hf_q, hf_k, hf_v, None, scaling=GPU_DIM ** -0.5, cu_seq_lens_q=cu,
                                          cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    error = ((out[0].float() - reference[0]).norm() / reference[0].norm()).item()
    assert error < 2e-2


@pytest.mark.gpu
def test_cuda_varlen_path_compiles_in_one_graph() -> None:
    available_varlen_kernels()  # resolved outside the compiled region, as register_varlen_attention does
    q, k, v, grad, cu = _cuda_qkv(torch.bfloat16)
    n, longest = sum(GPU_LENGTHS), max(GPU_LENGTHS)
    layer = torch.nn.Module()
    layer.is_causal, layer.num_key_value_groups = True, GPU_HEADS // GPU_KV_HEADS

    def attend(q, k, v, cu, longest):
        views = (x.view(1, n, -1, GPU_DIM).transpose(1, 2) for x in (q, k, v))
        return varlen_attention_forward(layer, *views, None, scaling=GPU_DIM ** -0.5, cu_seq_lens_q=cu,
                                        cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest)[0]

    compiled = torch.compile(attend, fullgraph=True)  # a graph break raises
    compiled(q, k, v, cu, longest).backward(grad.view(1, n, GPU_HEADS, GPU_DIM))
    compiled_grads = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    attend(q, k, v, cu, longest).backward(grad.view(1, n, GPU_HEADS, GPU_DIM))
    for got, want in zip(compiled_grads, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
def test_packed_bf16_policy_on_cuda_scores_each_sample_as_alone() -> None:
    policy = cp.policy.build_policy(PolicyConfig(dtype="bfloat16"), hf_model=cpt.tiny_qwen2(seed=0, hidden_size=256),
                                    device="cuda")
    assert varlen_attention_enabled(policy)
    batch, samples = _packed_text()
    with torch.no_grad():
        packed = cp.policy.token_logprobs(policy, batch).logprobs.cpu()
    for b, row in enumerate(samples):
        offset = 0
        for s in row:
            alone = _alone(policy, s).cpu()
            torch.testing.assert_close(packed[b, offset + 1:offset + len(s)], alone[1:], atol=5e-2, rtol=5e-2)
            offset += len(s)
