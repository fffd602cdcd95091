"""Memory options of the trainer: a sharded KL reference, FSDP2 CPU offload, bfloat16 master weights.

One ``run_distributed`` call (2 gloo processes, FSDP over dp_shard=2) runs every scenario:

- the GRPO KL reference (``grpo_reference`` with the mesh, no LoRA) holds half of the model's
  parameter bytes per rank and gives the unsharded reference's log-probs (float32: atol 1e-5);
- ``[train] fsdp_offload``, ``master_dtype = "bfloat16"`` and ``model_gradient_checkpointing``
  alone and all together train the same two SFT steps as the plain run: offload and checkpointing
  exactly (atol 1e-5 on losses and weights), bfloat16 master weights within bfloat16 precision.

``BFloat16AdamW`` is also checked on one process: its formulas are ``torch.optim.AdamW``'s on
float32 weights, and on bfloat16 weights it keeps updates far below a bfloat16 step that
``torch.optim.AdamW`` (round to nearest) drops.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.distributed.tensor import DTensor

import cosmos_primitives as cp
from cosmos_primitives.algo.sft_objective import sft_loss
from cosmos_primitives.config.grpo import GRPOConfig
from cosmos_primitives.config.policy import ParallelismConfig, PolicyConfig
from cosmos_primitives.config.root import Config
from cosmos_primitives.config.train import TrainConfig
from cosmos_primitives.policy.optim import BFloat16AdamW, round_stochastic_

WATCHED = ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight")
OPTIONS = {  # [train] / [policy] settings of each run; "plain" is the baseline
    "plain": ({}, False),
    "offload": ({"fsdp_offload": True}, False),
    "checkpointing": ({}, True),
    "bf16_master": ({"master_dtype": "bfloat16"}, False),
    "all": ({"fsdp_offload": True, "master_dtype": "bfloat16"}, True),
}


def _batch(rank: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(11 + rank)
    ids = torch.randint(0, 3000, (2, 12), generator=g)
    labels = ids.clone()
    labels[:, :4] = -100
    return {"input_ids": ids, "labels": labels}


def _local_bytes(module: torch.nn.Module) -> int:
    return sum((p.to_local() if isinstance(p, DTensor) else p).nbytes for p in module.parameters())


def _full(param: torch.Tensor) -> torch.Tensor:
    return (param.full_tensor() if isinstance(param, DTensor) else param).detach().float().clone()


def _worker(model_dir: str) -> dict:
    import torch.distributed as dist

    rank = dist.get_rank()
    parallelism = ParallelismConfig(dp_shard_size=2)
    mesh = cp.parallel.ParallelMesh(parallelism, device_type="cpu")
    result: dict = {}

    # the KL reference, sharded like the policy
    cfg = Config(policy=PolicyConfig(model_name_or_path=model_dir, dtype="float32", parallelism=parallelism),
                 grpo=GRPOConfig(kl_beta=0.05))
    policy = cp.policy.build_policy(cfg.policy, mesh, train=cfg.train)
    reference = cp.policy.grpo_reference(policy, "cpu", mesh, kl_beta=cfg.grpo.kl_beta, policy_cfg=cfg.policy,
                                         train=cfg.train)
    result["ref_bytes"] = _local_bytes(reference)
    result["ref_trainable"] = sum(p.requires_grad for p in reference.parameters())
    result["ref_training"] = reference.training
    result["ref_units"] = len(cp.parallel.fsdp_units(reference))
    with torch.no_grad():
        result["ref_logprobs"] = cp.policy.token_logprobs(reference, _batch(0)).logprobs
    del policy, reference

    # two SFT steps under each memory option
    for name, (train_options, checkpointing) in OPTIONS.items():
        train = TrainConfig(optm_lr=1e-3, optm_weight_decay=0.1, optm_grad_norm_clip=1.0, **train_options)
        policy_cfg = PolicyConfig(model_name_or_path=model_dir, dtype="bfloat16", parallelism=parallelism,
                                  model_gradient_checkpointing=checkpointing)
        policy = cp.policy.build_policy(policy_cfg, mesh, train=train)
        optimizer = cp.policy.build_optimizer(policy, train)
        losses = []
        for _ in range(2):
            batch = _batch(rank)
            out = cp.policy.token_logprobs(policy, batch)
            loss, _ = sft_loss(out.logprobs, batch["labels"], group=mesh.group("dp"))
            loss.backward()
            cp.parallel.clip_grad_norm_(policy.parameters(), train.optm_grad_norm_clip)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(float(loss.detach()))
        params = dict(policy.hf_model.named_parameters())
        state = optimizer.state[params[WATCHED[1]]]
        result[name] = {
            "losses": losses,
            "params": {n: _full(params[n]) for n in WATCHED},
            "param_dtypes": sorted({str(p.dtype) for p in policy.parameters()}),
            "state_dtypes": sorted({str(state[k].dtype) for k in ("exp_avg", "exp_avg_sq")}),
            "state_is_dtensor": isinstance(state["exp_avg"], DTensor),
            "optimizer": type(optimizer).__name__,
        }
    return result


@pytest.fixture(scope="module")
def runs(tiny_qwen2_dir: Path) -> dict:
    return {"ranks": cp.testing.run_distributed(_worker, 2, args=(str(tiny_qwen2_dir),)),
            "model_dir": str(tiny_qwen2_dir)}


def test_kl_reference_is_sharded_like_the_policy(runs: dict) -> None:
    cfg = Config(policy=PolicyConfig(model_name_or_path=runs["model_dir"], dtype="float32"),
                 grpo=GRPOConfig(kl_beta=0.05))
    unsharded = cp.policy.grpo_reference(None, "cpu", kl_beta=cfg.grpo.kl_beta, policy_cfg=cfg.policy,
                                         train=cfg.train)
    full_bytes = _local_bytes(unsharded)
    with torch.no_grad():
        expected = cp.policy.token_logprobs(unsharded, _batch(0)).logprobs
    for result in runs["ranks"]:
        # dim-0 shards of uneven sizes: each rank holds half, to within one row per tensor
        assert result["ref_bytes"] == pytest.approx(full_bytes / 2, rel=0.01)
        assert result["ref_trainable"] == 0 and result["ref_training"] is False
        assert result["ref_units"] == 3  # two decoder layers and the root
        torch.testing.assert_close(result["ref_logprobs"], expected, atol=1e-5, rtol=1e-5)


def test_kl_reference_with_lora_is_the_policy() -> None:
    cfg = cp.load_config(Path(__file__).resolve().parents[1] / "examples" / "configs" / "grpo_tiny.toml",
                         ["grpo.kl_beta=0.05", "policy.lora.r=4"])
    policy = object()
    assert cp.policy.grpo_reference(policy, "cpu", kl_beta=cfg.grpo.kl_beta, policy_cfg=cfg.policy,
                                    train=cfg.train) is policy


@pytest.mark.parametrize("option", ["offload", "checkpointing"])
def test_offload_and_checkpointing_train_exactly_as_the_plain_run(runs: dict, option: str) -> None:
    for result in runs["ranks"]:
        plain, got = result["plain"], result[option]
        torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(plain["losses"]), atol=1e-5, rtol=1e-5)
        for name in WATCHED:
            torch.testing.assert_close(got["params"][name], plain["params"][name], atol=1e-5, rtol=1e-5)
        assert got["param_dtypes"] == ["torch.float32"] and got["optimizer"] == "AdamW"


@pytest.mark.parametrize("option", ["bf16_master", "all"])
def test_bf16_master_weights_keep_float32_adam_state(runs: dict, option: str) -> None:
    for result in runs["ranks"]:
        plain, got = result["plain"], result[option]
        assert got["param_dtypes"] == ["torch.bfloat16"]
        assert got["optimizer"] == "BFloat16AdamW"
        assert got["state_dtypes"] == ["torch.float32"] and got["state_is_dtensor"]
        # same first loss up to bfloat16 weights; the second after an update of lr 1e-3
        assert got["losses"][0] == pytest.approx(plain["losses"][0], abs=0.02)
        assert got["losses"][1] == pytest.approx(plain["losses"][1], abs=0.02)
        assert got["losses"][1] < got["losses"][0]
        for name in WATCHED:
            moved = (got["params"][name] - plain["params"][name]).abs().max()
            assert moved < 0.01, f"{option} {name}: {moved}"


def test_bf16_adamw_is_adamw_on_float32_weights() -> None:
    torch.manual_seed(0)
    weights = [torch.randn(5, 3), torch.randn(4)]
    ours = [w.clone().requires_grad_() for w in weights]
    theirs = [w.clone().requires_grad_() for w in weights]
    opt_ours = BFloat16AdamW(ours, lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    opt_theirs = torch.optim.AdamW(theirs, lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    for step in range(3):
        for params, opt in ((ours, opt_ours), (theirs, opt_theirs)):
            grads = [torch.sin(torch.arange(p.numel(), dtype=torch.float32) + step).view_as(p) for p in params]
            for p, g in zip(params, grads, strict=True):
                p.grad = g
            opt.step()
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    assert set(opt_ours.state[ours[0]]) == set(opt_theirs.state[theirs[0]])


def test_bf16_adamw_keeps_updates_smaller_than_a_bfloat16_step() -> None:
    """lr 1e-6 on weights of 0.02 (bfloat16 step there: 1.2e-4): ten Adam steps of ~1e-6 each."""
    results = {}
    for name, optimizer_class in (("ours", BFloat16AdamW), ("torch", torch.optim.AdamW)):
        weight = torch.full((200_000,), 0.02, dtype=torch.bfloat16, requires_grad=True)
        optimizer = optimizer_class([weight], lr=1e-6, weight_decay=0.0)
        for _ in range(10):
            weight.grad = torch.ones_like(weight)
            optimizer.step()
        results[name] = float(weight.detach().double().mean()) - float(torch.tensor(0.02, dtype=torch.bfloat16))
    assert results["torch"] == 0.0  # round to nearest: every update lost
    assert results["ours"] == pytest.approx(-1e-5, rel=0.05)


def test_stochastic_rounding_is_exact_in_expectation() -> None:
    value = torch.full((100_000,), 1.0 + 2**-10, dtype=torch.float32)  # 1/8 of a bfloat16 step above 1
    target = torch.empty_like(value, dtype=torch.bfloat16)
    round_stochastic_(target, value, torch.Generator().manual_seed(0))
    assert set(target.unique().tolist()) == {1.0, 1.0 + 2**-7}
    assert float(target.double().mean()) == pytest.approx(1.0 + 2**-10, abs=2**-7 * 0.01)
    negative = torch.empty_like(target)
    round_stochastic_(negative, -value, torch.Generator().manual_seed(0))
    assert torch.equal(negative, -target)
