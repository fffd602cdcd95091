"""examples/wfm_rl.py killed with SIGKILL, or preempted with SIGTERM (which saves the step in progress),
then run again with ``train.resume=true``, ends bitwise where an uninterrupted run ends, for FlowGRPO and
for DDRL: the same rewards, losses, gradient norms and learning rates at every step (the killed run's
records past its checkpoint included), the same final evaluation and the same trained weights.

The runs are small variants of the tiny recipes that draw every kind of per-step randomness (SDE
noise, an SDE window, a random half of its steps trained, DDRL's own noise and noise levels), cross
an epoch of the shuffled prompt order and follow a warmup + cosine learning-rate schedule.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file

import cosmos_primitives as cp
from cosmos_primitives.checkpoint import PAUSE_ENV, PREEMPTED_EXIT_CODE
from cosmos_primitives.checkpoint.layout import find_latest_checkpoint, is_complete
from cosmos_primitives.testing.recipe_runs import finish, kill_when, launch_recipe, only_run_dir

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
STEPS = 6  # 8 mock prompts, 2 per step: the prompt order starts its second epoch at step 5
# floats are compared bitwise, so every run computes with the same thread count
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
SMALL = [
    "logging.logger=[]", f"train.max_steps={STEPS}", "wfm.num_samples_per_prompt=4", "wfm.num_inference_steps=6",
    "wfm.eval_num_inference_steps=4", "wfm.sampler.sde_window_size=3", "wfm.sampler.sde_window_range=[0, 5]",
    "wfm.train_step_fraction=0.5", "wfm.num_minibatches=2", "train.optm_warmup_steps=2",
    "train.optm_decay_type=cosine", "train.optm_min_lr_factor=0.1", "train.ckpt.enable_checkpoint=true",
    "train.ckpt.max_keep=-1", "train.ckpt.export_safetensors=false",
]
RECIPES = {
    "flow_grpo": ("wfm_flowgrpo_tiny.toml", ["wfm.kl_beta=0.01"]),
    "ddrl": ("wfm_ddrl_tiny.toml", ["wfm.ddrl_rollout_noise=false", "wfm.ddrl_rollout_sigma=false"]),
}


def launch(algorithm: str, output_dir: Path, extra: list[str], log: Path, env: dict[str, str] | None = None):
    config, overrides = RECIPES[algorithm]
    return launch_recipe("examples/wfm_rl.py", REPO / "examples" / "configs" / config,
                         [*SMALL, *overrides, f"train.output_dir={output_dir}", *extra], log, cwd=REPO,
                         env={**ONE_THREAD, **(env or {})})


def keyed_records(run_dir: Path) -> list[tuple[tuple[int, str], dict]]:
    """``((step, "train" | "eval"), values)`` of each metrics record in file order, without its time."""
    out = []
    for record in cp.logging.read_metrics(run_dir):
        values = {k: v for k, v in record.items() if k not in ("step", "time")}
        out.append(((record["step"], "eval" if "eval/reward_mean" in values else "train"), values))
    return out


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory):
    """``algorithm -> (records by (step, kind), trained weights)`` of a run never stopped, saving only
    at its last step; run once per algorithm and module."""
    done: dict[str, tuple[dict, dict[str, torch.Tensor]]] = {}

    def reference(algorithm: str) -> tuple[dict, dict[str, torch.Tensor]]:
        if algorithm not in done:
            out = tmp_path_factory.mktemp(f"wfm_{algorithm}_uninterrupted")
            log = out / "run.log"
            finish(launch(algorithm, out / "runs", ["train.ckpt.save_freq=0"], log), log)
            run_dir = only_run_dir(out / "runs")
            records = dict(keyed_records(run_dir))
            assert list(records) == [(0, "eval"), *((s, "train") for s in range(1, STEPS + 1)), (STEPS, "eval")]
            done[algorithm] = records, load_file(str(run_dir / "trained_weights.safetensors"))
        return done[algorithm]

    return reference


def assert_resumed_exactly(run_dir: Path, log_text: str, reference: tuple[dict, dict[str, torch.Tensor]]) -> int:
    """The run's records and trained weights equal the reference bitwise; return the step it resumed from."""
    match = re.search(r"Resumed from (\S+) \(step (\d+),", log_text)
    assert match, f"the resumed run did not log 'Resumed from ...':\n{log_text[-3000:]}"
    resumed = int(match.group(2))
    expected, weights = reference
    records = keyed_records(run_dir)
    # the killed run's records come first; the resumed run appended steps resumed+1..STEPS and the evaluation
    tail = [key for key, _ in records[len(records) - (STEPS - resumed) - 1:]]
    assert tail == [*((s, "train") for s in range(resumed + 1, STEPS + 1)), (STEPS, "eval")]
    for key, values in records:
        assert values == expected[key], f"{key}: {values} != uninterrupted {expected[key]}"
    trained = load_file(str(run_dir / "trained_weights.safetensors"))
    assert trained.keys() == weights.keys() and all(torch.equal(trained[k], weights[k]) for k in weights)
    final = run_dir / "checkpoints" / f"step_{STEPS}"
    assert is_complete(final)
    saved = dcp.FileSystemReader(str(final)).read_metadata().state_dict_metadata
    model_keys = [k for k in saved if k.startswith("model.")]
    assert model_keys and all(".lora_" in k for k in model_keys)  # the frozen base stays out
    return resumed


def test_flow_grpo_killed_after_a_checkpoint_resumes_bitwise(uninterrupted, tmp_path: Path) -> None:
    extra = ["train.ckpt.save_freq=2", "train.ckpt.save_mode=async"]
    log = tmp_path / "run.log"
    # the last step's save never completes, so the run is still alive whenever the kill comes
    proc = launch("flow_grpo", tmp_path / "runs", extra, log, env={PAUSE_ENV: str(STEPS)})
    kill_when(proc, lambda: any((tmp_path / "runs").glob("*/checkpoints/step_2/COMPLETE")), log,
              "checkpoint step_2 was complete")
    run_dir = only_run_dir(tmp_path / "runs")

    resume_log = tmp_path / "resume.log"
    text = finish(launch("flow_grpo", tmp_path / "runs", [*extra, "train.resume=true"], resume_log), resume_log)
    assert 2 <= assert_resumed_exactly(run_dir, text, uninterrupted("flow_grpo")) < STEPS


def test_ddrl_killed_while_saving_resumes_bitwise_from_the_previous_checkpoint(uninterrupted, tmp_path: Path) -> None:
    extra = ["train.ckpt.save_freq=2", "train.ckpt.save_mode=sync"]
    log = tmp_path / "run.log"
    # the save of step 4 stops after its data is written and before it is marked complete
    proc = launch("ddrl", tmp_path / "runs", extra, log, env={PAUSE_ENV: "4"})
    kill_when(proc, lambda: "pausing before committing" in log.read_text(errors="replace"), log,
              "the save of step 4 paused")
    run_dir = only_run_dir(tmp_path / "runs")
    assert not (run_dir / "checkpoints" / "step_4").exists()

    resume_log = tmp_path / "resume.log"
    text = finish(launch("ddrl", tmp_path / "runs", [*extra, "train.resume=true"], resume_log), resume_log)
    assert f"Removing incomplete {run_dir / 'checkpoints' / 'step_4.tmp'}" in text
    assert assert_resumed_exactly(run_dir, text, uninterrupted("ddrl")) == 2


def logged_rows(output_dir: Path) -> int:
    """Metrics rows the run under ``output_dir`` has written so far (0 before its file exists)."""
    return sum(len(p.read_text().splitlines()) for p in output_dir.glob("*/metrics.jsonl"))


def test_flow_grpo_preempted_with_sigterm_saves_the_step_in_progress_and_resumes_bitwise(uninterrupted,
                                                                                         tmp_path: Path) -> None:
    """No scheduled save (save_freq 100): a real SIGTERM once step 2 is logged saves the step in
    progress when it ends; the run exits 75 and resumes from that checkpoint bitwise."""
    extra = ["train.ckpt.save_freq=100"]
    log = tmp_path / "run.log"
    proc = launch("flow_grpo", tmp_path / "runs", extra, log)
    kill_when(proc, lambda: logged_rows(tmp_path / "runs") >= 3, log, "step 2 was logged (after the step-0 evaluation)",
              sig=signal.SIGTERM)
    assert proc.returncode == PREEMPTED_EXIT_CODE, log.read_text(errors="replace")[-3000:]
    run_dir = only_run_dir(tmp_path / "runs")
    stopped = max(step for (step, kind), _ in keyed_records(run_dir) if kind == "train")
    assert find_latest_checkpoint(run_dir) == run_dir / "checkpoints" / f"step_{stopped}"
    assert not (run_dir / "trained_weights.safetensors").exists()  # the end of the run is not faked

    resume_log = tmp_path / "resume.log"
    text = finish(launch("flow_grpo", tmp_path / "runs", [*extra, "train.resume=true"], resume_log), resume_log)
    assert 2 <= assert_resumed_exactly(run_dir, text, uninterrupted("flow_grpo")) == stopped < STEPS
