"""Config keys that mean what cosmos-rl means by them, in cosmos-rl's files and ours alike: GRPO
staleness, validation defaults, data order, the seed, ``test_size = 0``, ``train.enable_validation``
as an attribute, GRPO steps smaller than a generation, and ``migrate --json``."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import msgspec
import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives.config import ConfigError, config_from_dict, load_config
from cosmos_primitives.data import ResumableDistributedSampler
from cosmos_primitives.migrate import main as migrate_main
from cosmos_primitives.queue.disaggregated_plan import plan_jobs

CONFIGS = Path(__file__).parent / "data" / "cosmos_rl_configs"
REASON2_RL = CONFIGS / "cosmos-reason2" / "configs" / "cosmos_rl_config.toml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def quiet(path: Path, overrides: list[str] | None = None) -> cp.Config:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return load_config(path, overrides or [])


def test_on_policy_means_no_outdated_steps_and_sync_interval_bounds_staleness() -> None:
    assert config_from_dict({"grpo": {"on_policy": True, "allowed_outdated_steps": 4}}).grpo.allowed_outdated_steps == 0
    assert config_from_dict({"grpo": {"allowed_outdated_steps": 0}, "train": {"sync_weight_interval": 3}}
                            ).grpo.allowed_outdated_steps == 2  # records are 2 steps stale between syncs
    with pytest.raises(ConfigError, match=r"on_policy = true needs train\.sync_weight_interval = 1"):
        config_from_dict({"grpo": {"on_policy": True}, "train": {"sync_weight_interval": 2}})


def test_train_enable_validation_reads_validation_enable() -> None:
    cfg = config_from_dict({"grpo": {}, "validation": {"enable": True}})
    assert cfg.train.enable_validation is True  # what Cosmos-Reason1's CosmosGRPOValDataset reads
    off = msgspec.structs.replace(cfg, validation=msgspec.structs.replace(cfg.validation, enable=False))
    assert off.train.enable_validation is False
    # the key itself is gone from cosmos-rl's class: ignored there, ignored here (Reason1's sft.toml)
    reason1 = quiet(CONFIGS / "cosmos-reason1" / "examples" / "post_training" / "configs" / "sft.toml")
    assert reason1.validation.enable is False and reason1.train.enable_validation is False


def test_test_size_zero_loads_and_validation_then_needs_a_dataset(tmp_path: Path) -> None:
    path = write(tmp_path, "[train.train_policy]\ntype = 'sft'\ndataset.test_size = 0\n")
    assert quiet(path).train.train_policy.dataset.test_size == 0
    cfg = quiet(path, ["validation.enable=true"])
    with pytest.raises(ConfigError, match="test_size' = 0 holds nothing out"):
        cp.config.check_runnable(cfg, str(path))
    cp.config.check_runnable(quiet(path, ["validation.enable=true", f"validation.dataset.name={tmp_path}"]),
                             str(path))


def test_validation_defaults_to_the_training_rewards_and_length() -> None:
    cfg = config_from_dict({"grpo": {"reward_function": {"boxed_math": 1.0}}, "rollout": {"max_response_length": 64}})
    assert cp.config.validation_rewards(cfg) == {"boxed_math": 1.0}
    assert cp.config.validation_max_response_length(cfg) == 64
    own = config_from_dict({"grpo": {}, "validation": {"reward_function": ["single_choice"], "max_response_length": 9}})
    assert cp.config.validation_rewards(own) == {"single_choice": 1.0}
    assert cp.config.validation_max_response_length(own) == 9


def test_data_order_follows_dataloader_shuffle_and_seed() -> None:
    cfg = config_from_dict({"grpo": {}, "train": {"seed": 7, "train_policy": {"dataloader_shuffle": False}}})
    assert cp.config.sampler_settings(cfg) == {"seed": 7, "shuffle": False}
    sampler = ResumableDistributedSampler(10, rank=1, world_size=2, **cp.config.sampler_settings(cfg))
    assert list(sampler) == [1, 3, 5, 7, 9]  # the dataset's own order, every second item
    seeded = config_from_dict({"grpo": {}, "train": {"seed": 7, "train_policy": {"dataloader_seed": 3}}})
    order = ResumableDistributedSampler(10, **cp.config.sampler_settings(seeded)).epoch_indices()
    assert order == torch.randperm(10, generator=torch.Generator().manual_seed(3)).tolist()  # as DistributedSampler


def test_a_cosmos_rl_file_leaves_the_seed_unset_and_start_up_draws_one(tmp_path: Path,
                                                                       caplog: pytest.LogCaptureFixture,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = quiet(REASON2_RL)
    assert cfg.train.seed is None and cfg.train.train_policy.dataloader_seed == 0  # cosmos-rl's defaults
    with caplog.at_level("INFO", logger="cosmos"):
        drawn = cp.config.resolve_seed(cfg).train.seed
    assert isinstance(drawn, int) and f"set train.seed = {drawn} to repeat it" in caplog.text
    # ranks started by torchrun but not yet in a process group agree without talking
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert cp.config.resolve_seed(cfg).train.seed == cp.config.resolve_seed(cfg).train.seed
    deterministic = quiet(write(tmp_path, 'redis = "1"\n[train]\ndeterministic = true\n'))
    assert deterministic.train.seed == 42  # cosmos-rl: deterministic runs get 42


def test_cosmos_rl_infers_the_trainer_type_of_a_file_without_one(tmp_path: Path) -> None:
    assert quiet(write(tmp_path, "[train.train_policy]\nkl_beta = 0.0\n")).train.train_policy.type == "grpo"
    sft = quiet(write(tmp_path, 'redis = "1"\n[train.train_policy]\nmini_batch = 2\n'))
    assert sft.train.train_policy.type == "sft"
    assert quiet(write(tmp_path, 'redis = "1"\n[train]\nepoch = 1\n')).train.train_policy.type == "grpo"


def test_rollouts_per_step_must_split_a_generation_evenly() -> None:
    assert cp.policy.step_slices(16, 8) == [slice(0, 8), slice(8, 16)]
    assert cp.policy.step_slices(16, None) == [slice(0, 16)]
    with pytest.raises(ValueError, match="rollouts_per_step = 6 does not divide"):
        cp.policy.step_slices(16, 6)
    with pytest.raises(ConfigError, match="rollouts_per_step = 6 does not divide the 16 rollouts"):
        config_from_dict({"grpo": {"rollout_batch_size": 2, "num_samples_per_prompt": 8, "rollouts_per_step": 6}})
    # the disaggregated trainers take whole records: they refuse it, naming the colocated recipe
    cfg = quiet(REASON2_RL)
    with pytest.raises(ValueError, match=r"trained by the colocated recipe, examples/grpo_vlm\.py"):
        plan_jobs(cfg, 1)


def test_a_rollout_batch_subset_is_that_step_s_rows() -> None:
    from cosmos_primitives.data.rollout_batch import RolloutBatch

    rows = torch.arange(4)
    batch = RolloutBatch(inputs={"input_ids": torch.arange(12).view(4, 3), "attention_mask": torch.ones(4, 3)},
                         completion_mask=torch.ones(4, 3), rollout_logprobs=torch.zeros(4, 3), group_index=rows // 2,
                         completion_lengths=rows, weight_versions=rows, images_per_row=torch.zeros(4, dtype=torch.long),
                         videos_per_row=torch.zeros(4, dtype=torch.long))
    part = batch.subset(slice(2, 4))
    assert len(part) == 2 and part.inputs["input_ids"].tolist() == [[6, 7, 8], [9, 10, 11]]
    assert part.group_index.tolist() == [1, 1] and part.completion_lengths.tolist() == [2, 3]


def test_migrate_json_prints_one_object_with_the_effective_step(capsys: pytest.CaptureFixture[str]) -> None:
    assert migrate_main([str(REASON2_RL), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["read_as"], report["loads"], report["runs"]) == ("cosmos-rl", True, True)
    effective = report["effective"]
    # 8 rollouts per step of groups of 16: one prompt per generation, trained in two steps
    assert {k: effective[k] for k in ("algorithm", "samples_per_step_per_rank", "samples_per_step", "lr",
                                      "warmup_steps", "steps_per_generation")} == {
        "algorithm": "grpo", "samples_per_step_per_rank": 8, "samples_per_step": 8, "lr": 1e-6, "warmup_steps": 20,
        "steps_per_generation": 2}
    sft = CONFIGS / "cosmos-reason1" / "examples" / "post_training" / "configs" / "sft.toml"
    assert migrate_main([str(sft), "--json"]) == 0
    effective = json.loads(capsys.readouterr().out)["effective"]
    assert (effective["samples_per_step_per_rank"], effective["data_parallel_size"], effective["samples_per_step"]) \
        == (32, 4, 128)  # cosmos-rl's SFT batch is per data-parallel rank


def test_a_train_batch_given_on_the_command_line_is_per_rank() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        cfg = load_config(REASON2_RL, ["train.train_batch_per_replica=32"])
    # this library's meaning (per rank): 2 whole groups of 16 per step, nothing split
    assert (cfg.train.train_batch_per_replica, cfg.grpo.rollout_batch_size, cfg.grpo.rollouts_per_step) == (32, 2, None)
