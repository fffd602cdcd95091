"""Config checks at load time and start-up: ranges, every problem of a file at once, binary files,
and input paths (demo assets only where asked for with ``demo:``, missing paths stop the run)."""

from __future__ import annotations

from pathlib import Path

import pytest

import cosmos_primitives as cp
from cosmos_primitives.config import ConfigError, check_input_paths, load_config
from cosmos_primitives.testing.demo_assets import ensure_demo_assets
from cosmos_primitives.testing.forked_script import run_script

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "examples" / "configs"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.toml"
    path.write_text(text)
    return path


def test_out_of_range_override_names_the_override(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"override 'train.train_batch_per_replica=0'.*expects int >= 1"):
        load_config(write(tmp_path, ""), ["train.train_batch_per_replica=0"])
    # an override may fix a file's value
    fixed = load_config(write(tmp_path, "[train]\nepoch = 0\n"), ["train.epoch=2"])
    assert fixed.train.epoch == 2


def test_every_problem_of_a_file_is_reported_at_once(tmp_path: Path) -> None:
    path = write(tmp_path, "[train]\nepoch = -1\ntrain_batch_per_replica = 0\nsave_frq = 3\n"
                           "[train.train_policy]\nmini_batch = 0\n[policy]\ndtype = 'fp8'\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    problems = info.value.problems
    assert len(problems) == 5, problems
    for key in ("train.epoch", "train.train_batch_per_replica", "train.save_frq", "train.train_policy.mini_batch",
                "policy.dtype"):
        line = next(p for p in problems if f"'{key}'" in p)
        assert line.startswith(str(path))
    assert str(info.value).startswith(f"5 problems in {path}")


def test_binary_file_as_config_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x01" * 8)
    with pytest.raises(ConfigError, match=rf"{path}: not a TOML text file"):
        load_config(path)
    with pytest.raises(ConfigError, match="is a folder"):
        load_config(tmp_path)


def test_demo_assets_are_written_only_at_demo_paths(tmp_path: Path) -> None:
    """A config copied from a tiny one, its paths pointed at the user's own (mistyped) data: nothing
    is generated there, and the start-up check names key, file and path."""
    config = CONFIGS / "grpo_tiny.toml"
    mine = tmp_path / "my_data" / "train.jsonl"
    model = tmp_path / "my_model"
    cfg = load_config(config, [f"policy.model_name_or_path={model}", f"train.train_policy.dataset.name={mine}"])
    assert cfg.custom["demo_model"] == "tiny_qwen2_5_vl"  # still in the copied [custom]
    assert ensure_demo_assets(cfg) == []
    assert not mine.parent.exists() and not model.exists()
    with pytest.raises(ConfigError) as info:
        check_input_paths(cfg, str(config))
    assert len(info.value.problems) == 2
    model_line, data_line = info.value.problems
    assert f"{config}: key 'policy.model_name_or_path' = '{model}'" in model_line
    assert f"key 'train.train_policy.dataset.name' = '{mine}'" in data_line and "no such file" in data_line

    asked = load_config(config, [f"train.train_policy.dataset.name=demo:{mine}", "custom.demo_items=4",
                                 "policy.model_name_or_path=Qwen/Qwen2.5-VL-3B-Instruct"])
    assert ensure_demo_assets(asked) == [mine.parent]
    resolved = check_input_paths(asked, str(config))  # a Hub id is not a local path
    assert resolved.train.train_policy.dataset.name == str(mine) and mine.is_file()


def test_demo_path_without_a_kind_is_refused(tmp_path: Path) -> None:
    cfg = load_config(CONFIGS / "grpo_tiny.toml", [f"policy.model_name_or_path=demo:{tmp_path / 'm'}", "custom={}"])
    with pytest.raises(ValueError, match=r"\[custom\] demo_model does not say which"):
        ensure_demo_assets(cfg)


def test_recipe_with_a_wrong_model_path_stops_before_creating_anything(tmp_path: Path) -> None:
    """examples/sft.py with the tiny config and the user's model path: exit 1 naming key, file and
    path; the path is not created (it used to get a random model, then train and exit 0)."""
    model = tmp_path / "models" / "my_qwen"
    config = CONFIGS / "sft_tiny.toml"
    proc = run_script(["examples/sft.py", "--config", config, f"policy.model_name_or_path={model}",
                       f"train.output_dir={tmp_path / 'out'}"], tmp_path / "run.log", cwd=REPO)
    assert proc.returncode != 0
    assert f"{config}: key 'policy.model_name_or_path' = '{model}': no such file" in proc.stdout
    assert not model.exists()
    assert cp.config.DEMO_PREFIX == "demo:"


def test_validation_settings_no_recipe_reads_are_refused_at_start_up(tmp_path: Path) -> None:
    """SFT and GRPO validation run on a held-out part of the training data (train.train_policy.dataset.
    test_size); SFT does not read a validation.dataset.test_size, so it stops the run there. GRPO reads it
    as cosmos-rl's distillation scripts do (the first items of the validation prompts)."""
    path = tmp_path / "sft.toml"
    for kind in ("sft", "grpo"):
        path.write_text(f"[train.train_policy]\ntype = '{kind}'\ndataset.test_size = 0.2\n"
                        "[validation]\nenable = true\n")
        cp.config.check_runnable(load_config(path), str(path))
    path.write_text("[train.train_policy]\ntype = 'grpo'\n[validation]\nenable = true\ndataset.test_size = 5\n")
    cp.config.check_runnable(load_config(path), str(path))
    path.write_text("[train.train_policy]\ntype = 'sft'\ndataset.test_size = 0.2\n"
                    "[validation]\nenable = true\ndataset.test_size = 5\n")
    with pytest.raises(ConfigError) as info:
        cp.config.check_runnable(load_config(path), str(path))
    (problem,) = (p.split(": key ")[1] for p in info.value.problems)
    assert problem.startswith("'validation.dataset.test_size' = 5 is not read by SFT")


def test_recipe_command_line_loads_overrides_and_plugins(tmp_path: Path) -> None:
    path = write(tmp_path, "[train]\nepoch = 2\n")
    cfg, source = cp.config.load_recipe_config("doc", argv=["--config", str(path), "train.epoch=3"])
    assert (cfg.train.epoch, source) == (3, str(path))
    cfg, _ = cp.config.load_recipe_config("doc", plugins=True, argv=[
        "--config", str(path), "--dataset", "my_pkg.data:MyDataset", "--reward", "my_pkg.rewards:score"])
    assert cfg.train.train_policy.dataset.plugin == "my_pkg.data:MyDataset"
    assert dict(cfg.grpo.reward_function) == {"my_pkg.rewards:score": 1.0}
    with pytest.raises(SystemExit):  # plug-in flags only where the recipe takes them
        cp.config.load_recipe_config("doc", argv=["--config", str(path), "--dataset", "x:y"])


@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
def test_non_finite_numbers_are_refused_at_load(tmp_path: Path, value: str) -> None:
    path = write(tmp_path, f"[train]\noptm_lr = {value}\n[train.ckpt]\nupload_backoff_s = {value}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    keys = sorted(p.split("'")[1] for p in info.value.problems)
    assert keys == ["train.ckpt.upload_backoff_s", "train.optm_lr"], info.value.problems
    assert all("finite" in p for p in info.value.problems), info.value.problems
    with pytest.raises(ConfigError, match=r"override 'train.optm_lr=inf'.*finite"):
        load_config(write(tmp_path, ""), ["train.optm_lr=inf"])


def test_a_one_sided_reward_clip_may_still_be_infinite(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "[[remote_reward.rewards]]\nname = 'a'\nclip = [-inf, 1.0]\n"))
    assert cfg.remote_reward.rewards[0].clip == (float("-inf"), 1.0)
    with pytest.raises(ConfigError, match=r"remote_reward\.rewards\.0\.clip.*finite"):
        load_config(write(tmp_path, "[[remote_reward.rewards]]\nname = 'a'\nclip = [nan, 1.0]\n"))


def test_a_zero_shard_size_is_refused_at_load(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"train.ckpt.max_shard_size_gb' expects float > 0"):
        load_config(write(tmp_path, "[train.ckpt]\nmax_shard_size_gb = 0\n"))


@pytest.mark.parametrize("suffix", [".toml", ".yaml"])
def test_a_deeply_nested_config_is_a_config_error_naming_the_file(tmp_path: Path, suffix: str) -> None:
    depth = 200_000
    path = tmp_path / f"deep{suffix}"
    path.write_text(("a = " if suffix == ".toml" else "a: ") + "[" * depth + "]" * depth + "\n")
    with pytest.raises(ConfigError, match=rf"{path}: .*nested too deeply"):
        load_config(path)
    from cosmos_primitives.migrate import inspect

    if suffix == ".toml":  # migrate reads TOML only
        assert "nested too deeply" in inspect(str(path)).problems[0]  # reported, no traceback


@pytest.mark.parametrize(("flag", "value"), [("--fps", "nan"), ("--fps", "0"), ("--fps", "inf"), ("--max-pixels", "-5"),
                                             ("--temperature", "nan"), ("--temperature", "-1"), ("--top-p", "0"),
                                             ("--top-p", "1.5"), ("--max-response-length", "0")])
def test_inference_example_refuses_out_of_range_flags(flag: str, value: str, capsys) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("inference_example", REPO / "examples" / "inference.py")
    inference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(inference)
    args = ["--model", "m", "--prompt", "p"]
    assert inference.parse_args(args).fps == 4.0
    with pytest.raises(SystemExit) as info:
        inference.parse_args([*args, flag, value])
    assert info.value.code == 2  # argparse's usage error, before any model is loaded
    assert f"argument {flag}" in capsys.readouterr().err  # "--a/--b: " for a flag with an older spelling
