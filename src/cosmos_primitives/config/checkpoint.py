"""``[train.ckpt]``: resume checkpoints, safetensors export and uploads."""

from __future__ import annotations

from typing import Literal

from cosmos_primitives.config.base import Positive, Section


class CheckpointConfig(Section):
    """``[train.ckpt]``: resume checkpoints, safetensors export and uploads.

    Resume checkpoints go to ``<run_dir>/checkpoints/step_N/`` (DCP, sharded per rank), safetensors
    exports to ``<run_dir>/safetensors/{step_N,final}/``. Whether to resume is ``[train] resume``.

    - ``save_freq``: save every N optimizer steps (``<= 0``: only when the loop forces a save).
    - ``max_keep``: complete checkpoints kept on disk, the oldest in save order removed first (the
      newest saved is never deleted, whatever its step number); ``-1`` keeps all. Intermediate
      ``safetensors/step_N`` exports are rotated the same way; ``final`` never is.
    - ``save_mode``: ``"async"`` writes in the background (the next save or ``close()`` waits for it),
      ``"sync"`` blocks the loop until the checkpoint is on disk.
    - ``export_safetensors``: write a Hugging Face folder (``from_pretrained`` / vLLM loadable) at
      the end of training, and with ``export_every_save`` also beside every checkpoint, as cosmos-rl does.
    - ``max_shard_size_gb``: largest safetensors shard, in GB (10**9 bytes); ``> 0``.
    - ``export_dtype``: dtype of the exported weights; ``"auto"`` keeps the training dtype.
    - ``upload_s3``: ``false``, ``"final"`` (only the final export) or ``"all"`` (every checkpoint
      and export); ``true`` means ``"all"``, as in cosmos-rl. Keys are
      ``<s3_prefix>/<run name>/<path inside the run dir>``. Credentials and endpoint come from the
      usual ``AWS_*`` variables (``AWS_ENDPOINT_URL`` for S3-compatible stores).
    - ``upload_hf``: push the final export to the Hub repo ``hf_repo_name`` (``HF_TOKEN`` needs
      write access); ``hf_private`` is used only when the repo is created.
    - ``upload_retries``: extra attempts per file (S3) or per folder (Hub) after a failure, waiting
      ``upload_backoff_s`` seconds, doubling each time. A failure past the retries is logged and
      reported by ``close()``; local files are never removed because an upload failed.
    """

    enable_checkpoint: bool = False
    save_freq: int = 100
    max_keep: int = 2
    save_mode: Literal["async", "sync"] = "async"
    export_safetensors: bool = True
    export_every_save: bool = True
    max_shard_size_gb: Positive = 4.0
    export_dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    upload_hf: bool = False
    hf_repo_name: str = ""
    hf_private: bool = True
    upload_s3: bool | Literal["final", "all"] = False
    s3_bucket: str = ""
    s3_prefix: str = "outputs"
    upload_retries: int = 3
    upload_backoff_s: float = 2.0
