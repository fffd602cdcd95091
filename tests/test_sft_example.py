"""examples/sft.py end to end, run as users run it (``python`` / ``torchrun`` subprocesses on the tiny
config): the loss falls and the exported Hugging Face folder reproduces the trained model; a run
killed with SIGKILL after a checkpoint, or in the middle of writing one, or preempted with SIGTERM
(which saves the step in progress), resumes to exactly the per-step losses of an uninterrupted run."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import cosmos_primitives as cp
from cosmos_primitives.checkpoint import PAUSE_ENV, PREEMPTED_EXIT_CODE, CheckpointManager
from cosmos_primitives.checkpoint.layout import find_latest_checkpoint, is_complete
from cosmos_primitives.testing.demo_assets import ensure_demo_assets
from cosmos_primitives.testing.recipe_runs import finish, kill_when, launch_recipe, only_run_dir

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "configs" / "sft_tiny.toml"
ITEMS = 16  # clips: 4 optimizer steps per epoch in one process, 2 under torchrun with 2 ranks
STEPS = 6  # single-process runs: 1.5 epochs
# the resume tests compare floats bitwise, so every run of them computes with the same thread count
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Overrides pointing the tiny config at a tiny random Qwen2.5-VL and generated clips written once."""
    root = tmp_path_factory.mktemp("sft_assets")
    paths = [f"policy.model_name_or_path={root / 'model'}", f"train.train_policy.dataset.name={root / 'video_qa'}"]
    demo = [path.replace("=", "=demo:", 1) for path in paths]  # asks for the assets there
    ensure_demo_assets(cp.load_config(CONFIG, [*demo, f"custom.demo_items={ITEMS}"]))
    return paths


def launch(overrides: list[str], log: Path, *, nproc: int = 1, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start the recipe (stdout + stderr to ``log``) from the repository root."""
    return launch_recipe("examples/sft.py", CONFIG, overrides, log, cwd=REPO, nproc=nproc, env=env)


def step_values(records: list[dict]) -> list[tuple[int, float, float, float]]:
    """(step, loss, grad_norm, lr) of each metrics record, in file order."""
    return [(r["step"], r["loss"], r["grad_norm"], r["lr"]) for r in records]


def single_process(assets: list[str], output_dir: Path, save_mode: str) -> list[str]:
    """Overrides of a single-process run of ``STEPS`` steps saving every 2 steps (no safetensors exports)."""
    return [*assets, f"train.output_dir={output_dir}", f"train.max_steps={STEPS}", "train.ckpt.save_freq=2",
            f"train.ckpt.save_mode={save_mode}", "train.ckpt.max_keep=-1", "train.ckpt.export_safetensors=false"]


@pytest.fixture(scope="module")
def uninterrupted(assets: list[str], tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple]:
    """Per-step (loss, grad_norm, lr) of a single-process run that is never stopped and saves nothing."""
    out = tmp_path_factory.mktemp("sft_uninterrupted")
    log = out / "run.log"
    overrides = [*single_process(assets, out / "runs", "sync"), "train.ckpt.enable_checkpoint=false"]
    finish(launch(overrides, log, env=ONE_THREAD), log)
    values = step_values(cp.logging.read_metrics(only_run_dir(out / "runs")))
    assert [v[0] for v in values] == list(range(1, STEPS + 1))
    return {step: rest for step, *rest in values}


def assert_resumed_exactly(run_dir: Path, log_text: str, reference: dict[int, tuple]) -> int:
    """The resumed run's records continue the reference bitwise; return the step it resumed from."""
    match = re.search(r"Resumed from (\S+) \(step (\d+),", log_text)
    assert match, f"the resumed run did not log 'Resumed from ...':\n{log_text[-3000:]}"
    resumed = int(match.group(2))
    values = step_values(cp.logging.read_metrics(run_dir))
    # the killed run's records come first; the resumed run appended steps resumed+1..STEPS
    tail = values[len(values) - (STEPS - resumed):]
    assert [v[0] for v in tail] == list(range(resumed + 1, STEPS + 1))
    for step, *got in values:  # killed run's records (including any past the checkpoint) too
        assert tuple(got) == tuple(reference[step]), (
            f"step {step}: (loss, grad_norm, lr) {tuple(got)} != uninterrupted {tuple(reference[step])}")
    return resumed


def test_torchrun_tiny_sft_learns_and_exports_the_trained_weights(assets: list[str], tmp_path: Path) -> None:
    overrides = [*assets, f"train.output_dir={tmp_path / 'runs'}", "train.epoch=3"]
    log = tmp_path / "torchrun.log"
    text = finish(launch(overrides, log, nproc=2), log)
    run_dir = only_run_dir(tmp_path / "runs")

    losses = [r["loss"] for r in cp.logging.read_metrics(run_dir)]
    assert len(losses) == 6  # 3 epochs x 16 clips / (2 ranks x 4 clips per step)
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < first - 0.5, f"loss did not fall: first three {losses[:3]}, last three {losses[-3:]}"

    final = run_dir / "safetensors" / "final"
    assert f"Exported safetensors to {final}" in text
    for name in ("config.json", "generation_config.json", "preprocessor_config.json", "chat_template.json",
                 "tokenizer.json", "tokenizer_config.json"):
        assert (final / name).is_file(), f"{name} missing from the export {final}"
    exported_names = set()
    for shard in final.glob("*.safetensors"):
        with safe_open(shard, "pt") as f:
            exported_names.update(f.keys())
    assert "model.embed_tokens.weight" in exported_names
    assert "lm_head.weight" not in exported_names  # tied to the embeddings: saved once, as transformers does

    compared = cp.testing.run_distributed(compare_export_with_checkpoint, 1, args=(overrides, str(run_dir)))[0]
    assert compared["resumed_step"] == 6
    assert compared["different_tensors"] == [], "exported weights differ from the final checkpoint's"
    assert compared["logits_max_abs_diff"] == 0.0
    assert compared["logprobs_max_abs_diff"] < 1e-5


def test_torchrun_sft_validation_logs_val_loss_at_cosmos_rl_steps(assets: list[str], tmp_path: Path) -> None:
    """cosmos-rl's validation keys on two FSDP ranks: 4 of the 16 clips held out (test_size), the
    loss on them before training (val_before_train), every 2 steps (freq) and after the last."""
    overrides = [*assets, f"train.output_dir={tmp_path / 'runs'}", "train.max_steps=3",
                 "train.ckpt.enable_checkpoint=false", "train.ckpt.export_safetensors=false",
                 "train.train_policy.dataset.test_size=4", "validation.enable=true", "validation.freq=2",
                 "validation.val_before_train=true"]
    log = tmp_path / "torchrun.log"
    text = finish(launch(overrides, log, nproc=2), log)
    records = cp.logging.read_metrics(only_run_dir(tmp_path / "runs"))
    validations = [r for r in records if "val/avg_loss" in r]
    assert [r["step"] for r in validations] == [0, 2, 3]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3]
    # the same 4 held-out clips each time (the 12 others: 6 per rank, 2 steps per epoch)
    assert len({r["val/tokens"] for r in validations}) == 1 and validations[0]["val/tokens"] > 0
    assert [r["epoch"] for r in records if "loss" in r] == [0, 0, 1]
    assert validations[-1]["val/avg_loss"] < validations[0]["val/avg_loss"]
    assert "[SFT] Validation loss: " in text and "for train step 3/3" in text


def compare_export_with_checkpoint(overrides: list[str], run_dir: str) -> dict:
    """In a one-rank group: the final DCP checkpoint restored into a freshly built policy vs the
    exported folder loaded with ``transformers`` (weights, logits, and the recipe's log-probs)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from cosmos_primitives.data import build_sft_loader
    from cosmos_primitives.policy.lm_policy import MODEL_INPUT_KEYS

    cfg = cp.load_config(CONFIG, overrides)
    policy = cp.policy.build_policy(cfg.policy)
    ckpt = CheckpointManager(cfg.train.ckpt, run_dir, model=policy)
    state = ckpt.resume(True)
    ckpt.close()
    policy.eval()

    final = Path(run_dir) / "safetensors" / "final"
    exported = AutoModelForImageTextToText.from_pretrained(final, dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(final)
    trained = policy.hf_model.state_dict()
    different = sorted(k for k, v in exported.state_dict().items() if not torch.equal(v, trained[k]))

    # a fixed input: the first step's packed rows of two clips (video tokens, mRoPE positions)
    batch = build_sft_loader(cfg.train.train_policy, processor, exported.config,
                             model_max_length=cfg.policy.model_max_length, seed=cfg.train.seed).next_step(2)[0]
    # no KV cache: with one, transformers ignores the packed rows' position resets and lets samples attend
    # to each other, unlike training
    inputs = {"use_cache": False, **{k: batch[k] for k in MODEL_INPUT_KEYS if k in batch}}
    text_config = policy.hf_model.config.get_text_config()
    with torch.no_grad():
        text_config._attn_implementation = "sdpa"  # the exported model's attention: bitwise-equal logits
        logits_trained = policy.hf_model(input_ids=batch["input_ids"], **inputs).logits
        text_config._attn_implementation = cp.parallel.VARLEN_ATTENTION  # build_policy's
        logits_exported = exported(input_ids=batch["input_ids"], **inputs).logits
        logprobs_trained = cp.policy.token_logprobs(policy, batch).logprobs  # the recipe's path
        scored = batch["labels"][:, 1:] != -100
        full = torch.log_softmax(logits_exported[:, :-1].float(), dim=-1)
        logprobs_exported = full.gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    return {
        "resumed_step": state.step,
        "different_tensors": different,
        "logits_max_abs_diff": float((logits_trained - logits_exported).abs().max()),
        "logprobs_max_abs_diff": float((logprobs_trained[:, 1:] - logprobs_exported)[scored].abs().max()),
    }


def test_sigkill_after_a_checkpoint_resumes_bitwise(assets: list[str], uninterrupted: dict[int, tuple],
                                                    tmp_path: Path) -> None:
    overrides = single_process(assets, tmp_path / "runs", "async")
    log = tmp_path / "run.log"
    proc = launch(overrides, log, env=ONE_THREAD)
    kill_when(proc, lambda: any((tmp_path / "runs").glob("*/checkpoints/step_2/COMPLETE")), log,
              "checkpoint step_2 was complete")
    run_dir = only_run_dir(tmp_path / "runs")

    resume_log = tmp_path / "resume.log"
    text = finish(launch([*overrides, "train.resume=true"], resume_log, env=ONE_THREAD), resume_log)
    resumed = assert_resumed_exactly(run_dir, text, uninterrupted)
    assert 2 <= resumed < STEPS
    assert is_complete(run_dir / "checkpoints" / f"step_{STEPS}")


def test_sigkill_while_saving_resumes_from_the_previous_checkpoint(assets: list[str], uninterrupted: dict[int, tuple],
                                                                   tmp_path: Path) -> None:
    overrides = single_process(assets, tmp_path / "runs", "sync")
    log = tmp_path / "run.log"
    # the save of step 4 pauses after its data is written and before it is marked complete
    proc = launch(overrides, log, env={**ONE_THREAD, PAUSE_ENV: "4"})
    kill_when(proc, lambda: "pausing before committing" in log.read_text(errors="replace"), log,
              "the save of step 4 paused")
    run_dir = only_run_dir(tmp_path / "runs")
    checkpoints = run_dir / "checkpoints"
    assert (checkpoints / "step_4.tmp" / ".metadata").is_file()  # DCP finished writing, the marker is missing
    assert not (checkpoints / "step_4").exists()
    assert find_latest_checkpoint(run_dir) == checkpoints / "step_2"

    resume_log = tmp_path / "resume.log"
    text = finish(launch([*overrides, "train.resume=true"], resume_log, env=ONE_THREAD), resume_log)
    assert f"Removing incomplete {checkpoints / 'step_4.tmp'}" in text
    assert assert_resumed_exactly(run_dir, text, uninterrupted) == 2
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_2", "step_4", "step_6"]
    assert all(is_complete(p) for p in checkpoints.iterdir())


def logged_rows(output_dir: Path) -> int:
    """Metrics rows the run under ``output_dir`` has written so far (0 before its file exists)."""
    return sum(len(p.read_text().splitlines()) for p in output_dir.glob("*/metrics.jsonl"))


def test_sigterm_saves_the_step_in_progress_and_the_run_resumes_bitwise(
        assets: list[str], uninterrupted: dict[int, tuple], tmp_path: Path) -> None:
    """Preemption: no scheduled save (save_freq 100), a real SIGTERM once step 2's metrics are written;
    the run saves the step it is in when that ends, exits 75, and resumes from there exactly."""
    overrides = [*single_process(assets, tmp_path / "runs", "async"), "train.ckpt.save_freq=100"]
    log = tmp_path / "run.log"
    proc = launch(overrides, log, env=ONE_THREAD)
    kill_when(proc, lambda: logged_rows(tmp_path / "runs") >= 2, log, "step 2 was logged", sig=signal.SIGTERM)
    text = log.read_text(errors="replace")
    assert proc.returncode == PREEMPTED_EXIT_CODE, text[-3000:]
    run_dir = only_run_dir(tmp_path / "runs")
    stopped = len(cp.logging.read_metrics(run_dir))
    assert 2 <= stopped < STEPS
    assert find_latest_checkpoint(run_dir) == run_dir / "checkpoints" / f"step_{stopped}"  # the only one
    assert f"preempted by SIGTERM after step {stopped}" in text and "Exported safetensors" not in text

    resume_log = tmp_path / "resume.log"
    text = finish(launch([*overrides, "train.resume=true"], resume_log, env=ONE_THREAD), resume_log)
    assert assert_resumed_exactly(run_dir, text, uninterrupted) == stopped


def test_single_process_sft_leaves_its_curves(assets: list[str], tmp_path: Path) -> None:
    """Like the GRPO and world-model recipes, SFT plots its metrics into ``<run dir>/curves.png``."""
    overrides = [*assets, f"train.output_dir={tmp_path / 'runs'}", "train.max_steps=2",
                 "train.ckpt.enable_checkpoint=false", "train.ckpt.export_safetensors=false"]
    log = tmp_path / "run.log"
    finish(launch(overrides, log), log)
    run_dir = only_run_dir(tmp_path / "runs")
    curves = run_dir / "curves.png"
    assert curves.is_file(), f"no curves.png in {run_dir}: {sorted(p.name for p in run_dir.iterdir())}"
    assert curves.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [r["step"] for r in cp.logging.read_metrics(run_dir)] == [1, 2]
