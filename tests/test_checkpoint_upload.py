"""Uploads: S3 against moto's server mode (a real HTTP server on loopback, started here) and the
Hugging Face Hub against a stand-in for ``HfApi`` with the same method signatures (the Hub cannot
be reached from tests)."""

from __future__ import annotations

import inspect
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

from cosmos_primitives.checkpoint import CheckpointManager
from cosmos_primitives.checkpoint.s3_upload import default_s3_client
from cosmos_primitives.config import CheckpointConfig

BUCKET = "ckpt-bucket"


class InjectedFailure(Exception):
    """Raised by a botocore event hook to simulate a dropped connection."""


@pytest.fixture(scope="module")
def s3_endpoint() -> str:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch):
    """Environment as users set it, pointing at the moto server; a fresh bucket; a client to inspect it."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    client = default_s3_client()
    client.create_bucket(Bucket=BUCKET)
    yield client
    for obj in client.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        client.delete_object(Bucket=BUCKET, Key=obj["Key"])
    client.delete_bucket(Bucket=BUCKET)


def _keys(client) -> set[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
    return {obj["Key"] for page in pages for obj in page.get("Contents", [])}


def _failing_client_factory(failures: int, counter: list[int]):
    """The real client of the environment, whose first ``failures`` PutObject requests fail before sending."""

    def factory():
        client = default_s3_client()

        def maybe_fail(**_: object) -> None:
            counter.append(1)
            if len(counter) <= failures:
                raise InjectedFailure(f"injected failure #{len(counter)}")

        client.meta.events.register("before-send.s3.PutObject", maybe_fail)
        return client

    return factory


def _manager(run_dir: Path, factory=None, hf_api_factory=None, **overrides) -> CheckpointManager:
    torch.manual_seed(0)
    model = nn.Linear(16, 16)
    cfg = CheckpointConfig(**{"enable_checkpoint": True, "save_mode": "sync", "save_freq": 1, "max_keep": 1,
                              "export_every_save": False, "s3_bucket": BUCKET, "s3_prefix": "outputs",
                              "upload_retries": 2, "upload_backoff_s": 0.01, **overrides})
    return CheckpointManager(cfg, run_dir, model=model, optimizer=torch.optim.AdamW(model.parameters()),
                             s3_client_factory=factory, hf_api_factory=hf_api_factory)


def test_s3_upload_all_retries_after_injected_failure(tmp_path: Path, s3) -> None:
    run_dir = tmp_path / "20260101000000"
    calls: list[int] = []
    ckpt = _manager(run_dir, _failing_client_factory(1, calls), upload_s3=True)  # true means "all"
    ckpt.maybe_save(1)
    ckpt.maybe_save(2)
    final = ckpt.export_final()
    failures = ckpt.close()
    assert failures == []
    assert ckpt.uploader.completed == [
        f"s3://{BUCKET}/outputs/20260101000000/checkpoints/step_1",
        f"s3://{BUCKET}/outputs/20260101000000/checkpoints/step_2",
        f"s3://{BUCKET}/outputs/20260101000000/safetensors/final",
    ]
    keys = _keys(s3)
    assert len(calls) == len(keys) + 1  # one PutObject per file, plus the injected failure's retry
    for local in (run_dir / "checkpoints" / "step_2", final):
        for f in local.rglob("*"):
            if f.is_file():
                key = f"outputs/20260101000000/{f.relative_to(run_dir).as_posix()}"
                assert key in keys, key
                assert s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == f.read_bytes()
    assert any(k.startswith("outputs/20260101000000/checkpoints/step_1/") for k in keys)
    # step_1 was kept on disk while its upload ran and rotated away (max_keep = 1) afterwards
    assert [p.name for p in ckpt.checkpoints()] == ["step_2"]


def test_s3_failure_after_retries_is_reported_and_local_files_kept(tmp_path: Path, s3) -> None:
    run_dir = tmp_path / "20260101000000"
    calls: list[int] = []
    ckpt = _manager(run_dir, _failing_client_factory(10**6, calls), upload_s3="final", upload_retries=1)
    ckpt.maybe_save(1)  # "final": checkpoints are not uploaded
    final = ckpt.export_final()
    failures = ckpt.close()
    assert failures, "the upload should have failed"
    assert {f.destination for f in failures} == {f"s3://{BUCKET}/outputs/20260101000000/safetensors/final"}
    assert all(f.attempts == 2 and "InjectedFailure" in f.error for f in failures)
    assert (final / "model.safetensors.index.json").is_file()
    assert _keys(s3) == set()


def test_upload_config_errors_before_training(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="s3_bucket is empty"):
        _manager(tmp_path, upload_s3="all", s3_bucket="")
    with pytest.raises(ValueError, match="hf_repo_name is empty"):
        _manager(tmp_path, upload_hf=True, hf_repo_name="", hf_api_factory=lambda: None)


class StandInHfApi:
    """Stand-in for ``huggingface_hub.HfApi``'s two methods the uploader calls: it copies the folder
    into ``root/<repo_id>`` and fails the first ``fail_uploads`` uploads. Each call's positional and
    keyword arguments are kept in ``raw`` so that they can be bound to the real ``HfApi`` signatures."""

    def __init__(self, root: Path, user: str = "someone", fail_uploads: int = 0) -> None:
        self.root, self.user, self.fail_uploads = root, user, fail_uploads
        self.calls: list[tuple[str, dict]] = []
        self.raw: list[tuple[str, tuple, dict]] = []

    def create_repo(self, repo_id, *, private=None, repo_type=None, exist_ok=False, **rest):
        from huggingface_hub import RepoUrl

        self.raw.append(("create_repo", (repo_id,), {"private": private, "repo_type": repo_type,
                                                     "exist_ok": exist_ok, **rest}))
        self.calls.append(("create_repo", {"repo_id": repo_id, "private": private, "repo_type": repo_type,
                                           "exist_ok": exist_ok}))
        full = repo_id if "/" in repo_id else f"{self.user}/{repo_id}"
        return RepoUrl(f"https://huggingface.co/{full}")

    def upload_folder(self, *, repo_id, folder_path, path_in_repo=None, repo_type=None, **rest):
        self.raw.append(("upload_folder", (), {"repo_id": repo_id, "folder_path": folder_path,
                                               "path_in_repo": path_in_repo, "repo_type": repo_type, **rest}))
        self.calls.append(("upload_folder", {"repo_id": repo_id, "folder_path": folder_path,
                                             "path_in_repo": path_in_repo, "repo_type": repo_type}))
        if self.fail_uploads > 0:
            self.fail_uploads -= 1
            raise ConnectionError("injected: Hub unreachable")
        shutil.copytree(folder_path, self.root / repo_id / (path_in_repo or ""), dirs_exist_ok=True)


def test_stand_in_matches_hfapi_signatures(tmp_path: Path) -> None:
    """The calls the uploader really makes bind to the installed ``HfApi`` (same parameter names,
    positional / keyword-only kinds); other ``HfApi`` parameters, which we never pass, may come and go."""
    from huggingface_hub import HfApi

    api = StandInHfApi(tmp_path / "hub")
    ckpt = _manager(tmp_path / "20260101000000", upload_hf=True, hf_repo_name="Cosmos-Reason1",
                    hf_api_factory=lambda: api)
    ckpt.maybe_save(1)
    ckpt.export_final()
    assert ckpt.close() == []
    assert [name for name, _, _ in api.raw] == ["create_repo", "upload_folder"]
    for method, args, kwargs in api.raw:
        real = inspect.signature(getattr(HfApi, method))
        try:
            bound = real.bind(HfApi(), *args, **kwargs)
        except TypeError as error:
            raise AssertionError(f"HfApi.{method} no longer accepts the arguments we pass: {error}") from None
        assert set(kwargs) <= set(bound.arguments), method
        assert bound.arguments["repo_id"] == (args[0] if args else kwargs["repo_id"]), method


def test_hf_upload_of_final_export(tmp_path: Path) -> None:
    api = StandInHfApi(tmp_path / "hub", fail_uploads=1)
    ckpt = _manager(tmp_path / "20260101000000", upload_hf=True, hf_repo_name="Cosmos-Reason1",
                    hf_api_factory=lambda: api)
    ckpt.maybe_save(1)
    final = ckpt.export_final()
    assert ckpt.close() == []
    assert api.calls[0] == ("create_repo", {"repo_id": "Cosmos-Reason1", "private": True, "repo_type": "model",
                                            "exist_ok": True})
    uploads = [kw for name, kw in api.calls if name == "upload_folder"]
    assert len(uploads) == 2  # one injected failure, one retry
    assert uploads[-1] == {"repo_id": "someone/Cosmos-Reason1", "folder_path": str(final), "path_in_repo": None,
                           "repo_type": "model"}
    pushed = tmp_path / "hub" / "someone" / "Cosmos-Reason1"
    assert sorted(p.name for p in pushed.iterdir()) == sorted(p.name for p in final.iterdir())
