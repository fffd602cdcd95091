"""Trainable policies: a HF causal LM / Qwen2.5-VL as a log-prob module, its optimizer and schedule.

An SFT / GRPO step (``cfg`` from ``cp.load_config``, ``mesh = cp.parallel.ParallelMesh(...)``)::

    policy = cp.policy.build_policy(cfg.policy, mesh)               # load, freeze, TP, FSDP2
    optimizer = cp.policy.build_optimizer(policy, cfg.train)
    scheduler = cp.policy.build_lr_scheduler(optimizer, cfg.train, total_steps)
    out = cp.policy.token_logprobs(policy, batch)                   # [B, T] float32 log-probs
    loss, metrics = sft_loss(out.logprobs, batch["labels"], group=mesh.group("dp"))
    loss.backward()
    grad_norm = cp.parallel.clip_grad_norm_(policy.parameters(), cfg.train.optm_grad_norm_clip)
    optimizer.step(); scheduler.step(); optimizer.zero_grad()

(``sft_loss`` is ``cosmos_primitives.algo.sft_objective.sft_loss``.) ``examples/sft.py`` also passes
``loss_weights=cp.algo.sft_token_weights(batch["labels"], group=...)`` to ``token_logprobs`` and
``weighted_sum=out.weighted_sum`` to ``sft_loss``: the same loss, with its gradient computed in the
LM head's forward (one GEMM less per chunk). A GRPO update on a rollout batch is
:func:`grpo_update` (its KL reference :func:`grpo_reference`).
"""

from cosmos_primitives.models.lora import has_lora, merge_lora_state_dict
from cosmos_primitives.policy.build import build_policy
from cosmos_primitives.policy.diffusion import (
    DiffusionPolicy,
    check_text_width,
    shard_transformer,
    text_width,
    transformer_blocks,
)
from cosmos_primitives.policy.diffusion_cp import enable_transformer_context_parallel
from cosmos_primitives.policy.flow_loading import load_flow_model
from cosmos_primitives.policy.flow_update import diffusion_nft_update, flow_grpo_update
from cosmos_primitives.policy.grpo_step import (
    GRPOUpdate,
    GRPOUpdateSettings,
    grpo_micro_batch_loss,
    grpo_reference,
    grpo_update,
    step_slices,
)
from cosmos_primitives.policy.hf_loading import is_vision_language, load_hf_model, load_processor, resolve_dtype
from cosmos_primitives.policy.lm_policy import MODEL_INPUT_KEYS, CausalLMPolicy, token_logprobs
from cosmos_primitives.policy.lora import adapters_disabled, apply_lora
from cosmos_primitives.policy.nonfinite import NonFiniteError, check_finite
from cosmos_primitives.policy.optim import WarmupDecayLR, build_lr_scheduler, build_optimizer
from cosmos_primitives.policy.sft_validation import ValidationLoss, sft_validation_loss, without_labels
from cosmos_primitives.policy.trainable import TrainableSummary, apply_trainable_patterns, trainable_summary
from cosmos_primitives.policy.warmup import sft_warmup

__all__ = [  # the public surface (tests/test_public_surface.py); the rest by module path
    "CausalLMPolicy", "DiffusionPolicy", "GRPOUpdate", "GRPOUpdateSettings", "apply_lora", "build_lr_scheduler",
    "build_optimizer", "build_policy", "check_finite", "check_text_width", "diffusion_nft_update",
    "enable_transformer_context_parallel", "flow_grpo_update", "grpo_reference", "grpo_update", "load_flow_model",
    "load_processor", "resolve_dtype", "sft_validation_loss", "sft_warmup", "step_slices", "token_logprobs",
    "without_labels",
]
