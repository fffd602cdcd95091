"""The Cosmos-Reason example configs that keep their data in ``[custom.dataset]`` (cosmos-reason2
``examples/cosmos_rl/configs/``, vendored unchanged): each loads, ``[custom.dataset]`` is read as the
example script that consumes it reads it (``config/compat/cosmos_rl_custom.py``), and ``migrate``'s verdict
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
from cosmos_primitives.testing.models import save_tiny_qwen3_vl
from cosmos_primitives.testing.recipe_runs import finish, launch_recipe, only_run_dir

REPO = Path(__file__).resolve().parents[1]
REASON2 = REPO / "tests/data/cosmos_rl_configs/cosmos-reason2"
HF_SFT = REASON2 / "examples/cosmos_rl/configs/hf_sft.toml"
LLAVA_SFT = REASON2 / "examples/cosmos_rl/configs/llava_sft.toml"
# the sizes a CPU needs (the file's 32 samples per rank on 4 ranks, 4096 tokens): nothing else changes
CPU_SIZES = ["policy.parallelism.dp_shard_size=1", "train.train_batch_per_replica=4", "train.max_steps=1",
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


def _script_total_pixels(length: int) -> int:
    # cosmos-reason2 hf_sft.py: int(model_max_length * PIXELS_PER_TOKEN * 0.9), PIXELS_PER_TOKEN = 32 ** 2
    return int(length * 32 * 32 * 0.9)


def test_reason2_script_gives_every_video_0_9_of_the_context_in_pixels(tmp_path: Path) -> None:
    import tomllib

    length = tomllib.loads(HF_SFT.read_text())["policy"]["model_max_length"]
    assert _load(HF_SFT).train.train_policy.dataset.total_pixels == _script_total_pixels(length)
    # the script computes it from the context it is started with, and overwrites [custom.vision]'s
    shorter = _load(HF_SFT, ["policy.model_max_length=2048"]).train.train_policy.dataset
    assert shorter.total_pixels == _script_total_pixels(2048)
    overwritten = tmp_path / "vision.toml"
    overwritten.write_text(HF_SFT.read_text() + "\n[custom.vision]\ntotal_pixels = 50000\n")
    assert _load(overwritten).train.train_policy.dataset.total_pixels == _script_total_pixels(length)
    given = _load(HF_SFT, ["train.train_policy.dataset.total_pixels=50000"])  # the command line wins
    assert given.train.train_policy.dataset.total_pixels == 50000
    # Reason1's sft.py sets no budget of its own: its [custom.vision] total_pixels is carried as given
    reason1 = REPO / "tests/data/cosmos_rl_configs/cosmos-reason1/examples/post_training_hf/configs/sft.toml"
    assert _load(reason1).train.train_policy.dataset.total_pixels is None
    with_budget = tmp_path / "reason1.toml"
    with_budget.write_text(reason1.read_text() + "\n[custom.vision]\ntotal_pixels = 50000\n")
    assert _load(with_budget).train.train_policy.dataset.total_pixels == 50000


def test_relative_custom_path_is_a_local_folder_not_a_hub_name() -> None:
    reason1 = REPO / "tests/data/cosmos_rl_configs/cosmos-reason1/examples/post_training_hf/configs/sft.toml"
    dataset = _load(reason1).train.train_policy.dataset
    # Reason1's script: load_from_disk("data/sft") with VisionConfig(fps=1, max_pixels=81920)
    assert (dataset.name, dataset.fps, dataset.max_pixels) == ("./data/sft", 1, 81920)


@pytest.fixture(scope="module")
def tiny_reason2(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny random Qwen3-VL (Cosmos-Reason2's family) and data in the layouts the Reason2 files read:
    ``sft``, a ``save_to_disk`` dataset of conversations stored as JSON text (what
    ``download_nexar_collision_prediction.py`` writes), two with an image and two with a clip;
    ``mcq/rl.jsonl``, Cosmos-Reason1-RL-style rows (``qa_pairs`` question / ``index2ans`` / answer
    letter) each with a clip beside it."""
    datasets = pytest.importorskip("datasets", reason="hf_sft.py's data is a datasets save_to_disk folder")
    from PIL import Image

    from cosmos_primitives.testing.media import write_mp4

    root = tmp_path_factory.mktemp("reason2")
    model = save_tiny_qwen3_vl(root / "model")
    rows, mcq = [], []
    for i in range(4):
        clip = write_mp4(root / "media" / f"{i}.mp4", num_frames=16, fps=4.0, size=(48, 64))
        if i < 2:
            media = {"type": "image", "image": str(root / "media" / f"{i}.png")}
            Image.fromarray(np.full((56, 56, 3), 60 * i, dtype=np.uint8)).save(media["image"])
        else:
            media = {"type": "video", "video": str(clip)}
        rows.append({"conversations": json.dumps([
            {"role": "user", "content": [media, {"type": "text", "text": "Colour?"}]},
            {"role": "assistant", "content": f"shade {i}"}])})
        mcq.append({"video": f"../media/{i}.mp4", "qa_pairs": {
            "question": "Which way does the pattern move?", "index2ans": {"A": "left", "B": "right"},
            "answer": "AB"[i % 2]}})
    datasets.Dataset.from_list(rows).save_to_disk(str(root / "sft"))
    (root / "mcq").mkdir()
    (root / "mcq" / "rl.jsonl").write_text("".join(json.dumps(row) + "\n" for row in mcq))
    return {"model": model, "sft": root / "sft", "mcq": root / "mcq" / "rl.jsonl", "root": root}


@pytest.fixture(scope="module")
def hf_sft_on_tiny(tiny_reason2: dict[str, Path]) -> Path:
    """hf_sft.toml with only its model and data paths changed (:func:`tiny_reason2`)."""
    config = tiny_reason2["root"] / "hf_sft.toml"
    config.write_text(HF_SFT.read_text().replace("/tmp/cosmos_reason2/cosmos_rl/data/hf_sft", str(tiny_reason2["sft"]))
                      .replace("nvidia/Cosmos-Reason2-2B", str(tiny_reason2["model"])))
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
    assert mine.total_pixels == script.total_pixels == _script_total_pixels(ours.policy.model_max_length)


def test_reason2_grpo_config_trains_what_the_guide_s_4_gpu_rl_trains() -> None:
    from cosmos_primitives.migrate import llm_vlm_effective

    ours = _load(OURS / "cosmos_reason2_2b_grpo.toml")
    # the guide's 4-GPU RL: its full config with [policy.parallelism] dp_shard_size = 2 (rollout tp_size 2 there)
    theirs = _load(REASON2 / "configs/cosmos_rl_config.toml", ["policy.parallelism.dp_shard_size=2"])
    keys = (*SAME_STEP[:-1], "rollout_batch_size", "num_samples_per_prompt", "steps_per_generation")
    assert {k: llm_vlm_effective(ours)[k] for k in keys} == {k: llm_vlm_effective(theirs)[k] for k in keys}
    assert ours.rollout.parallelism.tp_size == theirs.rollout.parallelism.tp_size
    for section, names in ((ours.grpo, ("kl_beta", "epsilon_low", "epsilon_high", "loss_type", "mu_iterations",
                                        "allowed_outdated_steps", "reward_function", "temperature")),
                           (ours.rollout, ("max_response_length", "gpu_memory_utilization", "enforce_eager"))):
        other = theirs.grpo if section is ours.grpo else theirs.rollout
        assert {n: getattr(section, n) for n in names} == {n: getattr(other, n) for n in names}


def _trained(runs: Path, tokens: str) -> list[dict]:
    """The run's metric records, each with a finite loss, ``tokens`` > 0 and no bad sample."""
    records = cp.logging.read_metrics(only_run_dir(runs))
    assert records and all(np.isfinite(r["loss"]) for r in records), records
    assert all(r[tokens] > 0 and r["bad_samples"] == 0 for r in records), records
    return records


def test_guide_s_reason2_sft_command_trains_the_tiny_qwen3_vl(tiny_reason2: dict[str, Path], tmp_path: Path) -> None:
    """``examples/sft.py --config examples/configs/cosmos_reason2_2b_sft.toml`` with the model and data
    paths changed and only the sizes a 1-process CPU run needs."""
    overrides = [f"policy.model_name_or_path={tiny_reason2['model']}",
                 f"train.train_policy.dataset.name={tiny_reason2['sft']}", f"train.output_dir={tmp_path / 'runs'}",
                 *CPU_SIZES]
    log = tmp_path / "sft.log"
    finish(launch_recipe("examples/sft.py", OURS / "cosmos_reason2_2b_sft.toml", overrides, log, cwd=REPO), log)
    assert [r["step"] for r in _trained(tmp_path / "runs", "tokens")] == [1]


@pytest.mark.slow  # ~30-40 s: generation of 16 answers and two updates
def test_guide_s_reason2_grpo_command_trains_the_tiny_qwen3_vl(tiny_reason2: dict[str, Path], tmp_path: Path) -> None:
    """``examples/grpo_vlm.py --config examples/configs/cosmos_reason2_2b_grpo.toml`` (the colocated
    layout) with the model and data paths changed and only the sizes a 1-process CPU run needs: one
    rank, an HF engine of tp_size 1, short answers, two steps."""
    overrides = [f"policy.model_name_or_path={tiny_reason2['model']}",
                 f"train.train_policy.dataset.name={tiny_reason2['mcq']}", f"train.output_dir={tmp_path / 'runs'}",
                 "policy.parallelism.dp_shard_size=1", "rollout.parallelism.tp_size=1", "rollout.backend=hf",
                 "rollout.max_response_length=8", "train.max_steps=2", "train.optm_warmup_steps=0",
                 "logging.logger=['console']"]
    log = tmp_path / "grpo.log"
    finish(launch_recipe("examples/grpo_vlm.py", OURS / "cosmos_reason2_2b_grpo.toml", overrides, log, cwd=REPO), log)
    # a random policy scores no single_choice reward, so the update carries no advantage: this checks
    # the command runs the guide's GRPO end to end (16 answers per prompt trained 4 per step), not learning
    records = _trained(tmp_path / "runs", "response_length")
    assert [r["step"] for r in records] == [1, 2] and records[0]["time/rollout"] > 0 == records[1]["time/rollout"]
