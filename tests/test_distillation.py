"""On-policy distillation's per-token advantages (``cosmos_primitives.algo.distillation``) against
cosmos-rl's own trainer code, run on shared inputs by ``scripts/fixtures_cosmos_rl_distillation.py``
(``tests/data/cosmos_rl_distillation.json``), and against the divergences' definitions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cosmos_primitives.algo.distillation import (
    discounted_future_sum,
    distillation_advantages,
    reverse_kl_per_token,
    topk_jsd_per_token,
)

CASES = json.loads((Path(__file__).parent / "data" / "cosmos_rl_distillation.json").read_text())["cases"]


def case_id(case: dict) -> str:
    return f"top{case['top_k']}-beta{case['jsd_beta']}-gamma{case['kl_discount_factor']}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_advantages_equal_cosmos_rl_on_its_own_inputs(case: dict) -> None:
    mask = torch.tensor(case["mask"], dtype=torch.bool)
    student, teacher = torch.tensor(case["student_logprobs"]), torch.tensor(case["teacher_logprobs"])
    if case["top_k"] > 0:
        divergence = topk_jsd_per_token(student, teacher, case["jsd_beta"])
    else:
        divergence = reverse_kl_per_token(student.squeeze(-1), teacher.squeeze(-1))
    advantages, metrics = distillation_advantages(divergence, mask, torch.tensor(case["advantages"]),
                                                  kl_penalty_coef=case["kl_penalty_coef"],
                                                  kl_discount_factor=case["kl_discount_factor"])
    torch.testing.assert_close(advantages[mask], torch.tensor(case["packed_advantages"]), atol=1e-6, rtol=1e-5)
    assert (advantages[~mask] == 0).all()
    theirs = case["metrics"]
    kl_key = next(k for k in theirs if k.startswith("teacher_kl_") and not k.startswith("teacher_kl_adv"))
    assert metrics["teacher_kl"].item() == pytest.approx(theirs[kl_key], rel=1e-5, abs=1e-7)
    assert metrics["teacher_kl_advantages"].item() == pytest.approx(theirs["teacher_kl_advantages"], rel=1e-5, abs=1e-7)
    assert metrics["teacher_kl_advantages_discounted"].item() == pytest.approx(
        theirs["teacher_kl_advantages_discounted"], rel=1e-5, abs=1e-7)


def test_the_fixture_covers_every_form() -> None:
    forms = {(c["top_k"] > 0, c["jsd_beta"] if c["top_k"] else None, c["kl_discount_factor"] > 0) for c in CASES}
    wanted = {(False, None, False), (False, None, True), (True, 0.0, False), (True, 1.0, True), (True, 0.5, True)}
    assert wanted <= forms


def test_jsd_ends_are_the_two_kls_and_the_middle_is_symmetric_in_its_mixture() -> None:
    gen = torch.Generator().manual_seed(1)
    s = torch.log_softmax(torch.randn(3, 5, generator=gen), -1)
    t = torch.log_softmax(torch.randn(3, 5, generator=gen), -1)
    forward = (t.exp() * (t - s)).sum(-1)  # KL(teacher || student) over the full support
    reverse = (s.exp() * (s - t)).sum(-1)
    torch.testing.assert_close(topk_jsd_per_token(s, t, 0.0), forward)
    torch.testing.assert_close(topk_jsd_per_token(s, t, 1.0), reverse)
    # beta = 0.5 is the Jensen-Shannon divergence, the same both ways round and at most log 2
    jsd = topk_jsd_per_token(s, t, 0.5)
    torch.testing.assert_close(jsd, topk_jsd_per_token(t, s, 0.5))
    assert (jsd >= 0).all() and (jsd <= torch.log(torch.tensor(2.0))).all()
    assert (topk_jsd_per_token(s, s, 0.3).abs() < 1e-6).all()


def test_sampled_reverse_kl_averages_to_the_reverse_kl() -> None:
    s = torch.log_softmax(torch.tensor([2.0, 0.5, -1.0, 0.0]), -1)
    t = torch.log_softmax(torch.tensor([0.0, 1.0, 0.5, -0.5]), -1)
    draws = torch.multinomial(s.exp(), 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
    estimate = reverse_kl_per_token(s[draws], t[draws]).mean()
    assert estimate.item() == pytest.approx((s.exp() * (s - t)).sum().item(), abs=5e-3)


def test_discounting_stops_at_each_sequence_and_skips_masked_positions() -> None:
    values = torch.tensor([[9.0, 1.0, 2.0, 3.0], [4.0, 5.0, 9.0, 9.0]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 0, 0]])
    out = discounted_future_sum(values, mask, 0.5)
    torch.testing.assert_close(out, torch.tensor([[0.0, 1 + 0.5 * (2 + 0.5 * 3), 2 + 0.5 * 3, 3.0],
                                                  [4 + 0.5 * 5, 5.0, 0.0, 0.0]]))


def test_shapes_and_beta_are_checked() -> None:
    with pytest.raises(ValueError, match="one shape"):
        reverse_kl_per_token(torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="jsd_beta"):
        topk_jsd_per_token(torch.zeros(2, 3), torch.zeros(2, 3), 1.5)
