"""Text-only causal LMs (Qwen2 / Qwen2.5 and Qwen3 families) through the GRPO pieces: loading with
a plain tokenizer, the HF engine, collate, log-probs against a direct forward, and weight sync
(in process, into the vLLM stand-in, and broadcast to another rank) bit for bit."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import cosmos_primitives as cp
from cosmos_primitives import testing as cpt
from cosmos_primitives.data.records import Prompt, SamplingParams
from cosmos_primitives.data.rollout_batch import collate_rollouts
from cosmos_primitives.policy import CausalLMPolicy, token_logprobs
from cosmos_primitives.rollout.hf_engine import HFRolloutEngine

FAMILIES = {"qwen2": (cpt.tiny_qwen2, cpt.save_tiny_qwen2, "Qwen2ForCausalLM"),
            "qwen3": (cpt.tiny_qwen3, cpt.save_tiny_qwen3, "Qwen3ForCausalLM")}
PROMPTS = [Prompt(conversation=[{"role": "user", "content": "count" + " up" * i}], prompt_id=str(i))
           for i in range(3)]


def _step(model: torch.nn.Module, seed: int) -> None:
    """Move every weight (as an optimizer step would)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 1e-2)


def _bits(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_saved_model_loads_back_with_a_plain_tokenizer(family: str, tmp_path) -> None:
    build, save, cls = FAMILIES[family]
    folder = save(tmp_path / family, seed=3)
    processor = cp.policy.load_processor(str(folder))
    assert not hasattr(processor, "image_processor") and processor.pad_token_id is not None
    model = cp.policy.load_hf_model(str(folder), dtype="float32")
    assert type(model).__name__ == cls and model.config.model_type == family
    fresh = dict(build(seed=3).named_parameters())
    for name, value in model.named_parameters():
        assert torch.equal(value, fresh[name]), name
    if family == "qwen3":
        assert any(".self_attn.q_norm." in n for n in fresh) and not any(n.endswith("q_proj.bias") for n in fresh)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_trainer_logprobs_match_a_direct_forward_and_the_engine(family: str, qwen_tokenizer) -> None:
    """The chunked log-prob head of ``CausalLMPolicy`` on a collated text batch equals
    ``log_softmax`` of the model's own logits at each completion token, and the engine's sampling
    log-probs (temperature 1, its KV-cached forward) agree with both."""
    model = FAMILIES[family][0](seed=0)
    groups = HFRolloutEngine(model, qwen_tokenizer).generate(
        PROMPTS, SamplingParams(num_samples_per_prompt=2, temperature=1.0, max_response_length=5, seed=0))
    batch = collate_rollouts(groups, qwen_tokenizer)
    assert set(batch.inputs) == {"input_ids", "attention_mask"}  # no media, no mm_token_type_ids
    out = token_logprobs(CausalLMPolicy(model, chunk_size=7), batch.rows(slice(0, len(batch))),
                         mask=batch.completion_mask, with_entropy=True)
    with torch.no_grad():
        logits = model(input_ids=batch.inputs["input_ids"], attention_mask=batch.inputs["attention_mask"]).logits
    direct = torch.zeros_like(out.logprobs)
    direct[:, 1:] = torch.log_softmax(logits[:, :-1].float(), -1).gather(
        -1, batch.inputs["input_ids"][:, 1:, None])[..., 0]
    mask = batch.completion_mask.bool()
    assert mask.sum() >= len(batch)  # every row has completion tokens
    torch.testing.assert_close(out.logprobs[mask], direct[mask], rtol=0, atol=1e-5)
    assert torch.all(out.logprobs[~mask] == 0)
    torch.testing.assert_close(batch.rollout_logprobs[mask], direct[mask], rtol=0, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_in_process_sync_into_the_hf_engine_is_bitwise(family: str, dtype: torch.dtype, qwen_tokenizer) -> None:
    """Same dtype: the engine's parameters share the trainer's storage; another dtype: copied with a cast."""
    build = FAMILIES[family][0]
    trainer, engine_model = build(seed=0), build(seed=1).to(dtype)
    engine = HFRolloutEngine(engine_model, qwen_tokenizer)
    sync = cp.sync.InProcessSync(trainer, engine_model, engine=engine)
    assert {e.mode for e in sync.plan} == ({"share"} if dtype == torch.float32 else {"copy"})
    for version in (1, 2):
        assert sync.sync(version=version).verified == (version == 1)
        source = dict(trainer.named_parameters())
        for name, value in engine_model.named_parameters():
            assert _bits(value) == _bits(source[name].to(dtype)), name
        assert engine.weight_version == version
        _step(trainer, seed=version)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_in_process_sync_into_the_vllm_standin_is_bitwise(family: str, standin_vllm, tmp_path,
                                                         qwen_tokenizer) -> None:
    """The checkpoint names vLLM's ``load_weights`` takes; the stand-in fuses q / k / v and gate / up
    as vLLM's ``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM`` do (Qwen3's ``q_norm`` / ``k_norm`` kept)."""
    from cosmos_primitives.rollout.vllm_engine import VLLMRolloutEngine
    from test_rollout_vllm_standin import _vllm_names

    build, save, _ = FAMILIES[family]
    engine = VLLMRolloutEngine(str(save(tmp_path / family, seed=1)), qwen_tokenizer, dtype="float32")
    trainer = build(seed=0)
    sync = cp.sync.InProcessSync(trainer, engine, layout="hf_checkpoint", dtype=torch.float32)
    for version in (1, 2):
        sync.sync(version=version)
        held = dict(engine.llm.worker.model_runner.model.named_parameters())
        expected = _vllm_names(trainer)
        assert sorted(held) == sorted(expected)
        for name, value in expected.items():
            assert _bits(held[name]) == _bits(value), name
        _step(trainer, seed=version)
    if family == "qwen3":
        assert "model.layers.0.self_attn.q_norm.weight" in held and "model.layers.0.self_attn.qkv_proj.bias" not in held


def _broadcast_text_model() -> dict:
    """Rank 0 trains a tiny Qwen3, rank 1 holds the engine's copy: HF names (fp32 on the wire) into
    a Qwen3 of other weights, then vLLM's fused names (bf16 on the wire, small buckets)."""
    from cosmos_primitives.sync.broadcast import WeightBroadcaster, WeightReceiver, new_sync_group
    from test_rollout_vllm_standin import _vllm_names
    from test_sync_broadcast import _module_with

    group = new_sync_group(src=0, receivers=[1])
    if dist.get_rank() == 0:
        trainer = cpt.tiny_qwen3(seed=0)
        first = WeightBroadcaster(trainer, group).sync(version=1)
        _step(trainer, seed=1)
        second = WeightBroadcaster(trainer, group, layout="vllm", bucket_bytes=4096,
                                   transfer_dtype=torch.bfloat16).sync(version=2)
        return {"verified": (first.verified, second.verified),
                "hf": {n: _bits(p) for n, p in cpt.tiny_qwen3(seed=0).named_parameters()},
                "vllm": {n: _bits(p.to(torch.bfloat16)) for n, p in _vllm_names(trainer).items()}}
    engine_model = cpt.tiny_qwen3(seed=1)
    first = WeightReceiver(engine_model, group).sync()
    fused = _module_with({n: tuple(p.shape) for n, p in _vllm_names(engine_model).items()}, torch.bfloat16)
    second = WeightReceiver(fused, group).sync()
    return {"verified": (first.verified, second.verified),
            "hf": {n: _bits(p) for n, p in engine_model.named_parameters()},
            "vllm": {n: _bits(p) for n, p in fused.named_parameters()}}


@pytest.mark.slow
def test_broadcast_sync_of_a_qwen3_is_bitwise() -> None:
    trainer, rollout = cpt.run_distributed(_broadcast_text_model, 2, timeout_s=240)
    assert trainer["verified"] == rollout["verified"] == (True, True)
    for layout in ("hf", "vllm"):
        assert set(rollout[layout]) == set(trainer[layout]), layout
        for name, bits in trainer[layout].items():
            assert rollout[layout][name] == bits, (layout, name)
    assert "model.layers.1.self_attn.k_norm.weight" in rollout["vllm"]


_TOKENS = {"input_ids": torch.arange(24).reshape(2, 12) * 997 % 151_000,
           "attention_mask": torch.ones(2, 12, dtype=torch.long)}


def _sharded_qwen3_logprobs() -> dict:
    """A tiny Qwen3 built in memory, sharded as the recipes shard it: FSDP2 over 2 ranks, then
    tensor parallel over 2 ranks (q_norm / k_norm act on each rank's own heads)."""
    from cosmos_primitives.config import ParallelismConfig, PolicyConfig

    out = {}
    for name, sizes in (("fsdp", dict(dp_shard_size=2)), ("tp", dict(tp_size=2, dp_shard_size=1))):
        parallelism = ParallelismConfig(**sizes)
        mesh = cp.parallel.ParallelMesh(parallelism, device_type="cpu")
        policy = cp.policy.build_policy(PolicyConfig(dtype="float32", parallelism=parallelism), mesh,
                                        hf_model=cpt.tiny_qwen3(seed=0))
        out[name] = token_logprobs(policy, _TOKENS).logprobs.detach()
    return out


@pytest.mark.slow
def test_sharded_qwen3_policy_matches_one_process() -> None:
    ranks = cpt.run_distributed(_sharded_qwen3_logprobs, 2, timeout_s=240)
    expected = token_logprobs(CausalLMPolicy(cpt.tiny_qwen3(seed=0)), _TOKENS).logprobs
    for result in ranks:
        for name in ("fsdp", "tp"):
            torch.testing.assert_close(result[name], expected, atol=1e-5, rtol=1e-5, msg=name)
