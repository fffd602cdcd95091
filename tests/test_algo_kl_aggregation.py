"""KL estimators, aggregations (incl. the data-parallel token count) and the entropy bonus."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives.algo.aggregation import dp_mean_token_count


def test_kl_estimators_hand_worked_values_and_gradients() -> None:
    # logp = -1, ref = -2: x = ref - logp = -1.
    # k1 = -x = 1, dk1/dlogp = 1; k2 = x^2/2 = 0.5, dk2/dlogp = -x = 1;
    # k3 = e^-1 + 1 - 1 = 0.3678794, dk3/dlogp = 1 - e^x = 0.6321206
    expected = {"k1": (1.0, 1.0), "k2": (0.5, 1.0), "k3": (math.exp(-1), 1 - math.exp(-1))}
    for name, (value, grad) in expected.items():
        logprobs = torch.tensor([[-1.0]], requires_grad=True)
        kl = cp.algo.get_kl_estimator(name)(logprobs, torch.tensor([[-2.0]]))
        kl.sum().backward()
        assert kl.item() == pytest.approx(value, rel=1e-6), name
        assert logprobs.grad.item() == pytest.approx(grad, rel=1e-6), name


def test_kl_estimators_match_numpy_and_clamp_at_20() -> None:
    gen = np.random.default_rng(0)
    logprobs = -gen.uniform(0, 4, size=(3, 5))
    ref = -gen.uniform(0, 4, size=(3, 5))
    ref[0, 0] = logprobs[0, 0] + 30.0  # x = 30 -> clamped to 20
    ref[1, 1] = logprobs[1, 1] - 30.0  # x = -30 -> clamped to -20
    x = np.clip(ref - logprobs, -20, 20)
    numpy_kl = {"k1": -x, "k2": x**2 / 2, "k3": np.exp(x) - x - 1}
    lp = torch.tensor(logprobs, requires_grad=True)
    for name, want in numpy_kl.items():
        got = cp.algo.get_kl_estimator(name)(lp, torch.tensor(ref))
        np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-10)
    cp.algo.kl_k3(lp, torch.tensor(ref)).sum().backward()
    assert lp.grad[0, 0] == 0 and lp.grad[1, 1] == 0  # no gradient through the clamp
    assert (cp.algo.kl_k3(lp, torch.tensor(ref)) >= 0).all()
    with pytest.raises(ValueError, match="ref_logprobs"):
        cp.algo.kl_k1(lp, torch.zeros(2, 2))


VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


def test_aggregations_hand_worked() -> None:
    # masked values: row 0 -> 1, 2, 3 (sum 6, 3 tokens), row 1 -> 4 (sum 4, 1 token); the 9s are off-mask
    assert cp.algo.token_mean(VALUES, MASK).item() == pytest.approx(10 / 4)
    assert cp.algo.token_mean(VALUES, MASK, token_count=8).item() == pytest.approx(10 / 8)
    assert cp.algo.seq_mean_token_sum(VALUES, MASK).item() == pytest.approx((6 + 4) / 2)
    assert cp.algo.seq_mean_token_mean(VALUES, MASK).item() == pytest.approx((2 + 4) / 2)
    assert cp.algo.seq_mean_token_sum_norm(VALUES, MASK, max_tokens=5).item() == pytest.approx((6 / 5 + 4 / 5) / 2)


def reference_aggregate(name: str, values: np.ndarray, mask: np.ndarray, max_tokens: int) -> float:
    """Straightforward loops over rows and tokens."""
    sums = [sum(values[i, j] for j in range(values.shape[1]) if mask[i, j]) for i in range(values.shape[0])]
    counts = [max(int(mask[i].sum()), 1) for i in range(values.shape[0])]
    if name == "token-mean":
        return sum(sums) / max(sum(int(m) for m in mask.ravel()), 1)
    if name == "seq-mean-token-sum":
        return sum(sums) / len(sums)
    if name == "seq-mean-token-mean":
        return sum(s / c for s, c in zip(sums, counts)) / len(sums)
    return sum(s / max_tokens for s in sums) / len(sums)


@pytest.mark.parametrize("name", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_aggregations_match_loop_reference_and_autograd(name: str) -> None:
    gen = np.random.default_rng(1)
    values = gen.normal(size=(5, 7))
    mask = (gen.uniform(size=(5, 7)) > 0.4).astype(np.float64)
    mask[3] = 0  # a row without tokens
    leaf = torch.tensor(values, requires_grad=True)
    got = cp.algo.get_aggregation(name)(leaf, torch.tensor(mask), max_tokens=11)
    assert got.item() == pytest.approx(reference_aggregate(name, values, mask, 11), rel=1e-10)
    got.backward()
    # the reference is linear in the values: its gradient is the weight of each token
    weights = np.zeros_like(values)
    for i, j in zip(*np.nonzero(mask)):
        bumped = values.copy()
        bumped[i, j] += 1.0
        weights[i, j] = reference_aggregate(name, bumped, mask, 11) - reference_aggregate(name, values, mask, 11)
    np.testing.assert_allclose(leaf.grad.numpy(), weights, atol=1e-10)


def test_aggregation_errors_and_non_finite_off_mask() -> None:
    with pytest.raises(ValueError, match="unbiased_loss_max_tokens"):
        cp.algo.seq_mean_token_sum_norm(VALUES, MASK)
    with pytest.raises(ValueError, match=r"must both be \[B, T\]"):
        cp.algo.token_mean(VALUES, MASK[:, :2])
    poisoned = VALUES.clone()
    poisoned[1, 2] = float("nan")
    assert cp.algo.token_mean(poisoned, MASK).item() == pytest.approx(2.5)
    assert cp.algo.token_mean(VALUES, torch.zeros_like(MASK)).item() == 0.0


def test_entropy_bonus_value_and_gradient_by_hand() -> None:
    # coef 0.01, token-mean over tokens with entropies 1, 2, 3 (and a masked 9): -0.01 * 2 = -0.02;
    # d/d entropy_t = -0.01 / 3 on each of the three tokens, 0 on the masked one
    entropy = torch.tensor([[1.0, 2.0], [3.0, 9.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    bonus = cp.algo.entropy_bonus(entropy, mask, 0.01)
    bonus.backward()
    assert bonus.item() == pytest.approx(-0.02)
    torch.testing.assert_close(entropy.grad, torch.tensor([[-0.01 / 3, -0.01 / 3], [-0.01 / 3, 0.0]]))
    # seq-mean-token-mean: rows' means 1.5 and 3 -> -0.01 * 2.25; row 0 tokens get -0.01 / 2 / 2
    entropy.grad = None
    bonus = cp.algo.entropy_bonus(entropy, mask, 0.01, loss_type="seq-mean-token-mean")
    bonus.backward()
    assert bonus.item() == pytest.approx(-0.0225)
    torch.testing.assert_close(entropy.grad, torch.tensor([[-0.0025, -0.0025], [-0.005, 0.0]]))


DP_MASKS = ([[1, 1, 1, 0], [1, 1, 0, 0]], [[1, 0, 0, 0], [1, 0, 0, 0]])  # 5 and 2 tokens: uneven on purpose


def _dp_data(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.arange(8, dtype=torch.float32).reshape(2, 4) + 10 * rank, torch.tensor(DP_MASKS[rank]).float()


def _dp_token_mean_rank() -> tuple[float, list[float]]:
    """One data-parallel rank: a parameter shared by both ranks, gradients averaged as FSDP/DDP do."""
    data, mask = _dp_data(torch.distributed.get_rank())
    theta = torch.ones(4, requires_grad=True)
    loss = cp.algo.token_mean(theta * data, mask, token_count=dp_mean_token_count(mask))
    loss.backward()
    torch.distributed.all_reduce(theta.grad)
    return loss.item(), (theta.grad / torch.distributed.get_world_size()).tolist()


def test_token_mean_with_dp_token_count_equals_global_mean_over_two_ranks() -> None:
    results = cp.testing.run_distributed(_dp_token_mean_rank, 2)
    # all 7 tokens: rank 0 -> 0+1+2+4+5 = 12, rank 1 -> 10+14 = 24; global mean 36/7, and the
    # average of the ranks' losses (12/3.5 + 24/3.5) / 2 is the same number
    assert (results[0][0] + results[1][0]) / 2 == pytest.approx(36 / 7)
    # the averaged gradient equals the gradient of the token mean over both ranks' data in one process
    theta = torch.ones(4, requires_grad=True)
    (d0, m0), (d1, m1) = _dp_data(0), _dp_data(1)
    cp.algo.token_mean(theta * torch.cat([d0, d1]), torch.cat([m0, m1])).backward()
    for _, grad in results:
        torch.testing.assert_close(torch.tensor(grad), theta.grad)
    assert dp_mean_token_count(m0).item() == 5.0  # no process group: the local count
