"""The GRPO recipes on a text-only causal LM: ``examples/configs/grpo_text_tiny.toml`` (a tiny random
``Qwen3ForCausalLM``, plain-text prompt / answer columns, a plain tokenizer as the processor), run
colocated in one process and as independent jobs (a trainer job and a rollout job, records through a
real redis-server, weights sent back each step).

The random model never answers a sum, so a length reward (registered by the user's script) gives
the groups a spread to train on. Small sizes (2 prompts x 4 samples of 6 tokens, 3 steps)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives.testing.recipe_runs import finish, launch_recipe

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "configs" / "grpo_text_tiny.toml"
STEPS = 3
SMALL = ["grpo.rollout_batch_size=2", "grpo.num_samples_per_prompt=4", "rollout.max_response_length=6",
         f"train.max_steps={STEPS}", "grpo.reward_function={exact_match = 1.0, length = 1.0}"]
USER_SCRIPT = """
import runpy, sys
import cosmos_primitives as cp

@cp.rewards.register_reward("length")
def length(completion: str) -> float:
    return len(completion) / 100

sys.argv[0] = {recipe!r}
runpy.run_path({recipe!r}, run_name="__main__")
"""


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Overrides pointing the config at a tiny random Qwen3 and 16 sums written for this module."""
    root = tmp_path_factory.mktemp("text_assets")
    paths = [f"policy.model_name_or_path={root / 'model'}",
             f"train.train_policy.dataset.name={root / 'arithmetic' / 'train.jsonl'}"]
    cp.testing.ensure_demo_assets(cp.load_config(CONFIG, [p.replace("=", "=demo:", 1) for p in paths]
                                                 + ["custom.demo_items=16"]))
    return [*paths, "custom={}"]


def test_colocated_text_grpo_on_a_tiny_qwen3(assets: list[str], tmp_path: Path) -> None:
    text, run_dir = _run("examples/grpo_vlm.py", [*assets, *SMALL], tmp_path, nproc=1)
    _check_run(text, run_dir, Path(assets[0].split("=", 1)[1]))


@pytest.mark.slow
def test_disaggregated_text_grpo_on_a_tiny_qwen3(assets: list[str], redis_url: str, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The independent jobs (a trainer job and a rollout job, each through the user's script) on the text model."""
    monkeypatch.setenv("COSMOS_RUN_SECRET", "text-jobs-run-secret-" + "0" * 32)
    jobs = ["--run-name", "text_jobs", "--redis", redis_url, *assets, *SMALL, "grpo.allowed_outdated_steps=1"]
    rollout = _launch("examples/grpo_rollout_job.py", jobs, tmp_path / "rollout", nproc=1)
    try:
        text, run_dir = _run("examples/grpo_trainer_job.py", jobs, tmp_path / "trainer", nproc=1)
        finish(rollout, tmp_path / "rollout" / "run.log", timeout_s=120)
    finally:
        if rollout.poll() is None:
            rollout.kill()
    _check_run(text, run_dir, Path(assets[0].split("=", 1)[1]))
    assert "stopping (trainer finished at step 3)" in (tmp_path / "rollout" / "run.log").read_text()


def _launch(recipe: str, overrides: list[str], tmp_path: Path, nproc: int, env: dict[str, str] | None = None):
    """Start ``recipe`` through a user script that registers the length reward first (log: ``tmp_path/run.log``)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "my_grpo.py"
    script.write_text(USER_SCRIPT.format(recipe=str(REPO / recipe)))
    return launch_recipe(script, CONFIG, [*overrides, f"train.output_dir={tmp_path / 'out'}"], tmp_path / "run.log",
                         cwd=REPO, nproc=nproc, env=env)


def _run(recipe: str, overrides: list[str], tmp_path: Path, nproc: int, env: dict[str, str] | None = None
         ) -> tuple[str, Path]:
    """Run ``recipe`` through a user script that registers the length reward first; return its log
    and run directory (AssertionError with the log's end unless it exits with 0)."""
    proc = _launch(recipe, overrides, tmp_path, nproc, env)
    text = finish(proc, tmp_path / "run.log", timeout_s=300)
    run_dir = cp.utils.latest_run_dir(tmp_path / "out")
    assert run_dir is not None
    return text, run_dir


def _check_run(text: str, run_dir: Path, initial: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward/mean" in r] == list(range(1, STEPS + 1))
    assert "policy Qwen3ForCausalLM" in text
    lengths = [r["reward/length"] for r in rows if "reward/length" in r]
    assert len(lengths) == STEPS and min(lengths) > 0, rows
    assert any(r.get("grad_norm", 0.0) > 0 for r in rows), rows  # the length spread trained something
    export = run_dir / "safetensors" / "final"
    assert json.loads((export / "config.json").read_text())["model_type"] == "qwen3"
    assert (export / "tokenizer.json").is_file() and not (export / "preprocessor_config.json").exists()
    before = cp.policy.load_hf_model(str(initial), dtype="float32").state_dict()
    after = cp.policy.load_hf_model(str(export), dtype="float32").state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "the export holds the initial weights"
    return rows
