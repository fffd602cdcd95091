"""``[train.ckpt]``: resume checkpoints, safetensors export and uploads."""

from __future__ import annotations

from typing import Literal

from cosmos_primitives.config.base import Section


class CheckpointConfig(Section):
    """``[train.ckpt]``: resume checkpoints, safetensors export and uploads.

    ``upload_s3``: ``false``, ``"final"`` (only the final export) or ``"all"`` (every checkpoint
    and export); ``true`` means ``"all"``, as in cosmos-rl.
    """

    enable_checkpoint: bool = False
    save_freq: int = 100
    max_keep: int = 2
    save_mode: Literal["async", "sync"] = "async"
    export_safetensors: bool = True
    max_shard_size_gb: float = 4.0
    upload_hf: bool = False
    hf_repo_name: str = ""
    upload_s3: bool | Literal["final", "all"] = False
    s3_bucket: str = ""
    s3_prefix: str = "outputs"
    upload_retries: int = 3
