"""Checkpoints and exports of FSDP2-sharded models in two gloo processes.

Both scenarios run in one pair of processes (a module fixture), since starting them costs more than
the work itself; each test then checks its own part of the results.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

from cosmos_primitives.checkpoint import CheckpointManager, export_safetensors
from cosmos_primitives.config import CheckpointConfig
from cosmos_primitives.testing import run_distributed, tiny_qwen2_5_vl, tiny_qwen2_5_vl_processor


def _mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))


def _sharded_setup(seed: int):
    model = _mlp(seed)  # same seed on every rank: FSDP2 shards what each rank holds
    for layer in (model[0], model[3], model[5]):
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.5, total_iters=5)
    return model, optimizer, scheduler


def _train_step(model: nn.Module, optimizer, scheduler) -> float:
    x = torch.randn(4, 8)  # per-rank RNG stream: each rank sees different data
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    return loss.item()


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _save_then_resume(run_dir: str) -> dict:
    rank = dist.get_rank()
    cfg = CheckpointConfig(enable_checkpoint=True, save_mode="async", save_freq=2, max_keep=-1,
                           export_safetensors=False)
    model, optimizer, scheduler = _sharded_setup(seed=0)
    torch.manual_seed(100 + rank)
    ckpt = CheckpointManager(cfg, run_dir, model=model, optimizer=optimizer, scheduler=scheduler)
    for step in (1, 2):
        _train_step(model, optimizer, scheduler)
        ckpt.maybe_save(step, weight_version=step)
    # what step_2 must hold, gathered to full tensors while the background save runs
    saved_params = {k: _full(v).numpy().copy() for k, v in model.state_dict().items()}
    saved_moments = {name: _full(optimizer.state[p]["exp_avg"]).numpy().copy() for name, p in model.named_parameters()}
    after = [_train_step(model, optimizer, scheduler) for _ in range(3)]
    ckpt.close()

    model2, optimizer2, scheduler2 = _sharded_setup(seed=7)
    torch.manual_seed(999)
    resumed_ckpt = CheckpointManager(cfg, run_dir, model=model2, optimizer=optimizer2, scheduler=scheduler2)
    state = resumed_ckpt.resume(True)
    resumed = [_train_step(model2, optimizer2, scheduler2) for _ in range(3)]
    resumed_ckpt.close()
    local_shard = next(iter(model2.parameters())).to_local().shape
    return {
        "rank": rank,
        "step": state.step,
        "after": after,
        "resumed": resumed,
        "local_shard": tuple(local_shard),
        "saved_params": saved_params if rank == 0 else None,
        "saved_moments": saved_moments if rank == 0 else None,
    }


def _both(run_dir: str, export_dir: str) -> dict:
    return {"ckpt": _save_then_resume(run_dir), "export": _export_sharded_vl(export_dir)}


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("sharded")
    run_dir, export_dir = root / "20260101000000", root / "safetensors" / "final"
    results = run_distributed(_both, 2, args=(str(run_dir), str(export_dir)))
    return {"run_dir": run_dir, "export_dir": export_dir, "ckpt": [r["ckpt"] for r in results],
            "export": [r["export"] for r in results]}


def test_fsdp2_sharded_save_resume_and_reload_into_one_process(sharded: dict) -> None:
    run_dir, results = sharded["run_dir"], sharded["ckpt"]
    for r in results:
        assert r["step"] == 2
        assert r["resumed"] == r["after"]  # bitwise, per rank
        assert r["local_shard"] == (16, 8)  # really sharded: half of the [32, 8] weight per rank
    assert results[0]["after"] != results[1]["after"]  # the ranks' RNG streams were restored separately
    step2 = run_dir / "checkpoints" / "step_2"
    assert sorted(p.name for p in step2.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]

    # the same checkpoint loads into a plain, unsharded model in this single process
    model = _mlp(seed=3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.5, total_iters=5)
    cfg = CheckpointConfig(enable_checkpoint=True, save_mode="sync", export_safetensors=False)
    state = CheckpointManager(cfg, run_dir, model=model, optimizer=optimizer, scheduler=scheduler).load(step2)
    assert (state.step, state.weight_version, state.world_size) == (2, 2, 2)
    for name, value in model.state_dict().items():
        assert torch.equal(value, torch.from_numpy(results[0]["saved_params"][name])), name
    for name, p in model.named_parameters():
        assert torch.equal(optimizer.state[p]["exp_avg"], torch.from_numpy(results[0]["saved_moments"][name])), name
    assert scheduler.last_epoch == 2


def _export_sharded_vl(out_dir: str) -> dict:
    rank = dist.get_rank()
    model = tiny_qwen2_5_vl(seed=3)
    with torch.no_grad():  # move away from the seed's init so that a wrong export cannot pass
        model.model.language_model.layers[0].mlp.up_proj.weight.mul_(-2.0)
    for layer in model.model.language_model.layers:
        fully_shard(layer)
    fully_shard(model)
    processor = tiny_qwen2_5_vl_processor() if rank == 0 else None
    path = export_safetensors(model, out_dir, processor=processor, max_shard_size_gb=0.001)
    ids = torch.arange(100, 116).unsqueeze(0)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    # numpy, not tensors: torch's queue pickling shares tensor memory with a process that may have exited
    return {"path": str(path), "logits": logits.numpy() if rank == 0 else None}


def test_export_from_fsdp2_in_two_processes(sharded: dict) -> None:
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    out, results = sharded["export_dir"], sharded["export"]
    assert [r["path"] for r in results] == [str(out), str(out)]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 2
    assert "lm_head.weight" not in index["weight_map"]  # tied to the embeddings
    assert "model.layers.0.mlp.up_proj.weight" in index["weight_map"]  # on-disk names, not language_model.*
    for name in ("config.json", "generation_config.json", "preprocessor_config.json", "chat_template.json",
                 "tokenizer.json", "tokenizer_config.json"):
        assert (out / name).is_file(), name
    assert not out.with_name("final.tmp").exists()

    loaded = Qwen2_5_VLForConditionalGeneration.from_pretrained(out)
    with torch.no_grad():
        logits = loaded(input_ids=torch.arange(100, 116).unsqueeze(0)).logits
    torch.testing.assert_close(logits, torch.from_numpy(results[0]["logits"]), rtol=1e-5, atol=1e-5)
    assert AutoProcessor.from_pretrained(out).tokenizer.encode("hello") == tiny_qwen2_5_vl_processor().tokenizer.encode(
        "hello")


def _save_among_two_of_three(run_dir: str) -> dict:
    """Ranks 1 and 2 (a FSDP2 mesh of their own) checkpoint among themselves while rank 0 idles
    (``CheckpointManager(process_group=...)``)."""
    from torch.distributed.device_mesh import DeviceMesh

    rank = dist.get_rank()
    members = [1, 2]
    mesh = DeviceMesh("cpu", torch.tensor(members), mesh_dim_names=("dp_shard",))  # collective: every rank
    group, gloo = dist.new_group(members), dist.new_group(members, backend="gloo")  # likewise
    result: dict = {"rank": rank}
    if rank in members:
        def setup(seed: int):
            model = _mlp(seed)
            for layer in (model[0], model[3], model[5]):
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            return model, torch.optim.AdamW(model.parameters(), lr=1e-2)

        cfg = CheckpointConfig(enable_checkpoint=True, save_mode="async", export_safetensors=False)
        model, optimizer = setup(0)
        torch.manual_seed(rank)
        ckpt = CheckpointManager(cfg, run_dir, model=model, optimizer=optimizer, process_group=group,
                                 async_group=gloo)
        _train_step(model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0))
        ckpt.save(1)
        ckpt.close()
        saved = {k: _full(v).detach().clone() for k, v in model.state_dict().items()}
        other, other_optimizer = setup(5)
        resumed = CheckpointManager(cfg, run_dir, model=other, optimizer=other_optimizer, process_group=group,
                                    async_group=gloo)
        state = resumed.resume(True)
        result.update(step=state.step, world=state.world_size, same=all(
            torch.equal(_full(v), saved[k]) for k, v in other.state_dict().items()))
        resumed.close()
    dist.barrier()
    return result


def test_a_subset_of_ranks_saves_and_resumes_while_the_others_idle(tmp_path) -> None:
    run_dir = tmp_path / "20260101000000"
    results = run_distributed(_save_among_two_of_three, 3, args=(str(run_dir),))
    assert results[0] == {"rank": 0}
    for r in results[1:]:
        assert (r["step"], r["world"], r["same"]) == (1, 2, True)
    step1 = run_dir / "checkpoints" / "step_1"
    assert sorted(p.name for p in step1.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]


def test_each_rank_writes_a_checksum_manifest_for_its_own_shards(sharded: dict, tmp_path) -> None:
    import shutil

    from cosmos_primitives.checkpoint import verify_checkpoint

    step2 = sharded["run_dir"] / "checkpoints" / "step_2"
    covered = {r: set(json.loads((step2 / f"MANIFEST_rank{r}.json").read_text())["files"]) for r in (0, 1)}
    assert covered == {0: {"__0_0.distcp", ".metadata"}, 1: {"__1_0.distcp"}}  # async save, two ranks
    assert verify_checkpoint(step2).ok

    copy = tmp_path / "step_2"
    shutil.copytree(step2, copy)
    with open(copy / "__1_0.distcp", "r+b") as f:  # rank 1's shard: same size, other bytes
        f.seek(100)
        f.write(b"\x00\xff" * 8)
    check = verify_checkpoint(copy)
    assert not check.ok and check.problems == ["__1_0.distcp: SHA-256 differs from the manifest (bytes changed "
                                               "after the save)"]
