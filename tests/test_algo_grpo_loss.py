"""``grpo_loss`` driven by ``[grpo]`` (vs a loop reference and by hand), config aliases, DAPO pieces."""

from __future__ import annotations

import math
from pathlib import Path

import msgspec
import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives.algo.grpo_objective import resolve_loss_type, resolve_policy_loss
from cosmos_primitives.config import GRPOConfig, dump_config, load_config


def make_batch(seed: int = 0, b: int = 4, t: int = 5):
    gen = torch.Generator().manual_seed(seed)
    logprobs = (-torch.rand(b, t, generator=gen) * 2 - 0.1).requires_grad_()
    old = logprobs.detach() + 0.3 * torch.randn(b, t, generator=gen)
    ref = logprobs.detach() + 0.5 * torch.randn(b, t, generator=gen)
    entropy = (torch.rand(b, t, generator=gen) * 3).requires_grad_()
    adv = torch.randn(b, generator=gen)
    mask = (torch.rand(b, t, generator=gen) > 0.3).float()
    mask[:, 0] = 1.0
    return logprobs, old, ref, entropy, adv, mask


def reference_objective(logprobs, old, ref, entropy, adv, mask, *, eps=0.2, c=3.0, beta=0.0, coef=0.0):
    """token-mean PPO-clip (dual clip) + beta * k3 - coef * entropy, written as a loop over tokens."""
    total_policy, total_kl, total_entropy, n = 0.0, 0.0, 0.0, 0
    for i in range(logprobs.shape[0]):
        for j in range(logprobs.shape[1]):
            if not mask[i, j]:
                continue
            rho = torch.exp(logprobs[i, j] - old[i, j])
            loss = -torch.minimum(rho * adv[i], torch.clamp(rho, 1 - eps, 1 + eps) * adv[i])
            if adv[i] < 0:
                loss = torch.minimum(-c * adv[i], loss)
            x = ref[i, j] - logprobs[i, j]
            total_policy = total_policy + loss
            total_kl = total_kl + torch.exp(x) - x - 1
            total_entropy = total_entropy + entropy[i, j]
            n += 1
    return (total_policy + beta * total_kl - coef * total_entropy) / n


def test_grpo_loss_matches_loop_reference_with_kl_and_entropy() -> None:
    logprobs, old, ref, entropy, adv, mask = make_batch()
    cfg = GRPOConfig(kl_beta=0.05, entropy_coeff=0.01)
    loss, metrics = cp.algo.grpo_loss(logprobs, old, adv, mask, cfg=cfg, ref_logprobs=ref, entropy=entropy)
    grads = torch.autograd.grad(loss, [logprobs, entropy])
    lp2, ent2 = logprobs.detach().clone().requires_grad_(), entropy.detach().clone().requires_grad_()
    want = reference_objective(lp2, old, ref, ent2, adv, mask, beta=0.05, coef=0.01)
    want_grads = torch.autograd.grad(want, [lp2, ent2])
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(grads[0], want_grads[0])
    torch.testing.assert_close(grads[1], want_grads[1])
    n = mask.sum()
    x = ref - logprobs.detach()
    torch.testing.assert_close(metrics["kl"], ((torch.exp(x) - x - 1) * mask).sum() / n)
    torch.testing.assert_close(metrics["entropy"], (entropy.detach() * mask).sum() / n)
    assert set(metrics) >= {"loss", "policy_loss", "clip_fraction", "dual_clip_fraction", "ratio_mean", "ratio_min",
                            "ratio_max", "kl", "entropy"}
    assert all(not v.requires_grad and v.ndim == 0 for v in metrics.values())


def test_grpo_loss_hand_worked_metrics() -> None:
    # one sequence, A = 1, ratios 1.1, 1.5, 1.0 (eps 0.2): per-token losses -1.1, -1.2 (clipped), -1.0
    # token-mean policy loss -3.3 / 3 = -1.1; clip fraction 1/3; ratio mean 3.6 / 3 = 1.2, min 1.0, max 1.5
    old = torch.full((1, 3), -1.0)
    logprobs = old + torch.tensor([[math.log(1.1), math.log(1.5), 0.0]])
    loss, m = cp.algo.grpo_loss(logprobs, old, torch.tensor([1.0]), torch.ones(1, 3), cfg=GRPOConfig())
    assert loss.item() == pytest.approx(-1.1)
    assert m["policy_loss"].item() == pytest.approx(-1.1)
    assert m["clip_fraction"].item() == pytest.approx(1 / 3)
    assert m["dual_clip_fraction"].item() == 0.0
    assert (m["ratio_mean"].item(), m["ratio_min"].item(), m["ratio_max"].item()) == pytest.approx((1.2, 1.0, 1.5))
    assert "kl" not in m  # no reference given
    bool_mask_loss, _ = cp.algo.grpo_loss(logprobs, old, torch.tensor([1.0]), torch.ones(1, 3, dtype=torch.bool),
                                          cfg=GRPOConfig())
    assert bool_mask_loss.item() == pytest.approx(-1.1)
    # a reference given with kl_beta = 0: KL reported, not added (x = 0 - log ratio; k3 = e^x - x - 1 averaged)
    _, m = cp.algo.grpo_loss(logprobs, old, torch.tensor([1.0]), torch.ones(1, 3), cfg=GRPOConfig(), ref_logprobs=old)
    x = torch.tensor([-math.log(1.1), -math.log(1.5), 0.0])
    assert m["kl"].item() == pytest.approx((torch.exp(x) - x - 1).mean().item(), rel=1e-5)


def test_behaviour_correction_and_off_policy_masking_in_the_glue() -> None:
    logprobs, old, _, _, adv, mask = make_batch(seed=3)
    rollout = old - 0.4 * torch.randn(old.shape, generator=torch.Generator().manual_seed(5))
    cfg = GRPOConfig(behav_imp_weight_cap=1.3, loss_type="seq-mean-token-mean")
    loss, m = cp.algo.grpo_loss(logprobs, old, adv, mask, cfg=cfg, rollout_logprobs=rollout)
    w = cp.algo.behaviour_weights(old, rollout, mask, cap=1.3)
    per_token = cp.algo.ppo_clip_loss(logprobs, old, adv, mask, cfg).per_token_loss
    torch.testing.assert_close(loss, cp.algo.seq_mean_token_mean(per_token * w, mask))
    assert 0 < m["behaviour_capped_fraction"].item() < 1
    # off-policy masking: sequences with A < 0 whose mean (rollout - current) exceeds delta drop out
    # (rollout - current per sequence: +0.3, -0.3, +0.3, -0.3 with A = -1, -1, +1, +1: only sequence 0 drops)
    rollout = logprobs.detach() + torch.tensor([[0.3], [-0.3], [0.3], [-0.3]])
    adv = torch.tensor([-1.0, -1.0, 1.0, 1.0])
    cfg = GRPOConfig(off_policy_masking_delta=0.1)
    loss, m = cp.algo.grpo_loss(logprobs, old, adv, mask, cfg=cfg, rollout_logprobs=rollout)
    keep = cp.algo.off_policy_sequence_mask(logprobs, rollout, adv, mask, 0.1)
    assert keep.tolist() == [0.0, 1.0, 1.0, 1.0]
    per_token = cp.algo.ppo_clip_loss(logprobs, old, adv, mask, cfg).per_token_loss
    uncapped = cp.algo.behaviour_weights(old, rollout, mask)
    torch.testing.assert_close(loss, cp.algo.token_mean(per_token * uncapped * keep.unsqueeze(1), mask))
    assert m["off_policy_masked_fraction"].item() == pytest.approx(1 - keep.mean().item())


def test_positive_nll_hand_worked() -> None:
    # two sequences of two tokens, logp -1 everywhere, old = logp (ratio 1); A = +1 and -1.
    # policy: token-mean of (-1, -1, +1, +1) = 0. NLL of positive tokens normalised like the policy loss:
    # (1 + 1) / 4 = 0.5; coef 0.2 -> loss 0.1; d/dlogp: positive tokens -(1 + 0.2) / 4 = -0.3, negative +1/4
    logprobs = torch.full((2, 2), -1.0, requires_grad=True)
    cfg = GRPOConfig(positive_nll_coef=0.2)
    loss, m = cp.algo.grpo_loss(logprobs, logprobs.detach(), torch.tensor([1.0, -1.0]), torch.ones(2, 2), cfg=cfg)
    loss.backward()
    assert loss.item() == pytest.approx(0.1)
    assert m["positive_nll"].item() == pytest.approx(0.5)
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-0.3, -0.3], [0.25, 0.25]]))


def test_documented_step_raises_the_probability_of_the_better_completion() -> None:
    # a 3-token vocabulary policy answering one MCQ twice: token 0 is "A" (right), token 2 is "C" (wrong)
    logits = torch.zeros(3, requires_grad=True)
    tokens = torch.tensor([[0], [2]])
    cfg = GRPOConfig(num_samples_per_prompt=2, kl_beta=0.1, reward_function={"single_choice": 1.0})
    rewards = cp.rewards.RewardSet.from_config(cfg)(["<answer>A</answer>", "<answer>C</answer>"], ["A", "A"])
    advantages = cp.algo.compute_advantages(rewards.total_tensor(), cfg=cfg)
    ref = torch.log_softmax(logits.detach(), -1)[tokens]
    before = torch.softmax(logits.detach(), -1)[0].item()
    for _ in range(3):
        logprobs = torch.log_softmax(logits, -1)[tokens]
        loss, _ = cp.algo.grpo_loss(logprobs, logprobs.detach(), advantages, torch.ones(2, 1), cfg=cfg,
                                    ref_logprobs=ref)
        (grad,) = torch.autograd.grad(loss, [logits])
        with torch.no_grad():
            logits -= 0.5 * grad  # plain SGD
    probs = torch.softmax(logits.detach(), -1)
    assert probs[0].item() > before + 0.1 and probs[2].item() < 1 / 3


def test_policy_loss_and_loss_type_resolution() -> None:
    assert resolve_policy_loss(GRPOConfig()) == "ppo_clip"
    assert resolve_policy_loss(GRPOConfig(variant="gspo")) == "gspo"
    assert resolve_policy_loss(GRPOConfig(variant="dapo")) == "ppo_clip"
    assert resolve_policy_loss(GRPOConfig(aipo_rho=4.0)) == "aipo"
    assert resolve_loss_type(GRPOConfig(loss_type="seq-mean-token-mean", unbiased_loss_max_tokens=64)) == (
        "seq-mean-token-sum-norm"
    )
    assert cp.algo.dynamic_sampling_enabled(GRPOConfig(variant="dapo"))
    assert not cp.algo.dynamic_sampling_enabled(GRPOConfig(variant="dapo", dynamic_sampling=False))
    assert cp.algo.dynamic_sampling_enabled(GRPOConfig(dynamic_sampling=True))


@pytest.mark.parametrize(
    ("cfg", "kwargs", "message"),
    [
        (GRPOConfig(policy_loss="nope"), {}, r"unknown policy loss 'nope'.*registered: .*aipo.*gspo.*ppo_clip"),
        (GRPOConfig(policy_loss="ppo_clip", aipo_rho=2.0), {}, "aipo_rho = 2.0 selects the AIPO loss"),
        (GRPOConfig(loss_type="token-max"), {}, r"unknown aggregation 'token-max'.*seq-mean-token-mean.*token-sum"),
        (GRPOConfig(unbiased_loss_max_tokens=64), {}, "unbiased_loss_max_tokens = 64 only applies"),
        (GRPOConfig(kl_beta=0.1), {}, "kl_beta = 0.1 needs ref_logprobs"),
        (GRPOConfig(kl_beta=0.1, kl_estimator="k9"), {}, "unknown kl estimator 'k9'"),
        (GRPOConfig(entropy_coeff=0.01), {}, "entropy_coeff = 0.01 needs entropy"),
        (GRPOConfig(dual_clip_c=0.5), {}, "dual_clip_c"),
    ],
)
def test_contradictory_or_unknown_settings_name_the_key(cfg: GRPOConfig, kwargs: dict, message: str) -> None:
    lp = torch.zeros(2, 3)
    with pytest.raises((ValueError, KeyError), match=message):
        cp.algo.grpo_loss(lp, lp, torch.zeros(2), torch.ones(2, 3), cfg=cfg, **kwargs)


def test_custom_policy_loss_is_selected_by_name() -> None:
    @cp.algo.register_policy_loss("test_reinforce", override=True)
    def reinforce(logprobs, old_logprobs, advantages, mask, cfg=None):
        adv = cp.algo.token_advantages(advantages, logprobs)
        zeros = torch.zeros_like(mask, dtype=torch.bool)
        return cp.algo.PolicyLossOutput(-(logprobs * adv) * mask, torch.ones_like(logprobs), zeros, zeros)

    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, _ = cp.algo.grpo_loss(logprobs, logprobs.detach(), torch.tensor([2.0]), torch.ones(1, 2),
                                cfg=GRPOConfig(policy_loss="test_reinforce"))
    assert loss.item() == pytest.approx(3.0)  # -(-1 * 2 + -2 * 2) / 2


def test_cosmos_rl_spellings_load_as_aliases(tmp_path: Path) -> None:
    path = tmp_path / "old.toml"
    path.write_text(
        "[train.train_policy]\n"
        "type = 'grpo'\nvariant = 'dapo'\nepsilon_high = 0.28\nlower_bound_ratio = 2.5\n"
        "unbiased_advantage = true\nunbiased_loss_max_tokens = 4096\nloss_type = 'seq-mean-token-mean'\n"
        "aipo_rho = 4.0\nmu_iterations = 2\nmini_batch = 4\nkl_beta = 0.01\nentropy_coeff = 0.001\n"
        "positive_nll_coef = 0.1\nbehav_imp_weight_cap = 5.0\noff_policy_masking_delta = 0.5\n"
        "[train.train_policy.overlong_reward]\nenable_overlong_penalty = true\nbuffer_length = 512\n"
        "penalty_factor = 0.5\n"
    )
    cfg = load_config(path)
    g = cfg.grpo
    assert (g.variant, g.epsilon_high, g.dual_clip_c, g.advantage_estimator) == ("dapo", 0.28, 2.5, "drgrpo")
    assert (g.unbiased_loss_max_tokens, g.aipo_rho, g.mu_iterations, g.kl_beta) == (4096, 4.0, 2, 0.01)
    assert (g.entropy_coeff, g.positive_nll_coef, g.behav_imp_weight_cap, g.off_policy_masking_delta) == (
        0.001, 0.1, 5.0, 0.5)
    assert (g.overlong_reward.enable_overlong_penalty, g.overlong_reward.buffer_length) == (True, 512)
    assert g.overlong_reward.penalty_factor == 0.5
    assert cfg.train.train_policy.mini_batch == 4  # GRPO's mini-batch stays where SFT's is
    assert resolve_policy_loss(g) == "aipo" and resolve_loss_type(g) == "seq-mean-token-sum-norm"
    # a cosmos-rl file's unset seed is None (drawn at start-up); TOML has no None, so the dump leaves it out
    assert cfg.train.seed is None
    again = load_config(dump_config(cfg, tmp_path / "dumped.toml"))
    assert msgspec.structs.replace(again, train=msgspec.structs.replace(again.train, seed=None)) == cfg
    with pytest.raises(cp.ConfigError, match=r"unknown key 'grpo\.overlong_reward\.bufer_length'"):
        load_config(path, overrides=["grpo.overlong_reward.bufer_length=3"])


def test_dynamic_sampling_hand_worked_counts() -> None:
    # groups (label: rewards): 5: 1,1,1 (all right, dropped); 2: 0,1,0 (kept); 9: 0,0,0 (all wrong, dropped);
    # 4: a single sample (zero variance, dropped)
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.7])
    groups = torch.tensor([5, 2, 5, 5, 2, 9, 2, 9, 9, 4])
    result = cp.algo.dynamic_sampling(rewards, groups)
    assert result.keep.tolist() == [False, True, False, False, True, False, True, False, False, False]
    assert result.dropped_groups == [5, 9, 4]
    assert result.dropped_group_rewards == pytest.approx([1.0, 0.0, 0.7])
    assert (result.num_groups, result.num_dropped_groups, result.num_dropped_samples) == (4, 3, 7)
    assert result.metrics() == {
        "dynamic_sampling/dropped_groups": 3.0, "dynamic_sampling/dropped_samples": 7.0,
        "dynamic_sampling/kept_groups": 1.0,
    }


def test_overlong_penalty_hand_worked_and_config() -> None:
    # max 10, buffer 4, factor 1: no penalty up to 6 tokens, then -(len - 6) / 4: 8 -> -0.5, 10 -> -1, 12 -> -1.5
    got = cp.algo.overlong_penalty(torch.tensor([5, 6, 8, 10, 12]), max_length=10, buffer_length=4)
    torch.testing.assert_close(got, torch.tensor([0.0, 0.0, -0.5, -1.0, -1.5]))
    doubled = cp.algo.overlong_penalty(torch.tensor([8]), max_length=10, buffer_length=4, penalty_factor=2.0)
    assert doubled.item() == pytest.approx(-1.0)
    rewards = torch.tensor([1.0, 1.0])
    assert cp.algo.apply_overlong_reward(rewards, torch.tensor([9, 10]), GRPOConfig()) is rewards  # off by default
    cfg = cp.config.config_from_dict({"grpo": {"overlong_reward": {"enable_overlong_penalty": True,
                                                                   "buffer_length": 4}}}).grpo
    torch.testing.assert_close(cp.algo.apply_overlong_reward(rewards, torch.tensor([8, 10]), cfg,
                                                             max_response_length=10), torch.tensor([0.5, 0.0]))
    with pytest.raises(ValueError, match="max_response_length"):
        cp.algo.apply_overlong_reward(rewards, torch.tensor([8, 10]), cfg)
    with pytest.raises(ValueError, match=r"buffer_length must be in 1\.\.max_length"):
        cp.algo.overlong_penalty(torch.tensor([1]), max_length=10, buffer_length=20)
