"""Secrets never reach run_dir/config.toml or W&B: URL passwords and credential fields are written
as ``***`` (W&B in offline mode, its files read back byte for byte), while the config in memory
keeps the real values."""

from __future__ import annotations

from pathlib import Path

import pytest

import cosmos_primitives as cp
from cosmos_primitives.config import LoggingConfig, config_to_dict, dump_config, load_config, redact_secrets
from cosmos_primitives.logging import MetricsTracker
from test_wfm_recipes import CONFIGS, run_recipe

SECRETS = ("hunter2", "s3cr3t-pw", "hf_SeCrEtToKeN", "sk-apikey-123", "AmzSig0123")
OVERRIDES = [
    "redis.url='redis://:hunter2@127.0.0.1:6390/0'",
    "remote_reward.enqueue_url='http://scorer:s3cr3t-pw@reward.internal:8080/api/reward/enqueue'",
    "remote_reward.fetch_url='https://reward.internal/fetch?X-Amz-Signature=AmzSig0123&region=eu'",
    "custom.hf_token='hf_SeCrEtToKeN'",
    "custom.openai.api_key='sk-apikey-123'",
]


def _files_holding(root: Path, needles: tuple[str, ...]) -> dict[str, list[str]]:
    """``{file: [needles found in its bytes]}`` for every file below ``root`` holding one."""
    found = {}
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            hits = [n for n in needles if n.encode() in data]
            if hits:
                found[str(path)] = hits
    return found


def test_redact_secrets_rules() -> None:
    tree = {"redis": {"url": "redis://user:p@ss:w0rd@host:6379/0", "stream": "cosmos:rollouts"},
            "remote_reward": {"token_env": "REMOTE_REWARD_TOKEN", "enqueue_url": "http://host/enqueue?token=abc&n=1"},
            "wfm": {"data": {"max_tokens": 16}}, "custom": {"password": "", "hosts": ["ftp://u:pw@a", "b"],
                                                             "clientSecret": "xyz", "access_key_id": "AKIA1"}}
    out = redact_secrets(tree)
    assert out["redis"] == {"url": "redis://user:***@host:6379/0", "stream": "cosmos:rollouts"}
    assert out["remote_reward"] == {"token_env": "REMOTE_REWARD_TOKEN",  # names the variable, not the secret
                                    "enqueue_url": "http://host/enqueue?token=***&n=1"}
    assert out["wfm"] == {"data": {"max_tokens": 16}}
    assert out["custom"] == {"password": "", "hosts": ["ftp://u:***@a", "b"], "clientSecret": "***",
                             "access_key_id": "AKIA1"}
    assert tree["redis"]["url"] == "redis://user:p@ss:w0rd@host:6379/0"  # a copy: the input is untouched


def test_saved_config_and_wandb_offline_hold_no_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = load_config(overrides=OVERRIDES)
    saved = dump_config(cfg, tmp_path / "config.toml")
    text = saved.read_text()
    assert not [s for s in SECRETS if s in text]
    assert "redis://:***@127.0.0.1:6390/0" in text and "scorer:***@reward.internal" in text
    assert load_config(saved).custom["hf_token"] == "***"  # still a loadable config
    tracker = MetricsTracker(tmp_path, LoggingConfig(logger=["wandb"], project_name="cp_test"),
                             run_config=config_to_dict(cfg), rank=0)
    assert tracker._wandb_run.config["redis"]["url"] == "redis://:***@127.0.0.1:6390/0"
    tracker.log_metrics({"loss": 1.0}, step=1)
    tracker.finish()
    assert list((tmp_path / "wandb").rglob("*.wandb"))
    assert _files_holding(tmp_path, SECRETS) == {}
    # the run itself still has the real values
    assert cfg.redis.url == "redis://:hunter2@127.0.0.1:6390/0" and cfg.custom["hf_token"] == "hf_SeCrEtToKeN"


def test_wfm_rl_run_writes_no_secret_to_its_run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    run_dir = run_recipe([
        "--config", str(CONFIGS / "wfm_flowgrpo_tiny.toml"), f"train.output_dir={tmp_path / 'out'}",
        "logging.logger=['wandb']", "train.max_steps=1", "train.ckpt.enable_checkpoint=false",
        "wfm.num_samples_per_prompt=2", "wfm.num_inference_steps=2", "wfm.eval_num_inference_steps=0",
        "wfm.sampler.sde_window_size=0", *OVERRIDES[:1], *OVERRIDES[3:]])
    assert (run_dir / "config.toml").is_file() and list((run_dir / "wandb").rglob("*.wandb"))
    assert _files_holding(run_dir, SECRETS) == {}
    assert cp.load_config(run_dir / "config.toml").redis.url == "redis://:***@127.0.0.1:6390/0"
