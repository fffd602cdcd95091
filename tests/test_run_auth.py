"""The run secret: where it comes from, what it refuses, and that it never shows itself."""

from __future__ import annotations

import logging
import pickle

import pytest

from cosmos_primitives.sync.run_auth import RateLimitedLog, RunSecret, RunSecretError


def test_the_secret_comes_from_the_environment_or_a_file(monkeypatch, tmp_path):
    monkeypatch.delenv("COSMOS_RUN_SECRET", raising=False)
    monkeypatch.delenv("COSMOS_RUN_SECRET_FILE", raising=False)
    assert RunSecret.from_env(required=False) is None
    with pytest.raises(RunSecretError, match=r"\$COSMOS_RUN_SECRET.*\$COSMOS_RUN_SECRET_FILE"):
        RunSecret.from_env()
    path = tmp_path / "secret"
    path.write_text("f" * 64 + "\n")
    monkeypatch.setenv("COSMOS_RUN_SECRET_FILE", str(path))
    from_file = RunSecret.from_env()
    signed = from_file.sign("k", b"x")
    monkeypatch.setenv("COSMOS_RUN_SECRET", "f" * 64)  # the variable wins; same key, same MACs
    assert RunSecret.from_env().open("k", signed) == b"x"
    monkeypatch.delenv("COSMOS_RUN_SECRET")
    monkeypatch.setenv("COSMOS_RUN_SECRET_FILE", str(tmp_path / "missing"))
    with pytest.raises(RunSecretError, match=r"cannot read the run secret file .*missing"):
        RunSecret.from_env()
    monkeypatch.setenv("COSMOS_RUN_SECRET", "short")
    with pytest.raises(RunSecretError, match=r"\$COSMOS_RUN_SECRET: .*at least 16 bytes"):
        RunSecret.from_env()


def test_the_secret_never_shows_itself():
    key = "very-secret-value-" + "9" * 20
    secret = RunSecret(key)
    assert key not in repr(secret) and key not in str(secret) and key not in f"{secret}"
    with pytest.raises(TypeError, match="not pickled"):
        pickle.dumps(secret)
    assert key.encode() not in secret.sign("k", b"body")


def test_rate_limited_log_holds_back_and_counts(caplog):
    limited = RateLimitedLog(logging.getLogger("test.ratelimit"), interval_s=60)
    with caplog.at_level(logging.WARNING):
        for i in range(1000):
            limited.warning("kind", "bad message %d", i)
    assert [r.getMessage() for r in caplog.records] == ["bad message 0"] and limited.lines == 1
