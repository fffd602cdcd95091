"""``[policy.lora]``: peft adapters on a Qwen2.5-VL policy, its adapters-off reference, merged
weights for rollout engines (in-process sync) and for the safetensors export, in one process and
under FSDP2 in two gloo processes."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives.config.policy import LoraConfig, ParallelismConfig, PolicyConfig
from cosmos_primitives.sync.sources import MergedLoraWeight, named_sources
from cosmos_primitives.testing import tiny_qwen2_5_vl

IDS = torch.tensor([[9707, 11, 1879, 0, 151644, 872, 198, 100, 2001, 37]])
LORA = LoraConfig(r=4, lora_alpha=8.0)  # scaling 2
Q0 = "model.language_model.layers.0.self_attn.q_proj"


def lora_policy(base: torch.nn.Module, **policy_kw):
    return cp.policy.build_policy(PolicyConfig(dtype="float32", lora=LORA, **policy_kw), hf_model=copy.deepcopy(base))


def train(policy, steps: int = 3) -> None:
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(steps):
        (-cp.policy.token_logprobs(policy, {"input_ids": IDS}).logprobs.sum()).backward()
        optimizer.step()
        optimizer.zero_grad()


def by_hand(model: torch.nn.Module, layer: str) -> torch.Tensor:
    """``W + (alpha / r) * B @ A`` of one adapted layer, from its parameters."""
    params = dict(model.named_parameters())
    a, b = params[f"{layer}.lora_A.default.weight"], params[f"{layer}.lora_B.default.weight"]
    return (params[f"{layer}.base_layer.weight"] + (LORA.lora_alpha / LORA.r) * b @ a).detach()


@pytest.fixture(scope="module")
def base() -> torch.nn.Module:
    return tiny_qwen2_5_vl(seed=0)


@pytest.fixture(scope="module")
def trained(base):
    policy = lora_policy(base)
    before = cp.policy.token_logprobs(policy, {"input_ids": IDS}).logprobs.detach()
    train(policy)
    return policy, before


def test_only_adapters_train_and_the_policy_starts_as_its_base(base) -> None:
    policy = lora_policy(base, freeze_patterns=[r"^model\.visual\."])
    trainable = [n for n, p in policy.hf_model.named_parameters() if p.requires_grad]
    # q, k, v, o of both language layers; the vision tower's fused qkv is no target
    assert len(trainable) == 2 * 4 * 2 and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert policy.trainable_summary.trainable_params == sum(
        p.numel() for p in policy.hf_model.parameters() if p.requires_grad)
    with torch.no_grad():
        assert torch.equal(policy.hf_model(input_ids=IDS).logits, base(input_ids=IDS).logits)  # B starts at 0


def test_training_moves_the_policy_and_the_reference_stays_the_base(base, trained) -> None:
    policy, before = trained
    after = cp.policy.token_logprobs(policy, {"input_ids": IDS}).logprobs.detach()
    assert (after - before).abs().max() > 0.1
    with torch.no_grad(), cp.policy.adapters_disabled(policy.hf_model):
        reference = cp.policy.token_logprobs(policy, {"input_ids": IDS}).logprobs
    assert torch.equal(reference, before)
    assert torch.equal(cp.policy.token_logprobs(policy, {"input_ids": IDS}).logprobs.detach(), after)  # back on


def test_sources_show_merged_weights_under_the_base_names(base, trained) -> None:
    policy, _ = trained
    sources = named_sources(policy.hf_model)
    assert list(sources) == [n for n, _ in base.named_parameters()]
    assert isinstance(sources[f"{Q0}.weight"], MergedLoraWeight)
    assert torch.equal(cp.sync.sources.full_tensor(sources[f"{Q0}.weight"]), by_hand(policy.hf_model, Q0))


def test_in_process_sync_gives_the_engine_the_merged_model(base, trained) -> None:
    policy, _ = trained
    engine = copy.deepcopy(base)
    sync = cp.sync.InProcessSync(policy.hf_model, engine)
    result = sync.sync(version=1)
    assert result.verified and result.num_copied == 8  # the adapted layers; the rest is shared storage
    assert torch.equal(dict(engine.named_parameters())[f"{Q0}.weight"], by_hand(policy.hf_model, Q0))
    with torch.no_grad():
        torch.testing.assert_close(engine(input_ids=IDS).logits, policy.hf_model(input_ids=IDS).logits,
                                   rtol=1e-5, atol=1e-5)
    train(policy, steps=1)
    sync.sync(version=2)
    assert torch.equal(dict(engine.named_parameters())[f"{Q0}.weight"], by_hand(policy.hf_model, Q0))


def test_export_is_a_plain_model_with_the_adapters_folded_in(base, trained, tmp_path: Path) -> None:
    from transformers import Qwen2_5_VLForConditionalGeneration

    policy, _ = trained
    out = cp.checkpoint.export_safetensors(policy, tmp_path / "final")
    names = set(json.loads((out / "model.safetensors.index.json").read_text())["weight_map"])
    assert not [n for n in names if "lora_" in n or "base_layer" in n]
    assert "model.layers.0.self_attn.q_proj.weight" in names  # transformers' on-disk names for Qwen2.5-VL
    loaded = Qwen2_5_VLForConditionalGeneration.from_pretrained(out)
    assert torch.equal(dict(loaded.named_parameters())[f"{Q0}.weight"], by_hand(policy.hf_model, Q0))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=IDS).logits, policy.hf_model(input_ids=IDS).logits,
                                   rtol=1e-5, atol=1e-5)


def test_a_target_that_matches_nothing_names_the_key(base) -> None:
    with pytest.raises(ValueError, match=r"\[policy.lora\] target_modules \['qkv_proj'\]"):
        cp.policy.build_policy(PolicyConfig(dtype="float32", lora=LoraConfig(target_modules=["qkv_proj"])),
                               hf_model=copy.deepcopy(base))


def test_adapters_come_from_peft_alone_not_the_model_classes_peft_gate(base, monkeypatch) -> None:
    """transformers / diffusers gate their ``add_adapter`` on a peft version of their choosing
    (transformers 5.24 refused peft 0.21.2); apply_lora and the reference must not go through it."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("the model class's peft integration was used")
    for name in ("add_adapter", "disable_adapters", "enable_adapters", "set_adapter"):
        monkeypatch.setattr(type(base), name, refuse, raising=False)
    policy = lora_policy(base)
    train(policy, steps=1)
    with cp.policy.adapters_disabled(policy.hf_model):
        reference = cp.policy.token_logprobs(policy, {"input_ids": IDS}).logprobs
    torch.testing.assert_close(reference, cp.policy.token_logprobs(lora_policy(base), {"input_ids": IDS}).logprobs)

    plain = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    cp.policy.apply_lora(plain, LoraConfig(r=2, lora_alpha=4.0, target_modules=["0", "2"]))
    assert sorted(n for n, p in plain.named_parameters() if p.requires_grad) == [
        "0.lora_A.default.weight", "0.lora_B.default.weight", "2.lora_A.default.weight", "2.lora_B.default.weight"]
    x = torch.randn(4, 6)
    with torch.no_grad():
        plain[2].lora_B["default"].weight.fill_(0.5)
        adapted = plain(x)
        with cp.policy.adapters_disabled(plain):
            off = plain(x)
        expected = plain[2].base_layer(plain[1](plain[0].base_layer(x)))
    torch.testing.assert_close(off, expected)
    assert not torch.allclose(adapted, off)
    torch.testing.assert_close(plain(x), adapted)  # adapters back on after the block


def _fsdp_worker(vl_dir: str, export_dir: str) -> dict:
    """Both ranks train the same LoRA policy, sharded over dp_shard = 2, on the same tokens."""
    mesh = cp.parallel.ParallelMesh(ParallelismConfig(dp_shard_size=2), device_type="cpu")
    policy = cp.policy.build_policy(PolicyConfig(model_name_or_path=vl_dir, dtype="float32", lora=LORA,
                                                 parallelism=ParallelismConfig(dp_shard_size=2)), mesh)
    train(policy, steps=2)
    engine = cp.policy.load_hf_model(vl_dir, dtype=torch.float32)
    result = cp.sync.InProcessSync(policy.hf_model, engine).sync(version=1)  # gathers and merges on both ranks
    cp.checkpoint.export_safetensors(policy, export_dir)
    full = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in policy.hf_model.named_parameters() if n.startswith(Q0)}
    with torch.no_grad():
        logits = engine(input_ids=IDS).logits
    return {"verified": result.verified, "engine_q0": dict(engine.named_parameters())[f"{Q0}.weight"].detach().clone(),
            "full": full, "logits": logits}


def test_fsdp2_lora_sync_and_export_in_two_processes(tiny_vl_dir: Path, tmp_path: Path) -> None:
    from transformers import Qwen2_5_VLForConditionalGeneration

    export_dir = tmp_path / "final"
    ranks = cp.testing.run_distributed(_fsdp_worker, 2, args=(str(tiny_vl_dir), str(export_dir)))
    full = ranks[0]["full"]
    expected = full[f"{Q0}.base_layer.weight"] + 2.0 * full[f"{Q0}.lora_B.default.weight"] @ full[
        f"{Q0}.lora_A.default.weight"]
    assert not torch.equal(expected, full[f"{Q0}.base_layer.weight"])  # the adapter has moved
    for rank in ranks:
        assert rank["verified"]
        assert torch.equal(rank["engine_q0"], expected)
    assert torch.equal(ranks[0]["logits"], ranks[1]["logits"])
    loaded = Qwen2_5_VLForConditionalGeneration.from_pretrained(export_dir)
    assert torch.equal(dict(loaded.named_parameters())[f"{Q0}.weight"], expected)
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=IDS).logits, ranks[0]["logits"])


def test_checkpoint_round_trip_restores_adapters_and_their_moments(base, tmp_path: Path) -> None:
    from cosmos_primitives.checkpoint import CheckpointManager
    from cosmos_primitives.config import CheckpointConfig

    cfg = CheckpointConfig(enable_checkpoint=True, save_mode="sync", export_safetensors=False)
    run = tmp_path / "20260101000000"

    def setup(seed: int):
        torch.manual_seed(seed)  # peft draws lora_A at random
        policy = lora_policy(base)
        optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
        return policy, optimizer

    def step(policy, optimizer) -> float:
        loss = -cp.policy.token_logprobs(policy, {"input_ids": IDS}).logprobs.sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return float(loss.detach())

    policy, optimizer = setup(0)
    step(policy, optimizer)
    manager = CheckpointManager(cfg, run, model=policy, optimizer=optimizer)
    manager.save(1)
    manager.close()
    after = [step(policy, optimizer) for _ in range(2)]

    other, other_optimizer = setup(1)
    assert not torch.equal(dict(other.named_parameters())[f"hf_model.{Q0}.lora_A.default.weight"],
                           dict(policy.named_parameters())[f"hf_model.{Q0}.lora_A.default.weight"])
    assert CheckpointManager(cfg, run, model=other, optimizer=other_optimizer).resume(True).step == 1
    assert [step(other, other_optimizer) for _ in range(2)] == after  # bitwise: adapters and AdamW moments
