"""AdamW parameter groups, warmup + decay schedules with exact resume, gradient clipping."""

from __future__ import annotations

import copy
import itertools
import math

import msgspec
import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives.config.train import TrainConfig
from cosmos_primitives.policy.optim import BFloat16AdamW, lr_factor


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))


def _lrs(scheduler, optimizer, steps: int) -> list[float]:
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


def test_schedule_shapes() -> None:
    train = TrainConfig(optm_lr=1.0, optm_warmup_steps=4, optm_decay_type="cosine", optm_min_lr_factor=0.1,
                        max_steps=14)
    optimizer = cp.policy.build_optimizer(_model(), train)
    lrs = _lrs(cp.policy.build_lr_scheduler(optimizer, train), optimizer, 16)
    # cosmos-rl's warmup: step / (W - 1) from 0, the peak at step W - 1
    assert lrs[:4] == pytest.approx([0.0, 1 / 3, 2 / 3, 1.0])
    assert lrs[4] == pytest.approx(1.0)
    # the floor is reached one step after the last (14) and kept
    assert lrs[13] > 0.1 and lrs[14] == pytest.approx(0.1) and lrs[15] == pytest.approx(0.1)
    # half way through the decay, cosine gives the mean of peak and floor
    mid = lr_factor(9, warmup_steps=4, total_steps=14, decay_type="cosine", min_lr_factor=0.1)
    assert mid == pytest.approx(0.55)
    assert all(a >= b for a, b in itertools.pairwise(lrs[4:]))

    linear = [lr_factor(s, warmup_steps=0, total_steps=4, decay_type="linear", min_lr_factor=0.0)
              for s in range(6)]
    assert linear == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0, 0.0])
    constant = [lr_factor(s, warmup_steps=3, total_steps=None, decay_type="constant", min_lr_factor=0.0)
                for s in range(4)]
    assert constant == pytest.approx([0.0, 0.5, 1.0, 1.0])
    # a run shorter than its warmup still reaches the peak at its last step (warmup clamped)
    short = [lr_factor(s, warmup_steps=20, total_steps=5, decay_type="constant", min_lr_factor=0.0) for s in range(5)]
    assert short == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])


def test_schedule_is_cosmos_rl_s_step_by_step() -> None:
    """Every step's factor equals cosmos-rl 0.4.7's scheduler (``build_lr_schedulers``, written by
    ``scripts/fixtures_cosmos_rl_config.py``) for integer and fractional warmups, clamped warmups,
    every decay type and floors."""
    import json
    from pathlib import Path

    fixture = json.loads((Path(__file__).parent / "data" / "cosmos_rl_effective_config.json").read_text())
    assert len(fixture["lr_schedules"]) >= 10
    for case in fixture["lr_schedules"]:
        decay = {None: "constant", "none": "constant"}.get(case["decay_type"], case["decay_type"])
        train = TrainConfig(optm_lr=1.0, optm_warmup_steps=case["warmup_steps"], optm_decay_type=decay,
                            optm_min_lr_factor=case["min_lr_factor"])
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        scheduler = cp.policy.build_lr_scheduler(optimizer, train, total_steps=case["total_steps"])
        assert _lrs(scheduler, optimizer, case["total_steps"]) == pytest.approx(case["factors"], abs=1e-12), case


def test_scheduler_and_optimizer_resume_exactly() -> None:
    train = TrainConfig(optm_lr=1e-2, optm_warmup_steps=2, optm_decay_type="linear", max_steps=10)
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))

    def step(model, optimizer, scheduler):
        model(x).pow(2).mean().backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()

    model = _model()
    optimizer = cp.policy.build_optimizer(model, train)
    scheduler = cp.policy.build_lr_scheduler(optimizer, train)
    for _ in range(4):
        step(model, optimizer, scheduler)
    # deep copies: state_dict() hands out the live state tensors
    saved = copy.deepcopy((model.state_dict(), optimizer.state_dict(), scheduler.state_dict()))
    for _ in range(3):
        step(model, optimizer, scheduler)

    resumed = _model()
    resumed.load_state_dict(saved[0])
    optimizer2 = cp.policy.build_optimizer(resumed, train)
    scheduler2 = cp.policy.build_lr_scheduler(optimizer2, TrainConfig(optm_lr=5.0))  # settings come from the state
    optimizer2.load_state_dict(saved[1])
    scheduler2.load_state_dict(saved[2])
    assert scheduler2.decay_type == "linear" and scheduler2.last_epoch == 4
    for _ in range(3):
        step(resumed, optimizer2, scheduler2)
    for key, value in model.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[key]), key
    assert optimizer2.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]


def test_bfloat16_adamw_resumed_from_a_checkpoint_takes_the_same_next_step(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rounding-noise generator is saved per rank, so a resumed bfloat16 run continues bitwise."""
    from cosmos_primitives.checkpoint import CheckpointManager
    from cosmos_primitives.config import CheckpointConfig

    train = TrainConfig(optm_lr=1e-4, master_dtype="bfloat16", seed=3)
    cfg = CheckpointConfig(enable_checkpoint=True, save_mode="sync", export_safetensors=False)
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(1)).bfloat16()

    def build():
        model = _model().bfloat16()
        return model, cp.policy.build_optimizer(model, train)

    def step(model, optimizer) -> dict[str, torch.Tensor]:
        model(x).float().pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        return {k: v.clone() for k, v in model.state_dict().items()}

    model, optimizer = build()
    assert isinstance(optimizer, BFloat16AdamW)
    for _ in range(2):
        step(model, optimizer)
    CheckpointManager(cfg, tmp_path / "run", model=model, optimizer=optimizer).save(2)
    with monkeypatch.context() as patch:  # as written before the generator was saved
        patch.delattr(BFloat16AdamW, "rank_state_dict")
        CheckpointManager(cfg, tmp_path / "old", model=model, optimizer=optimizer).save(2)
    expected = step(model, optimizer)

    resumed, resumed_optimizer = build()
    CheckpointManager(cfg, tmp_path / "run", model=resumed, optimizer=resumed_optimizer).resume(True)
    got = step(resumed, resumed_optimizer)
    for key, value in expected.items():
        assert torch.equal(got[key], value), key

    # the older checkpoint still loads; its generator starts afresh, which rounds differently
    old, old_optimizer = build()
    CheckpointManager(cfg, tmp_path / "old", model=old, optimizer=old_optimizer).resume(True)
    afresh = step(old, old_optimizer)
    assert any(not torch.equal(afresh[k], v) for k, v in expected.items())


def test_weight_decay_groups_and_config_errors() -> None:
    model = _model()
    optimizer = cp.policy.build_optimizer(model, TrainConfig(optm_weight_decay=0.1, optm_betas=[0.8, 0.9]))
    decayed, plain = optimizer.param_groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert {p.ndim for p in decayed["params"]} == {2} and {p.ndim for p in plain["params"]} == {1}
    assert decayed["betas"] == (0.8, 0.9)
    with pytest.raises(ValueError, match="needs total_steps"):
        cp.policy.build_lr_scheduler(optimizer, TrainConfig(optm_decay_type="cosine"))
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        cp.policy.build_optimizer(model, TrainConfig())


@pytest.mark.parametrize("norm_type", [2.0, math.inf])
def test_clip_grad_norm_matches_torch_on_plain_tensors(norm_type: float) -> None:
    ours, theirs = _model(), _model()
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(2))
    for model in (ours, theirs):
        (model(x) * 10).pow(2).sum().backward()
    norm = cp.parallel.clip_grad_norm_(ours.parameters(), 0.3, norm_type)
    expected = torch.nn.utils.clip_grad_norm_(theirs.parameters(), 0.3, norm_type)
    torch.testing.assert_close(norm, expected)
    assert norm > 0.3
    for a, b in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(a.grad, b.grad)
    # disabled clipping reports the norm and leaves gradients alone
    before = [p.grad.clone() for p in ours.parameters()]
    cp.parallel.clip_grad_norm_(ours.parameters(), 0.0, norm_type)
    assert all(torch.equal(a, p.grad) for a, p in zip(before, ours.parameters()))


def _grads(model: torch.nn.Module, steps: int) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(5)
    return [[torch.randn(p.shape, generator=g) for p in model.parameters()] for _ in range(steps)]


def _run(model: torch.nn.Module, optimizer: torch.optim.Optimizer, grads: list[list[torch.Tensor]]) -> None:
    for step_grads in grads:
        for p, grad in zip(model.parameters(), step_grads):
            p.grad = grad.to(p.dtype)
        optimizer.step()


@pytest.mark.parametrize("impl", ["fused", "foreach", "for-loop"])
def test_optm_impl_picks_the_adamw_kernels_and_they_take_the_same_steps(impl: str) -> None:
    train = TrainConfig(optm_lr=1e-2, optm_weight_decay=0.1, optm_impl=impl)
    model = _model()
    optimizer = cp.policy.build_optimizer(model, train)
    assert [(g["fused"], g["foreach"]) for g in optimizer.param_groups] == [
        (impl == "fused", impl == "foreach")] * 2
    reference = _model()
    grads = _grads(model, 4)
    _run(model, optimizer, grads)
    # torch's own default on CPU tensors (one tensor at a time)
    _run(reference, torch.optim.AdamW(cp.policy.optim.optimizer_param_groups(reference, 0.1), lr=1e-2), grads)
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def _adam_l2_by_hand(model: torch.nn.Module, grads: list[list[torch.Tensor]], lr: float, betas: tuple[float, float],
                     eps: float, decay: float) -> None:
    """Adam with L2 weight decay (Kingma & Ba; the decay added to the gradient), one formula per tensor;
    1-D tensors (biases, norm scales) undecayed as this library groups them."""
    b1, b2 = betas
    state = [(torch.zeros_like(p), torch.zeros_like(p)) for p in model.parameters()]
    with torch.no_grad():
        for t, step_grads in enumerate(grads, start=1):
            for p, grad, (m, v) in zip(model.parameters(), step_grads, state):
                g = grad + (decay if p.ndim >= 2 else 0.0) * p
                m.mul_(b1).add_((1 - b1) * g)
                v.mul_(b2).add_((1 - b2) * g * g)
                p.sub_(lr * (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + eps))


@pytest.mark.parametrize("impl", ["fused", "foreach", "for-loop"])
def test_optm_name_adam_is_adam_with_l2_weight_decay_as_cosmos_rl_builds_it(impl: str) -> None:
    """cosmos-rl's ``optm_name = "Adam"`` (its distillation files) is ``torch.optim.Adam``: the weight decay
    enters the gradient (and the moments), unlike AdamW's decoupled decay."""
    train = TrainConfig(optm_name="Adam", optm_lr=1e-2, optm_weight_decay=0.1, optm_betas=[0.9, 0.95], optm_impl=impl)
    model, reference, adamw = _model(), _model(), _model()
    grads = _grads(model, 4)
    _run(model, cp.policy.build_optimizer(model, train), grads)
    _adam_l2_by_hand(reference, grads, 1e-2, (0.9, 0.95), 1e-8, 0.1)
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    _run(adamw, cp.policy.build_optimizer(adamw, msgspec.structs.replace(train, optm_name="AdamW")), grads)
    assert not torch.allclose(adamw[0].weight, model[0].weight)  # the two decays differ


def test_optm_name_adam_with_bfloat16_master_weights() -> None:
    # without weight decay Adam and AdamW are one update: BFloat16AdamW serves it; with decay it stops, naming the keys
    train = TrainConfig(optm_name="Adam", optm_weight_decay=0.0, master_dtype="bfloat16")
    assert isinstance(cp.policy.build_optimizer(_model().to(torch.bfloat16), train), BFloat16AdamW)
    with pytest.raises(ValueError, match=r'optm_name = "Adam" with optm_weight_decay = 0.1 and master_dtype = '
                                         r'"bfloat16"'):
        cp.policy.build_optimizer(_model().to(torch.bfloat16),
                                  msgspec.structs.replace(train, optm_weight_decay=0.1))


def test_fused_where_torch_has_the_kernels_foreach_elsewhere() -> None:
    from cosmos_primitives.policy.optim import FUSED_ADAMW_DEVICE_TYPES, fused_supported

    assert {"cuda", "cpu"} <= set(FUSED_ADAMW_DEVICE_TYPES)
    assert fused_supported([torch.zeros(3), torch.zeros(2, 2, dtype=torch.bfloat16)])
    assert not fused_supported([torch.zeros(3), torch.zeros(3, device="meta")])  # no kernels for that device
    assert not fused_supported([torch.zeros(3, dtype=torch.int64)])
    with torch.device("meta"):
        model = _model()
    optimizer = cp.policy.build_optimizer(model, TrainConfig(optm_impl="fused"))
    assert [(g["fused"], g["foreach"]) for g in optimizer.param_groups] == [(False, True)] * 2
    with pytest.raises(ValueError, match="optm_impl = 'fast'; use one of fused, foreach, for-loop"):
        cp.policy.build_optimizer(_model(), TrainConfig(optm_impl="fast"))  # type: ignore[arg-type]


def test_the_implementation_survives_loading_another_ones_state() -> None:
    grads = _grads(_model(), 4)
    saved_model = _model()
    saved = cp.policy.build_optimizer(saved_model, TrainConfig(optm_lr=1e-2, optm_impl="foreach"))
    _run(saved_model, saved, grads[:2])
    model = copy.deepcopy(saved_model)
    optimizer = cp.policy.build_optimizer(model, TrainConfig(optm_lr=1e-2, optm_impl="fused"))
    optimizer.load_state_dict(copy.deepcopy(saved.state_dict()))  # as read from a file
    assert all(g["fused"] and not g["foreach"] for g in optimizer.param_groups)  # not the saved run's choice
    assert {str(s["step"].dtype) for s in optimizer.state.values()} == {"torch.float32"}
    _run(model, optimizer, grads[2:])
    _run(saved_model, saved, grads[2:])
    for a, b in zip(model.parameters(), saved_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_bfloat16_adamw_buckets_give_the_slice_by_slice_result(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    """Small slices share one bucket (fewer kernels), tensors larger than a slice are split, float32
    and non-contiguous weights ride along, a parameter without a gradient skips a step: every weight
    and moment equals the slice-by-slice update bit for bit (and the rounding noise is the same).
    On CUDA the moments' multi-tensor kernels are not the per-tensor ones: the GPU run checks them."""
    from cosmos_primitives.policy import optim

    def run(foreach: bool) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
        g = torch.Generator().manual_seed(0)
        shapes = [(37, 5), (3,), (1000,), (64, 33), (7,), (5, 9), (2000, 3)]
        params = [torch.nn.Parameter((torch.randn(s, generator=g) * 0.02).bfloat16().to(device)) for s in shapes]
        params.append(torch.nn.Parameter(torch.randn(6, 4, generator=g).to(device).t()))  # float32, not contiguous
        params.append(torch.nn.Parameter(torch.randn(9, 2, generator=g).bfloat16().to(device).t()))
        groups = [{"params": params[:5], "weight_decay": 0.1}, {"params": params[5:], "weight_decay": 0.0}]
        optimizer = BFloat16AdamW(groups, lr=1e-3, seed=3, foreach=foreach)
        buckets = []
        monkeypatch.setattr(optimizer, "_update_bucket",
                            lambda pieces, **kw: (buckets.append(len(pieces)),
                                                  BFloat16AdamW._update_bucket(optimizer, pieces, **kw)))
        for step in range(4):
            for i, p in enumerate(params):
                p.grad = None if step == 1 and i in (2, 6) else torch.randn(p.shape, generator=g).to(device, p.dtype)
            optimizer.step()
        moments = [optimizer.state[p][k] for p in params for k in ("exp_avg", "exp_avg_sq")]
        return [p.detach().clone() for p in params], moments, len(buckets)

    for chunk in (1 << 22, 500):  # whole tensors; slices of 500 elements (several per tensor)
        monkeypatch.setattr(optim, "UPDATE_CHUNK", chunk)
        weights, moments, buckets = run(foreach=True)
        slice_weights, slice_moments, none = run(foreach=False)
        assert buckets > 0 and none == 0
        assert all(torch.equal(a, b) for a, b in zip(weights, slice_weights))
        assert all(torch.equal(a, b) for a, b in zip(moments, slice_moments))
    assert cp.policy.build_optimizer(_model().bfloat16(), TrainConfig(master_dtype="bfloat16")).foreach
    assert not cp.policy.build_optimizer(_model().bfloat16(),
                                         TrainConfig(master_dtype="bfloat16", optm_impl="for-loop")).foreach
