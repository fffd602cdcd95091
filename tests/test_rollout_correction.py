"""Rollout correction (issue 29): TIS / MIS token weights and sequence rejection against hand-written
reference formulas on shared inputs, their place in ``grpo_loss``, cosmos-rl's ``behav_imp_weight_cap``
as MIS, and the mismatch metrics."""

from __future__ import annotations

import math

import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives.algo.rollout_correction import rollout_correction
from cosmos_primitives.config.grpo import GRPOConfig


def shared_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(6, 9, generator=g) * 3
    rollout = old + torch.randn(6, 9, generator=g) * 0.6
    mask = (torch.rand(6, 9, generator=g) > 0.25).float()
    mask[4] = 0  # a row without completion tokens
    return old, rollout, mask


def reference_weight(mode: str, old: float, rollout: float, cap: float, lower: float) -> float:
    """verl / TRL token forms written out: TIS min(r, C); MIS r inside [lower, C], else 0."""
    r = math.exp(old - rollout)
    if mode == "tis":
        return min(r, cap)
    return r if lower <= r <= cap else 0.0


@pytest.mark.parametrize(("mode", "cap", "lower"), [("tis", 1.3, None), ("mis", 1.3, None), ("mis", 1.6, 0.8),
                                                    ("mis", 2.0, 0.0)])
def test_token_weights_match_reference_formula(mode, cap, lower) -> None:
    old, rollout, mask = shared_inputs()
    cfg = GRPOConfig(rollout_correction=mode, rollout_is_cap=cap, rollout_is_lower=lower)
    out = rollout_correction(old, rollout, mask, cfg)
    low = (1.0 / cap) if lower is None else lower
    for b in range(6):
        for t in range(9):
            expected = reference_weight(mode, float(old[b, t]), float(rollout[b, t]), cap, low) if mask[b, t] else 0.0
            assert abs(float(out.weights[b, t]) - expected) < 1e-5, (mode, b, t)
            r = math.exp(float(old[b, t] - rollout[b, t]))
            assert bool(out.truncated[b, t]) == (mode == "tis" and bool(mask[b, t]) and r > cap)
            assert bool(out.masked[b, t]) == (mode == "mis" and bool(mask[b, t]) and not low <= r <= cap)
    # the inputs exercise both sides of the bounds
    assert out.truncated.any() or out.masked.any()
    assert not out.rejected.any()


@pytest.mark.parametrize("mode", ["geometric", "sequence"])
def test_sequence_rejection_matches_reference(mode) -> None:
    old, rollout, mask = shared_inputs()
    upper, lower = 1.15, 0.9
    cfg = GRPOConfig(rollout_correction="tis", rollout_is_cap=5.0, rollout_rejection=mode,
                     rollout_rejection_upper=upper, rollout_rejection_lower=lower)
    out = rollout_correction(old, rollout, mask, cfg)
    expected = []
    for b in range(6):
        logs = [float(old[b, t] - rollout[b, t]) for t in range(9) if mask[b, t]]
        if not logs:
            expected.append(False)
            continue
        stat = math.exp(sum(logs) / len(logs)) if mode == "geometric" else math.exp(sum(logs))
        expected.append(not lower <= stat <= upper)
    assert out.rejected.tolist() == expected
    assert 0 < sum(expected) < 5  # some rejected, some kept
    for b in range(6):
        if expected[b]:
            assert out.weights[b].abs().sum() == 0 and out.masked[b].tolist() == mask[b].bool().tolist()
        else:
            assert (out.weights[b] > 0).tolist() == mask[b].bool().tolist()


def test_behav_imp_weight_cap_is_mis_from_zero_and_keeps_its_old_weights() -> None:
    old, rollout, mask = shared_inputs()
    cfg = GRPOConfig(behav_imp_weight_cap=1.2)
    assert (cfg.rollout_correction, cfg.rollout_is_cap, cfg.rollout_is_lower) == ("mis", 1.2, 0.0)
    torch.testing.assert_close(rollout_correction(old, rollout, mask, cfg).weights,
                               cp.algo.behaviour_weights(old, rollout, mask, 1.2))
    with pytest.raises(ValueError, match=r"behav_imp_weight_cap = 1\.2 means rollout_correction = 'mis'"):
        GRPOConfig(behav_imp_weight_cap=1.2, rollout_correction="tis")


def test_cosmos_rl_behav_imp_weight_cap_maps_to_mis(tmp_path) -> None:
    path = tmp_path / "cosmos.toml"
    path.write_text("[train.train_policy]\nbehav_imp_weight_cap = 3.0\n")
    cfg = cp.config.load_config(path)
    assert (cfg.grpo.rollout_correction, cfg.grpo.rollout_is_cap, cfg.grpo.rollout_is_lower) == ("mis", 3.0, 0.0)


def test_unknown_mode_and_bounds_are_refused() -> None:
    with pytest.raises(cp.algo.UnknownNameError):
        cp.algo.grpo_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1), torch.ones(1, 2),
                          cfg=GRPOConfig(rollout_correction="nope"))
    with pytest.raises(ValueError, match=r"rollout_is_lower = 3\.0 is above grpo\.rollout_is_cap = 2\.0"):
        GRPOConfig(rollout_is_lower=3.0)


@pytest.mark.parametrize("mode", ["tis", "mis"])
def test_grpo_loss_weights_tokens_and_fused_path_agrees(mode) -> None:
    old, rollout, mask = shared_inputs()
    mask[:, 0] = 0  # position 0 is never scored by a head
    logprobs = (old + 0.05).requires_grad_()
    advantages = torch.tensor([1.0, -0.5, 0.3, -1.2, 0.0, 0.8])
    cfg = GRPOConfig(rollout_correction=mode, rollout_is_cap=1.3)
    loss, _ = cp.algo.grpo_loss(logprobs, old, advantages, mask, cfg=cfg, rollout_logprobs=rollout)
    plain = cp.algo.grpo_loss(logprobs, old, advantages, mask, cfg=GRPOConfig())[0]
    weights = rollout_correction(old, rollout, mask, cfg).weights
    per_token = cp.algo.ppo_clip_loss(logprobs, old, advantages, mask, cfg).per_token_loss
    torch.testing.assert_close(loss, (per_token * weights * mask).sum() / mask.sum())
    assert not torch.allclose(loss, plain)
    positions = cp.algo.scored_positions(torch.zeros_like(mask, dtype=torch.long), mask=mask)
    token_loss = cp.algo.grpo_token_loss(old, advantages, mask, positions, cfg=cfg, rollout_logprobs=rollout)
    flat = logprobs.detach().reshape(-1)[positions.index]
    torch.testing.assert_close(token_loss(flat, None, slice(0, flat.numel())).sum(), loss.detach())


def test_mismatch_metrics() -> None:
    old, rollout, mask = shared_inputs()
    cfg = GRPOConfig(rollout_correction="tis", rollout_is_cap=1.3, rollout_rejection="geometric",
                     rollout_rejection_upper=1.15, rollout_rejection_lower=0.9)
    m = cp.algo.rollout_mismatch_metrics(old, rollout, mask, cfg)
    on = mask.bool()
    lr = (old - rollout)[on]
    torch.testing.assert_close(m["rollout_kl_k3"], (lr.exp() - 1 - lr).mean())
    torch.testing.assert_close(m["rollout_ratio_max"], lr.exp().max())
    torch.testing.assert_close(m["rollout_ratio_min"], lr.exp().min())
    out = rollout_correction(old, rollout, mask, cfg)
    torch.testing.assert_close(m["rollout_truncated_fraction"], out.truncated.sum() / on.sum())
    torch.testing.assert_close(m["rollout_masked_fraction"], out.masked.sum() / on.sum())
    torch.testing.assert_close(m["rollout_rejected_fraction"], out.rejected.sum() / on.any(-1).sum())
    same = cp.algo.rollout_mismatch_metrics(old, old, mask, GRPOConfig())
    assert float(same["rollout_kl_k3"]) == 0.0 and float(same["rollout_ratio_max"]) == 1.0
