"""Why ``parallel.clip_grad_norm_`` is kept beside torch's DTensor-aware one (docs/torchtitan.md).

Over 2 gloo ranks with FSDP2: on all-DTensor gradients ours and ``torch.nn.utils.clip_grad_norm_``
(what torchtitan's ``clip_grad_norm_`` calls) give the same norm; with one parameter left out of FSDP
(a plain tensor beside DTensors) torch's raises while ours gives the norm of the gathered gradients.
If a torch upgrade accepts the mixed case, this test fails and the table's reason must be revisited.
"""

from __future__ import annotations

import pytest
import torch

import cosmos_primitives as cp


def _model(plain_last: bool) -> torch.nn.Module:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(3)])
    for unit in list(model)[:-1] if plain_last else list(model):
        fully_shard(unit, mesh=mesh)
    torch.manual_seed(1 + dist.get_rank())
    model(torch.randn(4, 16)).square().mean().backward()
    if plain_last:
        # the unsharded layer's gradient made equal on both ranks, as a replicated piece's would be
        for p in model[-1].parameters():
            dist.all_reduce(p.grad)
            p.grad /= 2
    return model


def _gathered_norm(model: torch.nn.Module, norm_type: float) -> float:
    grads = [(p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).double() for p in model.parameters()]
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, norm_type) for g in grads]),
                                          norm_type))


def _worker() -> dict:
    result: dict = {}
    for norm_type in (2.0, float("inf")):
        model = _model(plain_last=False)
        ours = float(cp.parallel.clip_grad_norm_(model.parameters(), 1e9, norm_type))
        theirs = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9, norm_type)
        result[f"fsdp {norm_type}"] = (ours, float(theirs.full_tensor()), _gathered_norm(model, norm_type))
        model = _model(plain_last=True)
        reference = _gathered_norm(model, norm_type)
        ours = float(cp.parallel.clip_grad_norm_(model.parameters(), 1e9, norm_type))
        try:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9, norm_type)
            torch_error = ""
        except RuntimeError as exc:
            torch_error = str(exc)
        result[f"mixed {norm_type}"] = (ours, reference, torch_error)
    return result


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return cp.testing.run_distributed(_worker, 2)


def test_same_norm_as_torch_on_fsdp_gradients(ranks: list[dict]) -> None:
    for result in ranks:
        for norm_type in (2.0, float("inf")):
            ours, theirs, gathered = result[f"fsdp {norm_type}"]
            assert ours == pytest.approx(theirs, rel=1e-6)
            assert ours == pytest.approx(gathered, rel=1e-6)


def test_torch_rejects_plain_tensors_beside_dtensors_ours_does_not(ranks: list[dict]) -> None:
    for result in ranks:
        for norm_type in (2.0, float("inf")):
            ours, gathered, torch_error = result[f"mixed {norm_type}"]
            assert ours == pytest.approx(gathered, rel=1e-6)
            assert "mixed torch.Tensor and DTensor" in torch_error, (
                "torch's clip_grad_norm_ now accepts plain tensors beside DTensors: revisit the "
                "clip_grad_norm_ row of docs/torchtitan.md (adopting torch's may now be possible)")
