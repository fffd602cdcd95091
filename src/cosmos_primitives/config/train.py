"""``[train]``: the optimisation loop, its data, and its checkpoints."""

from __future__ import annotations

from typing import Literal

import msgspec

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


class DatasetConfig(Section):
    """``[train.train_policy.dataset]``: a hub name or a local path, and how to read its media."""

    name: str = ""
    subset: str = ""
    revision: str = ""
    split: str = "train"
    media_dir: str = ""
    fps: float = 2.0
    max_pixels: int = 81920
    max_frames: int = 32
    bad_sample_budget: int = 100


class TrainPolicyConfig(Section):
    """``[train.train_policy]``: what is trained (``type``) and on which data.

    The GRPO knobs that older configs spell here (``epsilon_low``, ``kl_beta``, ``loss_type``,
    ``variant``, ...) are aliases of the fields of ``[grpo]``.
    """

    type: Literal["sft", "grpo"] = "sft"
    dataset: DatasetConfig = msgspec.field(default_factory=DatasetConfig)
    conversation_column_name: str = "conversations"
    mini_batch: int = 1


class TrainConfig(Section):
    """``[train]``."""

    epoch: int = 1
    max_steps: int | None = None
    output_dir: str = "./outputs"
    resume: bool | str = False
    seed: int = 42
    train_batch_per_replica: int = 8
    optm_name: Literal["AdamW"] = "AdamW"
    optm_lr: float = 1e-5
    optm_weight_decay: float = 0.01
    optm_betas: list[float] = msgspec.field(default_factory=lambda: [0.9, 0.999])
    optm_warmup_steps: int = 0
    optm_decay_type: Literal["cosine", "linear", "constant"] = "constant"
    optm_min_lr_factor: float = 0.0
    optm_grad_norm_clip: float = 1.0
    sync_weight_interval: int = 1
    ckpt: CheckpointConfig = msgspec.field(default_factory=CheckpointConfig)
    train_policy: TrainPolicyConfig = msgspec.field(default_factory=TrainPolicyConfig)
