"""Upload target for the Hugging Face Hub (huggingface_hub, extra ``hub``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cosmos_primitives.checkpoint.uploader import UploadUnit
from cosmos_primitives.utils.extras import require


def default_hf_api() -> Any:
    """``huggingface_hub.HfApi`` authenticated with ``HF_TOKEN`` (needs write access)."""
    hub = require("huggingface_hub", "uploading to the Hugging Face Hub")
    return hub.HfApi(token=os.environ.get("HF_TOKEN") or None)


class HubTarget:
    """Pushes a whole folder to a model repo in one commit (``create_repo`` + ``upload_folder``).

    Args:
        repo_name: ``[train.ckpt] hf_repo_name``; without a namespace the repo is created under the
            token's user, as ``HfApi.create_repo`` does.
        private: visibility when the repo is created (an existing repo keeps its own).
        api_factory: returns an object with ``HfApi``'s ``create_repo`` and ``upload_folder``
            methods; default :func:`default_hf_api`. Tests pass a stand-in with the same signatures.
    """

    def __init__(self, repo_name: str, private: bool = True, api_factory: Callable[[], Any] | None = None) -> None:
        if not repo_name:
            raise ValueError("[train.ckpt] upload_hf = true but hf_repo_name is empty: set hf_repo_name = '<repo>'")
        if api_factory is None:
            require("huggingface_hub", "uploading to the Hugging Face Hub")
        self.repo_name = repo_name
        self.private = private
        self._api_factory = api_factory or default_hf_api

    def describe(self, dest: str) -> str:
        inside = f"/{dest.strip('/')}" if dest.strip("/") else ""
        return f"hf://{self.repo_name}{inside}"

    def plan(self, local_dir: Path, dest: str) -> list[UploadUnit]:
        if not local_dir.is_dir():
            raise FileNotFoundError(f"{local_dir} does not exist (was it deleted before its upload ran?)")

        def push() -> None:
            api = self._api_factory()
            repo = api.create_repo(self.repo_name, private=self.private, repo_type="model", exist_ok=True)
            api.upload_folder(
                repo_id=getattr(repo, "repo_id", None) or self.repo_name,
                folder_path=str(local_dir),
                path_in_repo=dest.strip("/") or None,
                repo_type="model",
                commit_message=f"Upload {local_dir.name} from cosmos_primitives",
            )

        return [("upload_folder", push)]
