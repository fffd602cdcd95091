"""Config loading: unknown keys, types, aliases, overrides, dump / reload, users' snippets."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

import cosmos_primitives as cp
from cosmos_primitives.config import ConfigError, Section, dump_config, load_config
from cosmos_primitives.config.loader import _check_unknown, canonical_key

DATA = Path(__file__).parent / "data"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.toml"
    path.write_text(text)
    return path


def test_reference_section1_snippet_loads_with_every_value() -> None:
    cfg = cp.load_config(DATA / "reference_section1.toml")
    assert cfg.policy.model_gradient_checkpointing is True
    assert cfg.policy.parallelism.dp_shard_size == 4
    assert cfg.rollout.parallelism.tp_size == 2
    assert cfg.train.output_dir == "./outputs/sft"
    assert cfg.train.train_batch_per_replica == 32
    assert cfg.grpo.rollout_batch_size == 32  # spelled under [train.train_policy]
    assert cfg.train.train_policy.dataset.name == "nvidia/Cosmos-Reason1-SFT-Dataset"
    assert cfg.train.train_policy.dataset.subset == "robovqa"
    assert cfg.train.train_policy.dataset.split == "understanding"
    ckpt = cfg.train.ckpt
    assert (ckpt.enable_checkpoint, ckpt.save_freq, ckpt.max_keep, ckpt.save_mode) == (True, 100, 2, "async")
    assert (ckpt.upload_hf, ckpt.hf_repo_name, ckpt.upload_s3) == (False, "Cosmos-Reason1", False)
    assert (ckpt.s3_bucket, ckpt.s3_prefix) == ("bucket", "outputs")
    assert cfg.grpo.num_samples_per_prompt == 4
    assert cfg.grpo.kl_beta == pytest.approx(0.01)  # kl_penalty is an alias
    assert cfg.logging.project_name == "cosmos_reason1"
    assert cfg.logging.experiment_name == "post_training/sft"


def test_user_guide_snippets_load() -> None:
    cfg = cp.load_config(DATA / "seed_snippets.toml")
    assert cfg.train.epoch == 50
    assert cfg.train.ckpt.upload_s3 is True
    assert cfg.policy.parallelism.dp_shard_size == 8


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[train]\nepoc = 2\n", "unknown key 'train.epoc'; did you mean 'train.epoch'?"),
        ("[train.ckpt]\nsave_mod = 'sync'\n", "did you mean 'train.ckpt.save_mode'?"),
        ("[polciy]\nmodel_name_or_path = 'x'\n", "did you mean 'policy'?"),
        ("[policy.parallelism]\ndp_shard_sze = 2\n", "did you mean 'policy.parallelism.dp_shard_size'?"),
    ],
)
def test_unknown_key_names_key_file_and_suggestion(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert expected in str(info.value)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        ("[train]\nepoch = 'two'\n", "train.epoch", "expects int"),
        ("[train.ckpt]\nsave_mode = 'sometimes'\n", "train.ckpt.save_mode", "expects one of 'async', 'sync'"),
        ("[policy]\nmodel_gradient_checkpointing = 1\n", "policy.model_gradient_checkpointing", "expects bool"),
        ("[train.ckpt]\nupload_s3 = 'weekly'\n", "train.ckpt.upload_s3", "one of 'final', 'all'"),
        # out of range: checked at load time (these divided by zero or trained 0 steps, exit 0)
        ("[train]\ntrain_batch_per_replica = 0\n", "train.train_batch_per_replica", "expects int >= 1"),
        ("[train.train_policy]\nmini_batch = 0\n", "train.train_policy.mini_batch", "expects int >= 1"),
        ("[train]\nepoch = -1\n", "train.epoch", "expects int >= 1 (got -1)"),
        ("[train]\nmax_steps = -5\n", "train.max_steps", "expects int >= 1 or None"),
        ("[grpo]\nrollout_batch_size = -2\n", "grpo.rollout_batch_size", ">= 1"),
        ("[rollout]\nn_generation = 0\n", "grpo.num_samples_per_prompt", ">= 1"),
        ("[train]\noptm_lr = -1e-5\n", "train.optm_lr", "expects float >= 0"),
        ("[rollout.sampling_config]\ntop_p = 1.5\n", "rollout.sampling_config.top_p", ">= 0 and <= 1"),
    ],
)
def test_wrong_type_names_key_and_expected_type(tmp_path: Path, text: str, key: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert f"key '{key}'" in message
    assert expected in message
    assert str(path) in message


def test_aliases_map_onto_one_field(tmp_path: Path) -> None:
    # n_generation is cosmos-rl's spelling: the file says it is read as this library's, so nothing else differs
    a = load_config(write(tmp_path, "config_style = 'cosmos_primitives'\n[rollout]\nn_generation = 6\n"))
    b = load_config(write(tmp_path, "[grpo]\nnum_samples_per_prompt = 6\n"))
    assert a.grpo.num_samples_per_prompt == b.grpo.num_samples_per_prompt == 6
    assert a == b
    old = load_config(write(tmp_path, "[train.train_policy]\nepsilon_high = 0.28\nkl_beta = 0.02\n"))
    assert (old.grpo.epsilon_high, old.grpo.kl_beta) == (0.28, 0.02)
    short = load_config(write(tmp_path, "[policy.parallelism]\ndp_shard = 2\ntp = 1\n"))
    assert short.policy.parallelism.dp_shard_size == 2


def test_alias_and_canonical_disagreeing_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "[rollout]\nn_generation = 4\n[grpo]\nnum_samples_per_prompt = 8\n")
    with pytest.raises(ConfigError, match=r"'rollout.n_generation' = 4 and 'grpo.num_samples_per_prompt' = 8"):
        load_config(path)
    same = write(tmp_path, "[rollout]\nn_generation = 8\n[grpo]\nnum_samples_per_prompt = 8\n")
    assert load_config(same).grpo.num_samples_per_prompt == 8


def test_reward_function_list_becomes_weights(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "[train.train_policy]\nreward_function = ['single_choice', 'format']\n"))
    assert cfg.grpo.reward_function == {"single_choice": 1.0, "format": 1.0}


def test_dotted_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, "[train]\nepoch = 1\n")
    cfg = load_config(path, overrides=["train.epoch=3", "rollout.n_generation=2", "train.output_dir=/tmp/x",
                                       "train.optm_betas=[0.8, 0.9]", "custom.my_reward.scale=0.5"])
    assert cfg.train.epoch == 3
    assert cfg.grpo.num_samples_per_prompt == 2
    assert cfg.train.output_dir == "/tmp/x"  # a bare word stays a string
    assert cfg.train.optm_betas == [0.8, 0.9]
    assert cfg.custom == {"my_reward": {"scale": 0.5}}
    with pytest.raises(ConfigError, match=r"override 'train.epohc=3'.*did you mean 'train.epoch'"):
        load_config(path, overrides=["train.epohc=3"])
    with pytest.raises(ConfigError, match="not of the form"):
        load_config(path, overrides=["train.epoch"])


def test_dump_and_reload_round_trip(tmp_path: Path) -> None:
    cfg = load_config(DATA / "reference_section1.toml",
                      overrides=["train.resume=true", "custom.note='a \"quoted\" value'", "train.max_steps=7"])
    out = dump_config(cfg, tmp_path / "run" / "config.toml")
    again = load_config(out)
    assert again == cfg
    assert dump_config(again, tmp_path / "second.toml").read_text() == out.read_text()


def test_missing_file_and_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(write(tmp_path, "[train\nepoch = 1\n"))


class _Term(Section):
    weight: float = 1.0


class _Holder(Section):
    terms: dict[str, _Term] = msgspec.field(default_factory=dict)


def test_table_of_tables_fields_are_checked() -> None:
    _check_unknown({"terms": {"a": {"weight": 2.0}}}, _Holder, "", "f.toml")
    with pytest.raises(ConfigError, match=r"unknown key 'terms.a.wieght'; did you mean 'terms.a.weight'"):
        _check_unknown({"terms": {"a": {"wieght": 2.0}}}, _Holder, "", "f.toml")


CONFIGS = Path(__file__).parents[1] / "examples" / "configs"


def test_old_wfm_spellings_of_policy_keys_load_with_warnings_and_mean_the_same() -> None:
    with pytest.warns(FutureWarning) as caught:
        old = load_config(DATA / "wfm_flowgrpo_tiny_old_keys.toml")
    messages = "\n".join(str(w.message) for w in caught)
    assert "'wfm.model' is deprecated; write 'policy.model_name_or_path'" in messages
    assert "'wfm.lora' is deprecated; write 'policy.lora'" in messages
    assert "policy.dtype = 'float32'" in messages  # unset there: the old [wfm] default, said out loud
    new = load_config(CONFIGS / "wfm_flowgrpo_tiny.toml")
    assert old.policy == new.policy and old.wfm == new.wfm
    assert new.policy.lora.target_modules[:4] == ["to_q", "to_k", "to_v", "to_out.0"]


def test_old_wfm_lora_table_keeps_its_defaults_and_its_switch(tmp_path: Path) -> None:
    with pytest.warns(FutureWarning):
        cfg = load_config(write(tmp_path, "[wfm]\ngradient_checkpointing = true\n[wfm.lora]\nr = 4\n"))
    assert cfg.policy.model_gradient_checkpointing and cfg.policy.model_name_or_path == "tiny"
    assert (cfg.policy.lora.r, cfg.policy.lora.target_modules) == (4, ["to_q", "to_k", "to_v", "to_out.0"])
    with pytest.warns(FutureWarning):
        full = load_config(write(tmp_path, "[wfm]\nmodel = 'x'\n[wfm.lora]\nenabled = false\n"))
    assert full.policy.lora is None and full.policy.model_name_or_path == "x"
    with pytest.warns(FutureWarning):  # no [wfm.lora]: LoRA was on by default
        implicit = load_config(write(tmp_path, "[wfm]\nmodel = 'x'\ndtype = 'bfloat16'\n"))
    assert implicit.policy.lora.target_modules == ["to_q", "to_k", "to_v", "to_out.0"]
    assert implicit.policy.dtype == "bfloat16"
    both = write(tmp_path, "[wfm.lora]\nr = 4\n[policy.lora]\nr = 8\n")
    with pytest.warns(FutureWarning), pytest.raises(ConfigError, match=r"keep only 'policy\.lora'"):
        load_config(both)


def test_lora_switch_and_old_spelling_as_overrides() -> None:
    path = CONFIGS / "wfm_ddrl_tiny.toml"
    assert load_config(path, ["policy.lora.enabled=false"]).policy.lora is None
    with pytest.warns(FutureWarning, match="is deprecated; write 'policy"):
        cfg = load_config(path, ["wfm.lora.r=4", "wfm.model=/models/wan"])
    assert (cfg.policy.lora.r, cfg.policy.model_name_or_path) == (4, "/models/wan")
    with pytest.warns(FutureWarning):
        assert load_config(path, ["wfm.lora.enabled=false"]).policy.lora is None
    assert canonical_key("wfm.lora.lora_alpha") == "policy.lora.lora_alpha"


def test_new_spelling_loads_without_warnings(recwarn: pytest.WarningsRecorder) -> None:
    for name in ("wfm_flowgrpo_tiny.toml", "wfm_ddrl_tiny.toml", "cosmos_predict2_5_2b_flowgrpo.toml"):
        load_config(CONFIGS / name)
    assert not [w for w in recwarn if issubclass(w.category, FutureWarning)]
