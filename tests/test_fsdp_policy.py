"""FSDP2 / HSDP / TP on CPU with 2 gloo processes against single-process references.

One ``run_distributed`` call (process start-up dominates) runs every scenario; the tests below
each check one part of its result.

- FSDP (dp_shard=2) and HSDP (dp_replicate=2): two SFT steps (AdamW, warmup + cosine, clipping
  active) on unequal token counts per rank give the losses, gradient norms and parameters of one
  process training on both ranks' batches with a global token mean (FSDP with the fused SFT loss
  of examples/sft.py, HSDP and the reference with the general log-prob head).
- TP (tp=2): logits of the tensor-parallel Qwen2 equal the unsharded model's; a TP(+FSDP) policy
  gives the same log-probs and the same total gradient norm.
- Qwen2.5-VL and Qwen3-VL (tied head as Cosmos-Reason2-2B, untied as -8B) with a frozen vision
  tower: FSDP units cover every decoder layer and vision block, log-probs with an image match the
  unsharded model, the vision tower gets no gradient.
- TP (tp=2) of the same VL models: the text decoder's layers are split, log-probs with an image
  (deepstack features added to Qwen3-VL's first decoder layer) match the unsharded model.
- bf16 compute: master weights stay float32, log-probs close to float32.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives.algo.sft_objective import sft_loss, sft_token_weights
from cosmos_primitives.config.policy import ParallelismConfig, PolicyConfig
from cosmos_primitives.config.train import TrainConfig

STEPS = 2
CLIP = 0.5
TRAIN = TrainConfig(optm_lr=1e-3, optm_warmup_steps=1, optm_decay_type="cosine", max_steps=3,
                    optm_weight_decay=0.1, optm_grad_norm_clip=CLIP)
WATCHED = ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight",
           "model.layers.0.self_attn.q_proj.bias", "model.norm.weight")


def rank_batches() -> list[dict[str, torch.Tensor]]:
    """Rank 0 trains 6 tokens, rank 1 trains 17: a per-rank mean would weight them very differently."""
    g = torch.Generator().manual_seed(7)
    batches = []
    for trained_per_row in ((3, 3), (10, 7)):
        ids = torch.randint(0, 3000, (2, 11), generator=g)
        labels = torch.full_like(ids, -100)
        for row, n in enumerate(trained_per_row):
            labels[row, -n:] = ids[row, -n:]
        batches.append({"input_ids": ids, "labels": labels})
    return batches


def _train(policy, batches_per_step, group=None, token_count=None, fused=False):
    """``fused``: the loss's gradient computed in the LM head's forward (what examples/sft.py runs)."""
    optimizer = cp.policy.build_optimizer(policy, TRAIN)
    scheduler = cp.policy.build_lr_scheduler(optimizer, TRAIN)
    losses, norms = [], []
    for _ in range(STEPS):
        step_loss = 0.0
        for batch in batches_per_step:
            weights = sft_token_weights(batch["labels"], group=group, token_count=token_count) if fused else None
            out = cp.policy.token_logprobs(policy, batch, loss_weights=weights)
            loss, stats = sft_loss(out.logprobs, batch["labels"], group=group, token_count=token_count,
                                   weighted_sum=out.weighted_sum)
            loss.backward()
            step_loss += float(stats["loss"]) if token_count is None else float(loss.detach())
        norms.append(float(cp.parallel.clip_grad_norm_(policy.parameters(), CLIP)))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(step_loss)
    return losses, norms


def _full(param: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return (param.full_tensor() if isinstance(param, DTensor) else param).detach().clone()


# VL variants: (builder, config kwargs)
VL_VARIANTS = {
    "qwen2_5_vl": (cp.testing.tiny_qwen2_5_vl, {}),
    "qwen3_vl_tied": (cp.testing.tiny_qwen3_vl, {}),
    "qwen3_vl_untied": (cp.testing.tiny_qwen3_vl, {"tie_word_embeddings": False}),
}


def _vl_batch(variant: str) -> dict[str, torch.Tensor]:
    """One image in a short prompt + answer, as the variant's vision tower takes it."""
    from test_policy_model import image_batch

    if variant == "qwen2_5_vl":
        return image_batch(seed=1)
    return image_batch(seed=1, patch_size=16, token_types=True)


def _worker(text_dir: str, vl_dirs: dict[str, str]) -> dict:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    rank = dist.get_rank()
    batch = rank_batches()[rank]
    result: dict = {}

    for name, sizes in (("fsdp", dict(dp_shard_size=2)), ("hsdp", dict(dp_replicate_size=2, dp_shard_size=1))):
        parallelism = ParallelismConfig(**sizes)
        mesh = cp.parallel.ParallelMesh(parallelism, device_type="cpu")
        cfg = PolicyConfig(model_name_or_path=text_dir, dtype="float32", parallelism=parallelism,
                           model_gradient_checkpointing=(name == "fsdp"))
        policy = cp.policy.build_policy(cfg, mesh)
        hf = policy.hf_model
        result[f"{name}_tied"] = hf.lm_head.weight is hf.model.embed_tokens.weight
        result[f"{name}_placements"] = str(hf.model.layers[0].mlp.up_proj.weight.placements)
        losses, norms = _train(policy, [batch], group=mesh.group("dp"), fused=(name == "fsdp"))
        params = dict(hf.named_parameters())
        result[name] = {"losses": losses, "norms": norms, "params": {n: _full(params[n]) for n in WATCHED}}

    # TP: plain HF model with the TP plan -> logits; tp ranks must see the same tokens
    batch = rank_batches()[0]
    tp_par = ParallelismConfig(tp_size=2, dp_shard_size=1)
    tp_mesh = cp.parallel.ParallelMesh(tp_par, device_type="cpu")
    hf_tp = cp.policy.load_hf_model(text_dir, dtype="float32")
    result["tp_layers"] = cp.models.apply_tensor_parallel(hf_tp, tp_mesh["tp"])
    q = hf_tp.model.layers[0].self_attn.q_proj.weight
    result["tp_q_local_shape"] = tuple(q.to_local().shape) if isinstance(q, DTensor) else None
    with torch.no_grad():
        result["tp_logits"] = hf_tp(input_ids=batch["input_ids"], use_cache=False).logits
    # TP + FSDP(dp_shard=1) policy: log-probs and a 2-D DTensor gradient norm
    policy = cp.policy.build_policy(PolicyConfig(model_name_or_path=text_dir, dtype="float32", parallelism=tp_par),
                                    tp_mesh)
    out = cp.policy.token_logprobs(policy, batch)
    sft_loss(out.logprobs, batch["labels"], group=tp_mesh.group("dp"))[0].backward()
    result["tp_logprobs"] = out.logprobs.detach()
    result["tp_norm"] = float(cp.parallel.total_grad_norm(policy.parameters()))
    batch = rank_batches()[rank]

    # VL models, frozen vision tower, FSDP over 2 ranks, both ranks on the same image batch; then TP=2
    mesh = cp.parallel.ParallelMesh(ParallelismConfig(dp_shard_size=2), device_type="cpu")
    for variant, vl_dir in vl_dirs.items():
        cfg = PolicyConfig(model_name_or_path=vl_dir, dtype="float32", freeze_patterns=[r"^model\.visual\."])
        policy = cp.policy.build_policy(cfg, mesh)
        vl: dict = {"units": cp.parallel.fsdp_units(policy)}
        out = cp.policy.token_logprobs(policy, _vl_batch(variant))
        out.logprobs.sum().backward()
        vl["logprobs"] = out.logprobs.detach()
        vl["visual_grads"] = sum(p.grad is not None for n, p in policy.named_parameters() if ".visual." in n)
        vl["lm_grads"] = sum(p.grad is not None for n, p in policy.named_parameters() if ".language_model." in n)
        hf_tp = cp.policy.load_hf_model(vl_dir, dtype="float32")
        vl["tp_layers"] = cp.models.apply_tensor_parallel(hf_tp, tp_mesh["tp"])
        q = hf_tp.model.language_model.layers[0].self_attn.q_proj.weight
        vl["tp_q_local_shape"] = tuple(q.to_local().shape) if isinstance(q, DTensor) else None
        vl["tp_logprobs"] = cp.policy.token_logprobs(hf_tp, _vl_batch(variant)).logprobs.detach()
        result[f"vl:{variant}"] = vl

    # bf16 compute through FSDP mixed precision
    cfg = PolicyConfig(model_name_or_path=text_dir, dtype="bfloat16", parallelism=ParallelismConfig(dp_shard_size=2))
    policy = cp.policy.build_policy(cfg, mesh)
    result["bf16_param_dtypes"] = sorted({str(p.dtype) for p in policy.parameters()})
    result["bf16_logprobs"] = cp.policy.token_logprobs(policy, batch).logprobs.detach()

    # bf16 master weights ([train] master_dtype, cosmos-rl's key)
    cfg = PolicyConfig(model_name_or_path=text_dir, dtype="bfloat16", parallelism=ParallelismConfig(dp_shard_size=2))
    policy = cp.policy.build_policy(cfg, mesh, train=TrainConfig(master_dtype="bfloat16"))
    result["bf16_master_param_dtypes"] = sorted({str(p.dtype) for p in policy.parameters()})
    out = cp.policy.token_logprobs(policy, batch)
    out.logprobs.sum().backward()
    result["bf16_master_grad_dtypes"] = sorted({str(p.grad.dtype) for p in policy.parameters() if p.grad is not None})
    return result


@pytest.fixture(scope="module")
def runs(tiny_qwen2_dir: Path, tiny_vl_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    vl_dirs = {"qwen2_5_vl": str(tiny_vl_dir)}
    for variant in ("qwen3_vl_tied", "qwen3_vl_untied"):
        build, kwargs = VL_VARIANTS[variant]
        folder = tmp_path_factory.mktemp(variant)
        build(seed=0, **kwargs).save_pretrained(folder)
        vl_dirs[variant] = str(folder)
    results = cp.testing.run_distributed(_worker, 2, args=(str(tiny_qwen2_dir), vl_dirs),
                                         env={"PYTHONPATH": str(Path(__file__).parent)})
    return {"ranks": results, "text_dir": str(tiny_qwen2_dir), "vl_dirs": vl_dirs}


@pytest.fixture(scope="module")
def single_process(runs: dict) -> dict:
    """Both ranks' batches on one process, loss = global token mean."""
    policy = cp.policy.build_policy(PolicyConfig(model_name_or_path=runs["text_dir"], dtype="float32"))
    batches = rank_batches()
    total = sum(int(sft_loss(torch.zeros(b["labels"].shape), b["labels"])[1]["tokens"]) for b in batches)
    losses, norms = _train(policy, batches, token_count=total)
    params = dict(policy.hf_model.named_parameters())
    return {"losses": losses, "norms": norms, "params": {n: params[n].detach().clone() for n in WATCHED},
            "policy": cp.policy.build_policy(PolicyConfig(model_name_or_path=runs["text_dir"], dtype="float32"))}


@pytest.mark.parametrize("layout", ["fsdp", "hsdp"])
def test_sharded_sft_steps_match_one_process(runs: dict, single_process: dict, layout: str) -> None:
    for rank_result in runs["ranks"]:
        got = rank_result[layout]
        assert rank_result[f"{layout}_tied"], "tied lm_head / embed_tokens must stay one parameter"
        torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(single_process["losses"]),
                                   atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(torch.tensor(got["norms"]), torch.tensor(single_process["norms"]),
                                   atol=1e-5, rtol=1e-5)
        assert all(n > CLIP for n in got["norms"]), "the test needs clipping to be active"
        for name in WATCHED:
            torch.testing.assert_close(got["params"][name], single_process["params"][name], atol=2e-6, rtol=1e-5,
                                       msg=f"{layout} {name}")
    placements = runs["ranks"][0][f"{layout}_placements"]
    assert placements == ("(Shard(dim=0),)" if layout == "fsdp" else "(Replicate(), Shard(dim=0))")


def test_tensor_parallel_logits_and_logprobs_match_unsharded(runs: dict, single_process: dict) -> None:
    reference = single_process["policy"]
    batch = rank_batches()[0]
    with torch.no_grad():
        logits = reference.hf_model(input_ids=batch["input_ids"], use_cache=False).logits
    for rank_result in runs["ranks"]:
        assert rank_result["tp_layers"] == 2
        assert rank_result["tp_q_local_shape"] == (32, 64)  # 4 heads x 16 -> 2 heads per rank
        torch.testing.assert_close(rank_result["tp_logits"], logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(rank_result["tp_logprobs"], cp.policy.token_logprobs(reference, batch).logprobs,
                                   atol=1e-5, rtol=1e-5)
    # the 2-D (dp_shard x tp) DTensor gradient norm equals the unsharded model's on that batch
    reference.zero_grad()
    sft_loss(cp.policy.token_logprobs(reference, batch).logprobs, batch["labels"])[0].backward()
    expected = torch.nn.utils.get_total_norm([p.grad for p in reference.parameters()])
    assert runs["ranks"][0]["tp_norm"] == pytest.approx(float(expected), rel=1e-5)


@pytest.mark.parametrize("variant", sorted(VL_VARIANTS))
def test_vl_fsdp_units_frozen_vision_and_logprobs(runs: dict, variant: str) -> None:
    result = runs["ranks"][0][f"vl:{variant}"]
    units = result["units"]
    assert "" in units
    assert {u for u in units if ".language_model.layers." in u} == {f"hf_model.model.language_model.layers.{i}"
                                                                     for i in range(2)}
    assert {u for u in units if ".visual.blocks." in u} == {f"hf_model.model.visual.blocks.{i}" for i in range(2)}
    assert result["visual_grads"] == 0 and result["lm_grads"] > 0
    hf = cp.policy.load_hf_model(runs["vl_dirs"][variant], dtype="float32")
    expected = cp.policy.token_logprobs(hf, _vl_batch(variant)).logprobs
    for rank_result in runs["ranks"]:
        torch.testing.assert_close(rank_result[f"vl:{variant}"]["logprobs"], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", sorted(VL_VARIANTS))
def test_vl_tensor_parallel_logprobs_match_unsharded(runs: dict, variant: str) -> None:
    """TP=2 over a VL model's text decoder: both layers split (2 of 4 heads per rank), the image's
    log-probs those of the unsharded model."""
    hf = cp.policy.load_hf_model(runs["vl_dirs"][variant], dtype="float32")
    expected = cp.policy.token_logprobs(hf, _vl_batch(variant)).logprobs
    assert expected[0, 10:].abs().min() > 0  # the answer tokens are scored
    for rank_result in runs["ranks"]:
        result = rank_result[f"vl:{variant}"]
        assert result["tp_layers"] == 2 and result["tp_q_local_shape"] == (32, 64)
        torch.testing.assert_close(result["tp_logprobs"], expected, atol=1e-5, rtol=1e-5)


def test_master_dtype_sets_the_stored_weights(runs: dict) -> None:
    result = runs["ranks"][0]
    assert result["bf16_master_param_dtypes"] == ["torch.bfloat16"]
    assert result["bf16_master_grad_dtypes"] == ["torch.bfloat16"]


def test_bf16_compute_keeps_float32_master_weights(runs: dict, single_process: dict) -> None:
    result = runs["ranks"][0]
    assert result["bf16_param_dtypes"] == ["torch.float32"]
    batch = rank_batches()[0]
    expected = cp.policy.token_logprobs(single_process["policy"], batch).logprobs
    scored = batch["labels"] != -100
    diff = (result["bf16_logprobs"] - expected)[scored].abs().max()
    assert 0 < diff < 0.1, "bf16 compute must differ from float32 a little, and only a little"
