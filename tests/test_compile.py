"""``[train] compile``: every decoder layer compiles as one graph (no graph break) in an SFT training
step on the batches the SFT loader makes (packed rows: ``position_ids`` restarting per sample, no
``attention_mask``), with and without activation checkpointing, for tiny Qwen2 and Qwen2.5-VL; the
compiled step computes what the eager one does; a new row length compiles once more (dynamic) and
then never again; Qwen2.5-VL's vision blocks compile with a varlen (cu_seqlens) attention and are
left alone under sdpa; ``build_policy`` applies it on the device types it is for.

The counting backend ("eager": the captured graphs run as they are) needs no compiler and takes
seconds; inductor's speed is for the GPU pack. To check another attention implementation (e.g. the
packed-row varlen one once it is registered), add its name to ``ATTENTION_IMPLEMENTATIONS``.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounterWithBackend

import cosmos_primitives as cp
from cosmos_primitives import testing as cpt
from cosmos_primitives.config.policy import PolicyConfig
from cosmos_primitives.config.train import TrainConfig
from cosmos_primitives.data.mrope import MRopeSpec
from cosmos_primitives.data.packing import collate_packed
from cosmos_primitives.data.qwen_vl_encoding import encode_conversation
from cosmos_primitives.parallel import compile as compile_module
from cosmos_primitives.parallel.compile import apply_compile
from cosmos_primitives.parallel.varlen_attention import VARLEN_ATTENTION, enable_varlen_attention
from cosmos_primitives.policy import build as build_module

CASES = [
    ("cpu", "sdpa"),
    pytest.param("cuda", "sdpa", marks=pytest.mark.gpu),
    pytest.param("cuda", VARLEN_ATTENTION, marks=pytest.mark.gpu),  # its CPU path reads offsets on the host
]
"""(device, attention implementation) under which the decoder layers must compile without a graph
break; on CUDA in bfloat16 (the varlen kernels' dtype)."""

PAD = 151643
IMAGE_CONV = [
    {"role": "user", "content": [{"type": "image", "image": "red.png"}, {"type": "text", "text": "Which colour?"}]},
    {"role": "assistant", "content": "<think>It is red.</think>\n\n<answer>A</answer>"},
]


def _text_conv(n: int) -> list[dict]:
    return [{"role": "user", "content": "Say hello " * n}, {"role": "assistant", "content": "Hello! " * n}]


@pytest.fixture
def cosmos_log(caplog: pytest.LogCaptureFixture):
    logger = logging.getLogger("cosmos")  # it does not propagate to the root logger
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="cosmos")
    yield caplog
    logger.removeHandler(caplog.handler)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def text_batch(lengths: list[int], rows: int = 2, seed: int = 0) -> dict[str, torch.Tensor]:
    """What ``collate_packed`` gives a text model: ``rows`` rows of samples of ``lengths`` tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 5000, (rows, sum(lengths)), generator=g)
    positions = torch.cat([torch.arange(n) for n in lengths]).repeat(rows, 1)
    labels = ids.clone()
    labels[positions == 0] = -100  # the first token of a sample is not predicted from the previous one
    return {"input_ids": ids, "labels": labels, "position_ids": positions}


def vl_batch(processor, model, text_turns: int) -> dict[str, torch.Tensor]:
    """Two packed rows of Qwen2.5-VL samples (``position_ids`` ``[4, B, T]``, image tensors)."""
    spec = MRopeSpec.from_config(model.config)
    image = encode_conversation(processor, IMAGE_CONV, mrope=spec, images=[cpt.color_image("red")])
    texts = [encode_conversation(processor, _text_conv(n), mrope=spec) for n in (text_turns, text_turns + 2)]
    return collate_packed([[image, texts[0]], [texts[1]]], PAD)


def with_attention(model: torch.nn.Module, name: str) -> torch.nn.Module:
    """``model`` with its language model's attention implementation set to ``name``."""
    config = model.config.get_text_config()
    config._attn_implementation = name
    return model


def train_step(policy: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One SFT forward + backward; the gradients it leaves, by parameter name."""
    policy.zero_grad(set_to_none=True)
    weights = cp.algo.sft_token_weights(batch["labels"])
    out = cp.policy.token_logprobs(policy, batch, loss_weights=weights)
    loss, _ = cp.algo.sft_loss(out.logprobs, batch["labels"], weighted_sum=out.weighted_sum)
    loss.backward()
    return {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}


def graph_breaks() -> int:
    return sum(torch._dynamo.utils.counters["graph_break"].values())


@pytest.mark.parametrize(("device", "attention"), CASES)
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
@pytest.mark.parametrize("family", ["qwen2", "qwen2_5_vl"])
def test_decoder_layers_compile_whole_in_a_training_step(family: str, checkpointing: bool, device: str,
                                                         attention: str, request: pytest.FixtureRequest) -> None:
    dtype = torch.float32 if device == "cpu" else torch.bfloat16

    def build() -> torch.nn.Module:
        hf = cpt.tiny_qwen2(seed=0) if family == "qwen2" else cpt.tiny_qwen2_5_vl(seed=0)
        if attention == VARLEN_ATTENTION:
            assert enable_varlen_attention(hf)
        else:
            with_attention(hf, attention)
        if checkpointing:
            cp.parallel.apply_activation_checkpointing(hf)
        return cp.policy.CausalLMPolicy(hf).to(device, dtype).train()

    if family == "qwen2":
        batches = [text_batch([9, 14, 5]), text_batch([20, 3, 11, 6]), text_batch([7, 31])]
    else:
        processor = request.getfixturevalue("tiny_vl_processor")
        batches = [vl_batch(processor, cpt.tiny_qwen2_5_vl(), n) for n in (1, 3, 6)]
    assert "attention_mask" not in batches[0]
    assert len({b["input_ids"].shape[1] for b in batches}) == 3

    eager, compiled = build(), build()
    counter = CompileCounterWithBackend("eager")
    result = apply_compile(compiled.hf_model, backend=counter)
    decoder = "Qwen2DecoderLayer" if family == "qwen2" else "Qwen2_5_VLDecoderLayer"
    assert result.compiled == [decoder, decoder]
    if family == "qwen2_5_vl":  # its vision blocks split their rows at cu_seqlens.tolist() under sdpa
        assert list(result.skipped) == ["Qwen2_5_VLVisionBlock"]

    frames = []
    for batch in batches:
        batch = {k: v.to(device) for k, v in batch.items()}
        expected, got = train_step(eager, batch), train_step(compiled, batch)
        assert got.keys() == expected.keys()
        for name in expected:
            torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)
        frames.append(counter.frame_count)
    assert graph_breaks() == 0
    # one graph for both layers; a new row length compiles a dynamic-length graph once, then nothing.
    # Varlen attention also takes the sample offsets (their count) and the longest sample (an int):
    # each goes dynamic at its first change, which for the VL batches here is the third batch
    # (seen on an H100, torch 2.11: [1, 2, 3])
    assert frames[0] == 1
    assert frames[-1] <= (3 if attention == VARLEN_ATTENTION else 2), frames


def test_varlen_decoder_layers_compile_only_where_its_kernels_run() -> None:
    hf = cpt.tiny_qwen2(seed=0)
    assert enable_varlen_attention(hf)
    result = apply_compile(hf, backend="eager", compute_dtype=torch.bfloat16, device_type="cpu")
    assert result.compiled == [] and "runs sample by sample" in result.skipped["Qwen2DecoderLayer"]
    assert "not compiled: Qwen2DecoderLayer" in result.summary()


def segment_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, cu_seq_lens_q=None,
                      **kwargs):
    """A varlen attention in transformers' flash-style interface: ``query`` ``[1, H, T, D]`` attends
    within the segments ``cu_seq_lens_q`` delimits, with no host sync (what a flash varlen kernel
    takes)."""
    positions = torch.arange(query.shape[2], device=query.device)
    segment = torch.searchsorted(cu_seq_lens_q[1:], positions, right=True)
    mask = segment[:, None] == segment[None, :]
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def test_vision_blocks_compile_whole_with_a_varlen_attention(tiny_vl_processor) -> None:
    from transformers import AttentionInterface

    # "flash" in the name: transformers then hands the vision blocks cu_seqlens instead of splitting
    AttentionInterface.register("flash_segments_test", segment_attention)
    eager = cp.policy.CausalLMPolicy(cpt.tiny_qwen2_5_vl(seed=0)).train()
    hf = cpt.tiny_qwen2_5_vl(seed=0)
    hf.config.vision_config._attn_implementation = "flash_segments_test"
    compiled = cp.policy.CausalLMPolicy(hf).train()
    counter = CompileCounterWithBackend("eager")
    result = apply_compile(hf, backend=counter)
    assert sorted(set(result.compiled)) == ["Qwen2_5_VLDecoderLayer", "Qwen2_5_VLVisionBlock"] and not result.skipped
    batch = vl_batch(tiny_vl_processor, hf, 2)
    expected, got = train_step(eager, batch), train_step(compiled, batch)
    assert any(".visual.blocks." in n for n in got)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)
    assert graph_breaks() == 0 and counter.frame_count == 2  # one graph per block class


def test_build_policy_compiles_the_policy_where_compile_applies(monkeypatch, cosmos_log) -> None:
    calls = []
    counter = CompileCounterWithBackend("eager")

    def spy(model, **kwargs):
        calls.append((model, kwargs))
        return apply_compile(model, **{**kwargs, "backend": counter})

    def model() -> torch.nn.Module:  # eager attention: build_policy leaves it (sdpa becomes varlen)
        return with_attention(cpt.tiny_qwen2(), "eager")

    monkeypatch.setattr(build_module, "apply_compile", spy)
    cfg = PolicyConfig(dtype="float32")
    policy = cp.policy.build_policy(cfg, hf_model=model(), device="cpu", train=TrainConfig(compile=True))
    assert calls == [] and "[train] compile = true is not applied on 'cpu'" in cosmos_log.text
    cp.policy.build_policy(cfg, hf_model=model(), device="cpu", train=TrainConfig())
    assert calls == []

    monkeypatch.setattr(build_module, "COMPILE_DEVICE_TYPES", ("cpu",))
    policy = cp.policy.build_policy(cfg, hf_model=model(), device="cpu", train=TrainConfig(compile=True))
    assert calls == [(policy.hf_model, {"compute_dtype": torch.float32, "device_type": "cpu"})]
    assert "[train] compile: Qwen2DecoderLayer x 2" in cosmos_log.text
    cp.policy.build_policy(cfg, hf_model=model(), device="cpu", train=TrainConfig(compile=True), frozen=True)
    assert len(calls) == 1  # the KL reference is not compiled
    train_step(policy, text_batch([6, 10]))
    assert counter.frame_count == 1 and graph_breaks() == 0


def test_a_grpo_like_mix_of_batches_stays_within_the_recompile_limit() -> None:
    """Training and no-grad passes (with checkpointing), packed rows and rows of one sample (no
    mask), new lengths: each is a variant of the one function every block shares, and torch's
    default limit (8) would stop a ``fullgraph`` run with an error after three steps."""
    # dynamo's own patch restores the setting; pytest's monkeypatch deletes it from dynamo's config
    # module on undo, and every later compile in the process then fails
    with torch._dynamo.config.patch(recompile_limit=8):
        hf = cpt.tiny_qwen2(seed=0)
        cp.parallel.apply_activation_checkpointing(hf)
        policy = cp.policy.CausalLMPolicy(hf).train()
        counter = CompileCounterWithBackend("eager")
        apply_compile(hf, backend=counter)
        assert torch._dynamo.config.recompile_limit == compile_module.RECOMPILE_LIMIT
        for lengths in ([10, 14], [5, 30, 7], [40]):
            batch = text_batch(lengths)
            train_step(policy, batch)
            with torch.no_grad():
                cp.policy.token_logprobs(policy, batch)
        assert counter.frame_count > 8 and graph_breaks() == 0
