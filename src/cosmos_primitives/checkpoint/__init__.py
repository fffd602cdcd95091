"""Resume checkpoints (DCP, sharded, atomic, checksummed, rotated in save order, sync or async),
Hugging Face safetensors export (diffusers folders for flow transformers), background uploads to S3
and the Hugging Face Hub, and preemption: a SIGTERM / SIGUSR1 saves a checkpoint before the run stops
(Ctrl-C stops at once, keeps the checkpoints whole and prints the resume command).

Names load on first use, so ``import cosmos_primitives.checkpoint`` stays cheap; boto3 and
huggingface_hub (extras ``s3`` and ``hub``) are imported only when an upload is configured.
"""

from __future__ import annotations

from cosmos_primitives.utils.lazy_module import lazy_exports

_EXPORTS = {
    "CheckpointManager": "cosmos_primitives.checkpoint.manager",
    "PAUSE_ENV": "cosmos_primitives.checkpoint.manager",
    "TrainState": "cosmos_primitives.checkpoint.train_state",
    "export_safetensors": "cosmos_primitives.checkpoint.safetensors_export",
    "export_diffusers": "cosmos_primitives.checkpoint.diffusers_export",
    "final_export_dir": "cosmos_primitives.checkpoint.layout",
    "find_latest_checkpoint": "cosmos_primitives.checkpoint.layout",
    "list_checkpoints": "cosmos_primitives.checkpoint.layout",
    "verify_checkpoint": "cosmos_primitives.checkpoint.manifest",
    "Verification": "cosmos_primitives.checkpoint.manifest",
    "Preemption": "cosmos_primitives.checkpoint.preemption",
    "start_run": "cosmos_primitives.checkpoint.run_start",
    "PREEMPTED_EXIT_CODE": "cosmos_primitives.checkpoint.preemption",
    "INTERRUPTED_EXIT_CODE": "cosmos_primitives.checkpoint.interrupt",
    "exit_on_interrupt": "cosmos_primitives.checkpoint.interrupt",
    "resume_command": "cosmos_primitives.checkpoint.interrupt",
    "Uploader": "cosmos_primitives.checkpoint.uploader",
    "UploadFailure": "cosmos_primitives.checkpoint.uploader",
    "UploadTarget": "cosmos_primitives.checkpoint.uploader",
    "S3Target": "cosmos_primitives.checkpoint.s3_upload",
    "HubTarget": "cosmos_primitives.checkpoint.hub_upload",
}

__all__ = [  # the public surface (tests/test_public_surface.py); the rest by module path
    "CheckpointManager", "Preemption", "exit_on_interrupt", "export_diffusers", "final_export_dir",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
