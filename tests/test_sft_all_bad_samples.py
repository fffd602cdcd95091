"""``examples/sft.py`` on data whose every sample is bad stops with an error, as the GRPO recipe's
prompt stream does, instead of running its epochs without a step and exporting the untrained model."""

from __future__ import annotations

from pathlib import Path

import pytest

import cosmos_primitives as cp
from cosmos_primitives.testing.demo_assets import ensure_demo_assets
from cosmos_primitives.testing.forked_script import run_script

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "configs" / "sft_tiny.toml"


def test_an_sft_run_whose_every_sample_is_bad_stops_with_an_error(tmp_path: Path) -> None:
    paths = [f"policy.model_name_or_path={tmp_path / 'model'}", f"train.train_policy.dataset.name={tmp_path / 'clips'}"]
    ensure_demo_assets(cp.load_config(CONFIG, [p.replace("=", "=demo:", 1) for p in paths] + ["custom.demo_items=4"]))
    # 8 tokens hold no sample: every one is bad, and the budget is far from spent
    overrides = [*paths, f"train.output_dir={tmp_path / 'runs'}", "train.train_policy.packing_budget=8",
                 "train.train_policy.dataset.bad_sample_budget=1000"]
    run = run_script(["examples/sft.py", "--config", CONFIG, *overrides], tmp_path / "run.log", cwd=REPO)
    assert run.returncode != 0, run.stdout[-4000:]
    # the loader's own check (cp.data.NoGoodSamplesError) speaks first; the recipe's is the multi-rank backstop
    assert "NoGoodSamplesError: all 4 samples drawn in epoch 0 were bad samples: nothing to train on" in run.stdout
    assert "exceed the packing budget of 8" in run.stdout  # the worst offenders, with the reason
    assert not list((tmp_path / "runs").glob("*/safetensors/final"))  # nothing exported
