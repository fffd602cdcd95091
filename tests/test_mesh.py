"""The device mesh over real gloo process groups."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from cosmos_primitives.config import ParallelismConfig
from cosmos_primitives.parallel import MeshError, ParallelMesh, init_distributed
from cosmos_primitives.parallel.mesh import resolve_sizes
from cosmos_primitives.testing import run_distributed


def _mesh_facts(dp_replicate: int, dp_shard: int) -> dict:
    mesh = ParallelMesh(ParallelismConfig(dp_replicate_size=dp_replicate, dp_shard_size=dp_shard), "cpu")
    rank = dist.get_rank()
    # sum of global ranks within each group proves which ranks share it
    facts = {"rank": rank, "repr": repr(mesh)}
    for name in ("dp", "dp_shard", "dp_replicate", "tp"):
        value = torch.tensor([float(rank)])
        dist.all_reduce(value, group=mesh.group(name))
        facts[name] = (mesh.size(name), mesh.local_rank(name), value.item())
    facts["fsdp_mesh_ndim"] = mesh.fsdp_mesh.ndim
    return facts


def test_dp_shard_2_in_two_processes() -> None:
    facts = run_distributed(_mesh_facts, 2, args=(1, 2))
    for rank, f in enumerate(facts):
        assert f["dp_shard"] == (2, rank, 1.0)  # ranks 0 and 1 share the shard group
        assert f["dp"] == (2, rank, 1.0)
        assert f["dp_replicate"] == (1, 0, float(rank))
        assert f["tp"] == (1, 0, float(rank))
        assert f["fsdp_mesh_ndim"] == 1


def test_inferred_dp_shard_in_two_processes() -> None:
    facts = run_distributed(_mesh_facts, 2, args=(1, -1))
    assert [f["dp_shard"][0] for f in facts] == [2, 2]


def test_dp_replicate_times_dp_shard_in_two_processes() -> None:
    facts = run_distributed(_mesh_facts, 2, args=(2, 1))
    for rank, f in enumerate(facts):
        assert f["dp_replicate"] == (2, rank, 1.0)
        assert f["dp_shard"] == (1, 0, float(rank))
        assert f["dp"] == (2, rank, 1.0)
        assert f["fsdp_mesh_ndim"] == 2  # HSDP


def test_hsdp_2x2_in_four_processes() -> None:
    facts = run_distributed(_mesh_facts, 4, args=(2, 2))
    for rank, f in enumerate(facts):
        replica, shard = divmod(rank, 2)
        assert f["dp_shard"] == (2, shard, float(2 * replica + 2 * replica + 1))
        assert f["dp_replicate"] == (2, replica, float(shard + shard + 2))
        assert f["dp"] == (4, rank, 6.0)


def _bad_mesh() -> str:
    try:
        ParallelMesh(ParallelismConfig(dp_shard_size=3), "cpu")
    except MeshError as exc:
        return str(exc)
    return "no error"


def test_bad_sizes_raise_in_two_processes() -> None:
    messages = run_distributed(_bad_mesh, 2)
    for message in messages:
        assert "multiply to 3" in message and "world size is 2" in message and "dp_shard_size=3" in message


@pytest.mark.parametrize(
    ("sizes", "world", "fragment"),
    [
        ({"dp_shard_size": 2, "tp_size": 2}, 2, "multiply to 4 but the world size is 2"),
        ({"dp_shard_size": -1, "tp_size": 3}, 4, r"not divisible by pp\*dp_replicate\*cp\*tp = 3"),
        ({"tp_size": 0}, 2, "tp_size=0"),
        ({"tp_size": -1}, 2, "tp_size=-1"),
    ],
)
def test_resolve_sizes_errors(sizes: dict, world: int, fragment: str) -> None:
    with pytest.raises(MeshError, match=fragment):
        resolve_sizes(ParallelismConfig(**sizes), world)


def test_resolve_sizes_infers_dp_shard() -> None:
    sizes = resolve_sizes(ParallelismConfig(dp_replicate_size=2, tp_size=2), 8)
    assert sizes == {"pp": 1, "dp_replicate": 2, "dp_shard": 2, "cp": 1, "tp": 2}


def test_single_process_without_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    # a plain `python` process gets a one-rank group, so the same code runs unchanged
    code = (
        "from cosmos_primitives.parallel import init_distributed, ParallelMesh\n"
        "from cosmos_primitives.config import ParallelismConfig\n"
        "info = init_distributed()\n"
        "mesh = ParallelMesh(ParallelismConfig(), 'cpu')\n"
        "print(info.rank, info.world_size, info.backend, mesh.size('dp_shard'))\n"
    )
    import subprocess
    import sys

    env = {k: v for k, v in __import__("os").environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    env["COSMOS_DEVICE"] = "cpu"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "1", "gloo", "1"]


def _raise_on_rank1() -> None:
    if dist.get_rank() == 1:
        raise ValueError("boom on rank 1")


def test_run_distributed_reports_the_failing_rank() -> None:
    with pytest.raises(RuntimeError, match=r"(?s)rank 1.*ValueError: boom on rank 1"):
        run_distributed(_raise_on_rank1, 2, timeout_s=120)


def test_init_distributed_is_idempotent_in_process() -> None:
    # the test process itself has no group; run in a child to keep this process clean
    assert run_distributed(_init_twice, 1) == [(0, 1)]


def _init_twice() -> tuple[int, int]:
    a = init_distributed()
    b = init_distributed()
    assert a == b
    return a.rank, a.world_size


def _return_tensor() -> torch.Tensor:
    return torch.full((1000,), float(dist.get_rank()))


def test_run_distributed_returns_tensors_after_children_exit() -> None:
    a, b = run_distributed(_return_tensor, 2)
    assert torch.equal(a, torch.zeros(1000)) and torch.equal(b, torch.ones(1000))


def _where_started() -> tuple[int, str | None, bool]:
    import sys

    return os.getppid(), os.environ.get("CP_RUN_DISTRIBUTED_PROBE"), "transformers" in sys.modules


def test_run_distributed_forks_ranks_from_a_preloaded_server_with_the_callers_environment(monkeypatch) -> None:
    """The ranks are forked from a server that imported torch and transformers once (a spawned
    interpreter imports them afresh per rank: most of a short distributed test's CPU time); each
    still gets the caller's environment as it is at the call, not the server's."""
    run_distributed(_return_tensor, 1)  # the server is running from here on
    monkeypatch.setenv("CP_RUN_DISTRIBUTED_PROBE", "set after the server started")
    forked = run_distributed(_where_started, 2)
    assert all(parent != os.getpid() for parent, _, _ in forked)  # the fork server's children
    assert all(loaded for _, _, loaded in forked)  # transformers came preloaded, not imported by the rank
    assert {probe for _, probe, _ in forked} == {"set after the server started"}
    spawned = run_distributed(_where_started, 1, start_method="spawn")
    assert spawned[0][0] == os.getpid() and spawned[0][1] == "set after the server started"
    assert not spawned[0][2]
    with pytest.raises(ValueError, match="start_method"):
        run_distributed(_where_started, 1, start_method="fork")
