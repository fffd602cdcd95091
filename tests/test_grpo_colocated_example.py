"""``examples/grpo_vlm.py`` (colocated) with a KL penalty to a frozen reference copy,
run in one CPU process from a user's script that registers its own reward first.

The random tiny model never answers in format, so the built-in rewards are 0 for every sample (no
advantage, no update); a length reward gives the groups a spread. Small sizes (2 prompts x 4
samples of 8 tokens, 3 steps) keep a run near 20 s on two cores. A SIGTERM mid-run saves a
checkpoint from which the run resumes bitwise."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest

import cosmos_primitives as cp
from cosmos_primitives.checkpoint import PREEMPTED_EXIT_CODE, find_latest_checkpoint
from cosmos_primitives.testing.forked_script import run_script
from cosmos_primitives.testing.recipe_runs import finish, kill_when, launch_recipe, only_run_dir

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "configs" / "grpo_tiny.toml"
STEPS = 3
SMALL = ["grpo.rollout_batch_size=2", "grpo.num_samples_per_prompt=4", "rollout.max_response_length=8",
         f"train.max_steps={STEPS}", "train.optm_warmup_steps=0", "train.ckpt.export_safetensors=false"]


@pytest.fixture(scope="module")
def assets(grpo_assets) -> list[str]:
    """Overrides pointing the tiny config at a tiny random Qwen2.5-VL and 16 colour-MCQ items."""
    return grpo_assets(CONFIG)


USER_SCRIPT = """
import runpy, sys
import cosmos_primitives as cp

@cp.rewards.register_reward("length")
def length(completion: str) -> float:
    return len(completion) / 100

sys.argv = ["grpo_vlm.py", *sys.argv[1:]]
runpy.run_path("examples/grpo_vlm.py", run_name="__main__")
"""


def run(overrides: list[str], out: Path) -> tuple[str, Path]:
    """Run the recipe through a user script in one plain process; assert exit 0; return its log and run directory."""
    script = out.parent / "my_grpo.py"
    script.write_text(USER_SCRIPT)
    proc = run_script([script, "--config", CONFIG, f"train.output_dir={out}", *overrides], out.parent / "run.log",
                      cwd=REPO)
    log = proc.stdout
    assert proc.returncode == 0, f"the colocated run exited with {proc.returncode}:\n{log[-5000:]}"
    run_dir = cp.utils.latest_run_dir(out)
    assert run_dir is not None
    return log, run_dir


@pytest.mark.parametrize("reference", ["copy", "lora"])
def test_kl_to_the_frozen_reference_starts_at_zero_and_is_logged_each_step(assets, tmp_path: Path,
                                                                          reference: str) -> None:
    # with [policy.lora] the reference is the policy with its adapters off, not a second model
    # (adapters start at 0 and move slowly: a larger step keeps their KL well above float noise)
    lora = ["policy.lora={r = 4, lora_alpha = 8.0}", "train.optm_lr=2e-2"] if reference == "lora" else []
    log, run_dir = run([*assets, *SMALL, *lora, "grpo.kl_beta=0.05", "grpo.kl_estimator=k3",
                        "grpo.reward_function={format = 1.0, single_choice = 1.0, length = 1.0}"], tmp_path / "out")
    builds = re.findall(r"policy Qwen2_5_VLForConditionalGeneration: trainable params: ([\d,]+)", log)
    assert len(builds) == (1 if reference == "lora" else 2), builds
    if reference == "lora":
        assert int(builds[0].replace(",", "")) < 10_000  # adapters only
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    kl = [r["kl"] for r in rows]
    # step 1 scores the untouched policy: it is the reference; later steps have moved away from it
    assert abs(kl[0]) < 1e-6, kl
    assert all(k > 1e-6 for k in kl[1:]), kl
    for r in rows:
        assert {"reward/mean", "reward/format", "reward/single_choice", "reward/length", "clip_fraction", "entropy",
                "time/rollout", "time/update", "time/sync"} <= set(r)
    assert (run_dir / "curves.png").stat().st_size > 0


def test_dapo_drops_equal_reward_groups_and_a_step_with_none_left_trains_nothing(assets, tmp_path: Path) -> None:
    # the random model earns 0 from format and single_choice on every sample: every group is dropped
    _, run_dir = run([*assets, *SMALL, "grpo.variant=dapo"], tmp_path / "out")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        assert (r["dynamic_sampling/dropped_groups"], r["dynamic_sampling/kept_groups"]) == (2, 0)
        assert r["dynamic_sampling/dropped_samples"] == 8
        assert r["grad_norm"] == 0.0 and "loss" not in r  # no update: nothing left to train on


def test_behaviour_weights_and_dynamic_sampling_with_a_spread_reward(assets, tmp_path: Path) -> None:
    # the length reward differs within groups, so nothing is dropped; the decoupled loss gets the
    # engine's log-probs (weights exp(trainer - engine) = 1 up to float noise for fresh samples)
    _, run_dir = run([*assets, *SMALL, "grpo.dynamic_sampling=true", "grpo.behav_imp_weight_cap=5.0",
                      "grpo.reward_function={length = 1.0}"], tmp_path / "out")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        assert r["dynamic_sampling/kept_groups"] == 2 and r["grad_norm"] > 0
        assert r["behaviour_capped_fraction"] == 0.0
        # colocated samples come from the current weights: the trainer and engine agree
        assert abs(r["behaviour_weight_mean"] - 1.0) < 1e-3


def test_rollout_mismatch_metrics_logged_each_step_with_top_k_top_p(assets, tmp_path: Path) -> None:
    # issue 29: the engine samples with top-k / top-p and reports the filtered distribution's log-probs;
    # the trainer scores the same distribution, so fresh colocated samples show no drift
    _, run_dir = run([*assets, *SMALL, "rollout.sampling_config.top_p=0.9", "rollout.sampling_config.top_k=50",
                      "grpo.rollout_correction=tis", "grpo.rollout_is_cap=2.0",
                      "grpo.reward_function={length = 1.0}"], tmp_path / "out")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for r in rows:
        assert {"rollout_kl_k3", "rollout_ratio_max", "rollout_ratio_min", "rollout_truncated_fraction",
                "rollout_masked_fraction", "rollout_rejected_fraction"} <= set(r), sorted(r)
        assert 0.0 <= r["rollout_kl_k3"] < 1e-6, r["rollout_kl_k3"]
        assert abs(r["rollout_ratio_max"] - 1.0) < 1e-3 and abs(r["rollout_ratio_min"] - 1.0) < 1e-3
        assert r["rollout_truncated_fraction"] == 0.0 and r["rollout_masked_fraction"] == 0.0


def test_validation_before_every_freq_steps_and_after_the_last(assets, tmp_path: Path) -> None:
    train_file = next(a.split("=", 1)[1] for a in assets if a.startswith("train.train_policy.dataset.name="))
    _, run_dir = run([*assets, *SMALL, "validation.enable=true", "validation.freq=2", "validation.max_items=6",
                      f"validation.dataset.name={train_file}",
                      "validation.reward_function={single_choice = 1.0, format = 1.0}"], tmp_path / "out")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    validations = [r for r in records if "validation/items" in r]
    assert [r["step"] for r in validations] == [0, 2, 3]
    for r in validations:
        assert r["validation/items"] == 6
        assert 0.0 <= r["validation/single_choice"] <= 1.0 and 0.0 <= r["validation/format"] <= 1.0
        assert r["validation/reward_mean"] == pytest.approx(r["validation/single_choice"] + r["validation/format"])


def test_validation_on_prompts_test_size_holds_out_of_training(assets, tmp_path: Path) -> None:
    """No validation.dataset.name: train.train_policy.dataset.test_size items of the 16 are held out
    (cosmos-rl's meaning) and answered at step 0 and after the last step; training samples the rest."""
    log, run_dir = run([*assets, *SMALL, "train.max_steps=2", "validation.enable=true", "validation.freq=2",
                        "train.train_policy.dataset.test_size=4"], tmp_path / "out")
    assert "validation: 4 of the 16 training prompts held out" in log and "training uses the other 12" in log
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    validations = [r for r in records if "validation/items" in r]
    assert [(r["step"], r["validation/items"]) for r in validations] == [(0, 4.0), (2, 4.0)]
    assert [r["step"] for r in records if "grad_norm" in r] == [1, 2]


def test_a_generation_trains_in_rollouts_per_step_steps(assets, tmp_path: Path) -> None:
    """``[grpo] rollouts_per_step`` (a cosmos-rl train_batch_per_replica smaller than a generation, as
    Reason2's own file): 2 prompts x 4 samples train in two steps of 4 rollouts; validation scores
    with the training rewards when its own are left empty (cosmos-rl's default)."""
    train_file = next(a.split("=", 1)[1] for a in assets if a.startswith("train.train_policy.dataset.name="))
    log, run_dir = run([*assets, *SMALL, "train.max_steps=4", "grpo.rollouts_per_step=4",
                        "validation.enable=true", "validation.freq=4", "validation.max_items=2",
                        f"validation.dataset.name={train_file}", "validation.max_response_length=4"], tmp_path / "out")
    assert "4 steps x 2 prompts x 4 samples per rank (in 2 steps of 4 rollouts)" in log
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "grad_norm" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    # a generation's first step made its rollouts, the second trains the rest of them
    assert [r["time/rollout"] > 0 for r in steps] == [True, False, True, False]
    assert [r["step"] for r in records if "validation/items" in r] == [0, 4]
    training = set(cp.load_config(CONFIG).grpo.reward_function)
    assert {f"validation/{name}" for name in training} <= set(records[0])


@pytest.mark.slow
def test_sigterm_saves_the_step_in_progress_and_the_run_resumes_bitwise(assets, tmp_path: Path) -> None:
    """Preemption of a colocated run: a real SIGTERM once step 1 is logged saves the step in progress
    (no scheduled save), the run exits 75, and ``train.resume=true`` logs the same rewards, losses,
    gradient norms and learning rates at every step as a run never stopped (a warmup, a length
    reward that spreads the groups)."""
    script = tmp_path / "my_grpo.py"
    script.write_text(USER_SCRIPT)
    ckpt = ["train.ckpt.enable_checkpoint=true", "train.ckpt.save_freq=100", "train.optm_warmup_steps=2",
            "grpo.reward_function={length = 1.0}", "logging.logger=[]"]
    one_thread = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # floats compared bitwise

    def launch(out: Path, extra: list[str], log: Path):
        return launch_recipe(script, CONFIG, [*assets, *SMALL, *ckpt, f"train.output_dir={out}", *extra], log,
                             cwd=REPO, env=one_thread)

    def values(run_dir: Path) -> list[dict]:
        return [{k: v for k, v in r.items() if k.partition("/")[0] != "time"} for r in cp.logging.read_metrics(run_dir)]

    finish(launch(tmp_path / "never", ["train.ckpt.enable_checkpoint=false"], tmp_path / "never.log"),
           tmp_path / "never.log")
    reference = values(only_run_dir(tmp_path / "never"))
    assert [r["step"] for r in reference] == [1, 2, 3] and len({r["reward/mean"] for r in reference}) > 1

    log = tmp_path / "run.log"
    proc = launch(tmp_path / "out", [], log)
    kill_when(proc, lambda: any(p.read_text().strip() for p in (tmp_path / "out").glob("*/metrics.jsonl")), log,
              "step 1 was logged", sig=signal.SIGTERM)
    assert proc.returncode == PREEMPTED_EXIT_CODE, log.read_text()[-3000:]
    run_dir = only_run_dir(tmp_path / "out")
    stopped = len(values(run_dir))
    assert 1 <= stopped < STEPS and find_latest_checkpoint(run_dir) == run_dir / "checkpoints" / f"step_{stopped}"
    text = finish(launch(tmp_path / "out", ["train.resume=true"], tmp_path / "resume.log"), tmp_path / "resume.log")
    assert f"Resumed from {run_dir / 'checkpoints' / f'step_{stopped}'} (step {stopped}," in text
    assert values(run_dir) == reference
