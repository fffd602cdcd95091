"""End-to-end learning checks of examples/wfm_rl.py on the tiny Wan model, scored by the reference
reward server over HTTP on loopback (reward: mean brightness of the decoded clip).

The random tiny VAE moves brightness by a few hundredths at most, so margins are stated in units of
the initial within-batch reward std (~0.0013).
"""

from __future__ import annotations

import importlib.util
import statistics
from pathlib import Path

import pytest
import torch

from cosmos_primitives.logging import metric_series, read_metrics

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run_recipe(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("wfm_rl_example", ROOT / "examples" / "wfm_rl.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    threads = torch.get_num_threads()

    def run(config: str, *overrides: str) -> list[dict]:
        out = tmp_path_factory.mktemp("wfm_run")
        try:
            run_dir = example.main(["--config", str(ROOT / "examples" / "configs" / config),
                                    f"train.output_dir={out}", "logging.logger=[]", *overrides])
        finally:
            torch.set_num_threads(threads)  # the tiny recipe runs single-threaded
        return read_metrics(run_dir)

    return run


def _summary(records: list[dict]) -> dict[str, float]:
    rewards = metric_series(records, "reward_mean")[1]
    evals = metric_series(records, "eval/reward_mean")[1]
    return {
        "first": statistics.mean(rewards[:5]),
        "last": statistics.mean(rewards[-10:]),
        "std0": metric_series(records, "reward_std")[1][0],
        "eval_before": evals[0],
        "eval_after": evals[-1],
    }


def assert_reward_rises(label: str, records: list[dict], stds: float = 5.0) -> None:
    """Training (first 5 -> last 10 updates) and evaluation rewards both rise by ``stds`` initial stds."""
    s = _summary(records)
    print(f"{label}: reward {s['first']:.4f} -> {s['last']:.4f} (std0 {s['std0']:.4f}); "
          f"eval {s['eval_before']:.4f} -> {s['eval_after']:.4f}")
    assert s["last"] - s["first"] > stds * s["std0"]
    assert s["eval_after"] - s["eval_before"] > stds * s["std0"]


def test_flow_grpo_raises_the_brightness_reward(run_recipe):
    # measured over train seeds 0-3: +7 to +30 std (training), +10 to +39 std (evaluation)
    assert_reward_rises("FlowGRPO", run_recipe("wfm_flowgrpo_tiny.toml"))


def test_diffusion_nft_raises_the_brightness_reward(run_recipe):
    # seed 0, 30 steps: +12 std (training and evaluation); the test runs the recipe's 60
    assert_reward_rises("DiffusionNFT", run_recipe("wfm_nft_tiny.toml"))


def test_flow_grpo_with_a_sliding_sde_window_raises_the_brightness_reward(run_recipe):
    # MixGRPO: a window of 3 stochastic (and trained) steps moving through the first 6 of 10 every 10 updates
    assert_reward_rises("FlowGRPO + sliding window", run_recipe(
        "wfm_flowgrpo_tiny.toml", "wfm.sampler.sde_window_mode=sliding", "wfm.sampler.sde_window_shift_interval=10"))


@pytest.fixture(scope="module")
def ddrl_and_unregularised(run_recipe):
    return run_recipe("wfm_ddrl_tiny.toml"), run_recipe("wfm_ddrl_tiny.toml", "wfm.data_beta=0")


def test_ddrl_keeps_the_data_loss_bounded_while_the_reward_rises(ddrl_and_unregularised):
    ddrl, plain = ddrl_and_unregularised
    s = _summary(ddrl)
    data = metric_series(ddrl, "data_loss")[1]
    plain_data = metric_series(plain, "data_loss")[1]
    print(f"DDRL: reward {s['first']:.4f} -> {s['last']:.4f} (std0 {s['std0']:.4f}), eval {s['eval_before']:.4f} "
          f"-> {s['eval_after']:.4f}; data loss {data[0]:.3f} .. max {max(data):.3f}, final {data[-1]:.3f}; "
          f"without the data term: final data loss {plain_data[-1]:.1f}, reward -> {_summary(plain)['last']:.4f}")
    # smaller gains than without the data term, and seed-dependent (train seeds 0-3: +1.0 to +7.2 std
    # training, +0.9 to +9.4 evaluation; seed 0, run here: +7.2 and +9.4)
    assert s["last"] - s["first"] > 2 * s["std0"]
    assert s["eval_after"] - s["eval_before"] > s["std0"]
    # the same run without the data term drifts far from the data (seeds 0-3: 105x to 8700x its
    # start); with it the loss stays within a few times its start (seeds 0-3: at most 15x)
    assert plain_data[-1] > 50 * plain_data[0]
    assert max(data) < 20 * data[0]
    assert max(data) < 0.25 * plain_data[-1]
