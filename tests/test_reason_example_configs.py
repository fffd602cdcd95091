"""The Cosmos-Reason example configs that keep their data in ``[custom.dataset]`` (cosmos-reason2
``examples/cosmos_rl/configs/``, vendored unchanged): each loads, ``[custom.dataset]`` is read as the
example script that consumes it reads it (``config/cosmos_rl_custom.py``), and ``migrate``'s verdict
(``cp.config.check_runnable``) is what ``examples/sft.py`` does on the file: it starts and trains when
migrate says so, and stops at start-up with migrate's reason when it does not."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

import cosmos_primitives as cp
from cosmos_primitives.migrate import inspect
from cosmos_primitives.testing.models import save_tiny_qwen2_5_vl
from cosmos_primitives.testing.recipe_runs import launch_recipe, only_run_dir

REPO = Path(__file__).resolve().parents[1]
REASON2 = REPO / "tests/data/cosmos_rl_configs/cosmos-reason2"
HF_SFT = REASON2 / "examples/cosmos_rl/configs/hf_sft.toml"
LLAVA_SFT = REASON2 / "examples/cosmos_rl/configs/llava_sft.toml"
# the sizes a CPU needs (the file's 32 samples per rank on 4 ranks, 4096 tokens): nothing else changes
CPU_SIZES = ["policy.parallelism.dp_shard_size=1", "train.train_batch_per_replica=2", "train.max_steps=1",
             "train.optm_warmup_steps=0", "logging.logger=['console']"]


def _load(path: Path, overrides: list[str] = ()) -> cp.Config:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the one "read as a cosmos-rl config" warning
        return cp.load_config(path, overrides)


@pytest.mark.parametrize("path", sorted(REASON2.rglob("*.toml")), ids=lambda p: str(p.relative_to(REASON2)))
def test_every_reason2_config_loads(path: Path) -> None:
    assert _load(path).train.train_policy.type in ("sft", "grpo")


def test_hf_sft_custom_dataset_is_read_as_its_script_reads_it() -> None:
    dataset = _load(HF_SFT).train.train_policy.dataset
    # hf_sft.py: datasets.load_from_disk(custom.dataset.path); every media part gets VisionConfig(fps=1)
    assert (dataset.name, dataset.kind, dataset.fps) == ("/tmp/cosmos_reason2/cosmos_rl/data/hf_sft", "hf", 1)
    assert dataset.max_pixels is None


def test_custom_vision_replaces_the_script_default_and_the_file_s_own_dataset_wins(tmp_path: Path) -> None:
    text = HF_SFT.read_text()
    with_vision = tmp_path / "vision.toml"
    with_vision.write_text(text + "\n[custom.vision]\nmax_pixels = 40960\n")
    dataset = _load(with_vision).train.train_policy.dataset
    assert (dataset.fps, dataset.max_pixels) == (None, 40960)  # a whole table: no fps = 1 left from the default
    named = _load(HF_SFT, ["train.train_policy.dataset.name=my/hub_set", "train.train_policy.dataset.fps=4"])
    assert (named.train.train_policy.dataset.name, named.train.train_policy.dataset.fps) == ("my/hub_set", 4)
    refused = tmp_path / "nframes.toml"
    refused.write_text(text + "\n[custom.vision]\nnframes = 8\n")
    assert "custom.vision.nframes" in _load(refused).unsupported


def test_relative_custom_path_is_a_local_folder_not_a_hub_name() -> None:
    reason1 = REPO / "tests/data/cosmos_rl_configs/cosmos-reason1/examples/post_training_hf/configs/sft.toml"
    dataset = _load(reason1).train.train_policy.dataset
    # Reason1's script: load_from_disk("data/sft") with VisionConfig(fps=1, max_pixels=81920)
    assert (dataset.name, dataset.fps, dataset.max_pixels) == ("./data/sft", 1, 81920)


@pytest.fixture(scope="module")
def hf_sft_on_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """hf_sft.toml with only its model and data paths changed: a tiny Qwen-VL and a ``save_to_disk``
    dataset of image conversations stored as JSON text (what ``download_nexar_collision_prediction.py``
    writes)."""
    datasets = pytest.importorskip("datasets", reason="hf_sft.py's data is a datasets save_to_disk folder")
    from PIL import Image

    root = tmp_path_factory.mktemp("hf_sft")
    model = save_tiny_qwen2_5_vl(root / "model")
    rows = []
    for i in range(4):
        image = root / f"{i}.png"
        Image.fromarray(np.full((56, 56, 3), 60 * i, dtype=np.uint8)).save(image)
        rows.append({"conversations": json.dumps([
            {"role": "user", "content": [{"type": "image", "image": str(image)}, {"type": "text", "text": "Colour?"}]},
            {"role": "assistant", "content": f"shade {i}"}])})
    datasets.Dataset.from_list(rows).save_to_disk(str(root / "data"))
    config = root / "hf_sft.toml"
    config.write_text(HF_SFT.read_text().replace("/tmp/cosmos_reason2/cosmos_rl/data/hf_sft", str(root / "data"))
                      .replace("nvidia/Cosmos-Reason2-2B", str(model)))
    return config


def _start(config: Path, tmp_path: Path, extra: list[str] = ()) -> tuple[int, str]:
    log = tmp_path / "sft.log"
    proc = launch_recipe("examples/sft.py", config, [f"train.output_dir={tmp_path / 'runs'}", *CPU_SIZES, *extra],
                         log, cwd=REPO)
    proc.wait(timeout=300)
    return proc.returncode, log.read_text(errors="replace")


def test_migrate_says_hf_sft_starts_and_sft_py_trains_on_it(hf_sft_on_tiny: Path, tmp_path: Path) -> None:
    found = inspect(str(hf_sft_on_tiny))
    assert (found.loads, found.runs, found.problems) == (True, True, [])
    code, log = _start(hf_sft_on_tiny, tmp_path)
    assert code == 0, log[-3000:]
    records = cp.logging.read_metrics(only_run_dir(tmp_path / "runs"))
    assert [r["step"] for r in records] == [1] and records[0]["tokens"] > 0 and records[0]["bad_samples"] == 0


@pytest.mark.parametrize(("config", "reason"), [
    (HF_SFT, "no such file or folder"),  # the guide's /tmp data folder is not there
    (LLAVA_SFT, "llava_sft.py"),  # LLaVA annotations: read by the script (a plug-in), not by the recipes
])
def test_migrate_says_the_vendored_file_stops_and_sft_py_stops_on_it(config: Path, reason: str,
                                                                      hf_sft_on_tiny: Path, tmp_path: Path) -> None:
    found = inspect(str(config))
    assert found.loads and not found.runs
    assert any(reason in p and "train.train_policy.dataset.name" in p for p in found.problems), found.problems
    model = _load(hf_sft_on_tiny).policy.model_name_or_path  # a model that loads: only the data stops it
    code, log = _start(config, tmp_path, [f"policy.model_name_or_path={model}"])
    assert code != 0 and reason in log, log[-3000:]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("metrics.jsonl"))


OURS = REPO / "examples/configs"
SAME_STEP = ("samples_per_step_per_rank", "data_parallel_size", "lr", "warmup_steps", "decay_type", "min_lr_factor",
             "epochs", "mini_batch", "sequence_packing")


def test_reason2_sft_config_trains_what_the_guide_s_hf_sft_toml_trains() -> None:
    from cosmos_primitives.migrate import llm_vlm_effective

    ours = _load(OURS / "cosmos_reason2_2b_sft.toml")
    theirs = _load(HF_SFT)
    assert {k: llm_vlm_effective(ours)[k] for k in SAME_STEP} == {k: llm_vlm_effective(theirs)[k] for k in SAME_STEP}
    for key in ("model_name_or_path", "model_max_length", "model_gradient_checkpointing"):
        assert getattr(ours.policy, key) == getattr(theirs.policy, key), key
    mine, script = ours.train.train_policy.dataset, theirs.train.train_policy.dataset
    assert (mine.name, mine.kind, mine.fps, mine.max_pixels) == (script.name, script.kind, script.fps,
                                                                 script.max_pixels)


def test_reason2_grpo_config_trains_what_the_guide_s_4_gpu_rl_trains() -> None:
    from cosmos_primitives.migrate import llm_vlm_effective

    ours = _load(OURS / "cosmos_reason2_2b_grpo.toml")
    # the guide's 4-GPU RL: its full config with [policy.parallelism] dp_shard_size = 2 (rollout tp_size 2 there)
    theirs = _load(REASON2 / "configs/cosmos_rl_config.toml", ["policy.parallelism.dp_shard_size=2"])
    keys = (*SAME_STEP[:-1], "prompts_per_generation", "samples_per_prompt", "steps_per_generation")
    assert {k: llm_vlm_effective(ours)[k] for k in keys} == {k: llm_vlm_effective(theirs)[k] for k in keys}
    assert ours.rollout.parallelism.tp_size == theirs.rollout.parallelism.tp_size
    for section, names in ((ours.grpo, ("kl_beta", "epsilon_low", "epsilon_high", "loss_type", "mu_iterations",
                                        "allowed_outdated_steps", "reward_function", "temperature")),
                           (ours.rollout, ("max_response_length", "gpu_memory_utilization", "enforce_eager"))):
        other = theirs.grpo if section is ours.grpo else theirs.rollout
        assert {n: getattr(section, n) for n in names} == {n: getattr(other, n) for n in names}
