"""Upload target for S3 and S3-compatible stores (boto3, extra ``s3``)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cosmos_primitives.checkpoint.uploader import UploadUnit
from cosmos_primitives.utils.extras import require


def default_s3_client() -> Any:
    """A boto3 S3 client configured from the environment users already set.

    ``AWS_ENDPOINT_URL`` (S3-compatible stores; empty means AWS), ``AWS_ACCESS_KEY_ID``,
    ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION`` are read by boto3's own credential chain;
    the endpoint is passed explicitly so that older boto3 versions honour it too.
    """
    boto3 = require("boto3", "uploading checkpoints to S3")
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or None
    return boto3.client("s3", endpoint_url=endpoint)


class S3Target:
    """Uploads every file of a folder to ``s3://<bucket>/<prefix>/<dest>/<relative path>``, one unit per file.

    Args:
        bucket: ``[train.ckpt] s3_bucket``.
        prefix: ``[train.ckpt] s3_prefix`` (leading / trailing slashes are ignored).
        client_factory: returns a boto3 S3 client; default :func:`default_s3_client`. Called once, on
            the upload thread.
    """

    def __init__(self, bucket: str, prefix: str = "", client_factory: Callable[[], Any] | None = None) -> None:
        if not bucket:
            raise ValueError("[train.ckpt] upload_s3 is set but s3_bucket is empty: set s3_bucket = '<bucket name>'")
        require("boto3", "uploading checkpoints to S3")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._client_factory = client_factory or default_s3_client
        self._client: Any = None
        self._lock = threading.Lock()

    def key_prefix(self, dest: str) -> str:
        return "/".join(part for part in (self.prefix, dest.strip("/")) if part)

    def describe(self, dest: str) -> str:
        return f"s3://{self.bucket}/{self.key_prefix(dest)}"

    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = self._client_factory()
            return self._client

    def plan(self, local_dir: Path, dest: str) -> list[UploadUnit]:
        if not local_dir.is_dir():
            raise FileNotFoundError(f"{local_dir} does not exist (was it deleted before its upload ran?)")
        files = sorted(p for p in local_dir.rglob("*") if p.is_file())
        base = self.key_prefix(dest)
        return [(str(p.relative_to(local_dir)), self._uploader(p, f"{base}/{p.relative_to(local_dir).as_posix()}"))
                for p in files]

    def _uploader(self, path: Path, key: str) -> Callable[[], None]:
        def upload() -> None:
            # upload_file switches to multipart uploads for large shards on its own
            self.client().upload_file(str(path), self.bucket, key)

        return upload
