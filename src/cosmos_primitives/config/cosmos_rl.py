# ruff: noqa: E501  (the table below keeps one cosmos-rl key per line)
"""How every key of cosmos-rl's config class is read here: the one table behind the loader, the
migration report (``python -m cosmos_primitives.migrate``) and ``docs/from_cosmos_rl.md``.

The source of truth for cosmos-rl's keys, meanings and defaults is its config class
(``cosmos_rl/policy/config/__init__.py`` in nvidia-cosmos/cosmos-rl). Each key that applies to LLM /
VLM SFT and GRPO is one of:

- ``mapped``: read as the key named in the note (the same name unless said otherwise), same meaning;
  when cosmos-rl's default differs from ours, a file read as cosmos-rl style (:func:`file_style`)
  gets cosmos-rl's default for it (:func:`cosmos_rl_defaults`);
- ``ignored``: accepted, changes nothing here (speed-only or launcher-only); the loader lists such
  keys in one warning with the reason;
- ``refused``: the file loads (so it can be inspected and migrated), but a value that asks for
  something this library cannot do is recorded in ``Config.unsupported`` and the recipes stop at
  start-up (``cp.config.check_runnable``) with the note saying what to do instead.

A key whose value is one of its ``noop`` values asks for nothing (``fsdp_offload = false``) and is
dropped silently. Sections for other kinds of model (``[distillation]``, ``[vla]``,
``[policy.diffusers]``) are refused as a whole; cosmos-rl's world-model files (``[policy]
is_diffusers`` / ``[policy.diffusers]``, or its Cosmos-Predict2.5 trainer's tables) are read by
``config/cosmos_rl_wfm.py`` instead, before this table is consulted.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from cosmos_primitives.config.cosmos_rl_custom import read_custom_dataset

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

How = Literal["mapped", "ignored", "refused"]

SPEED = "speed-only"
LAUNCH = "launcher-only"


@dataclass(frozen=True)
class KeyRule:
    """How one cosmos-rl key is read. ``default``: cosmos-rl's (None where it has none)."""

    key: str
    default: Any
    how: How
    note: str
    noop: tuple[Any, ...] = ()


# key | cosmos-rl default (TOML, "-" = none) | how | values asking for nothing (TOML array, "-") | note.
# mapped: the note starts with our key ("=" when it is the same key); ignored: why; refused: what to do.
_TABLE = r"""
redis | "" | ignored | - | launcher-only: the cosmos-rl controller's Redis port; the trainer and rollout jobs take --redis (examples/run_jobs_local.sh starts a private one)
eth_ips | "" | ignored | - | launcher-only: controller addresses; torchrun places the ranks
mode | "disaggregated" | ignored | - | launcher-only: pick the recipe instead (examples/grpo_vlm.py shares GPUs; examples/run_jobs_local.sh starts the trainer and rollout jobs on GPUs of their own)
controller_execution_id | - | ignored | - | launcher-only: the controller's attempt fence
custom | - | mapped | - | = (free-form table for your own code)
train.train_policy.type | - | mapped | - | =
train.train_policy.trainer_type | "sft" | refused | ["sft", "grpo"] | a custom trainer class does not load here: give the recipe a dataset / reward plug-in, or write a loop from library calls
train.train_policy.dataset.name | "" | mapped | - | =
train.train_policy.dataset.subset | "" | mapped | - | =
train.train_policy.dataset.revision | "" | mapped | - | =
train.train_policy.dataset.split | "" | mapped | - | = (a list of splits is read as "a+b", the concatenation)
train.train_policy.dataset.test_size | - | mapped | - | = (with validation.enable and no validation.dataset.name, SFT and colocated GRPO (examples/grpo_vlm.py) validate on the items (int) or fraction (float, rounded up) held out of training, unset 0.1 as in cosmos-rl; drawn at random seeded by train.seed, where cosmos-rl takes the first / last rows; 0 holds nothing out, so validation then needs validation.dataset.name, as in cosmos-rl)
train.train_policy.dataset.local_dir | "" | refused | [""] | set train.train_policy.dataset.name to the local folder or file
train.train_policy.mini_batch | 2 | mapped | - | = (sequences per forward / backward; ours defaults to 1)
train.train_policy.dataloader_shuffle | true | mapped | - | = (false: the dataset's own order, each rank taking every dp-th item)
train.train_policy.dataloader_seed | 0 | mapped | - | = (the data order's seed: a permutation per epoch seeded seed + epoch, as torch's DistributedSampler; ours unset: train.seed)
train.train_policy.dataloader_batch_size | 1 | ignored | - | speed-only: loader batching
train.train_policy.enable_dataset_cache | false | ignored | - | speed-only: dataset caching
train.train_policy.dataloader_num_workers | 0 | ignored | - | speed-only: loader worker processes
train.train_policy.dataloader_prefetch_factor | - | ignored | - | speed-only: loader prefetch
train.train_policy.dataloader_drop_last | true | ignored | - | speed-only: the SFT loader always forms full steps
train.train_policy.data_dispatch_as_rank_in_mesh | false | ignored | - | launcher-only: data dispatch between replicas
train.train_policy.conversation_column_name | "conversations" | mapped | - | =
train.train_policy.system_prompt | "" | mapped | - | train.train_policy.dataset.system_prompt
train.train_policy.balance_dp_token | true | ignored | - | speed-only: token balancing between data-parallel ranks
train.train_policy.enable_dp_load_balancing | false | ignored | - | speed-only: load balancing
train.train_policy.load_balanced_pool_size | 32 | ignored | - | speed-only: load balancing
train.train_policy.load_balanced_max_tokens_for_batch | - | ignored | - | speed-only: load balancing
train.train_policy.load_balanced_batching_strategy | "prefer_closest" | ignored | - | speed-only: load balancing
train.train_policy.load_balanced_batches_per_optimizer_step | 1 | ignored | - | speed-only: load balancing
train.train_policy.dataloader_broadcast | false | ignored | - | speed-only: loader broadcast
train.train_policy.variant | "grpo" | mapped | - | grpo.variant
train.train_policy.prompt_column_name | "" | mapped | - | = (the prompt column: a string (plain text used as it is, as cosmos-rl's text models take it) or a conversation per row, cp.data.ColumnPromptDataset; a dataset plug-in reads it itself)
train.train_policy.response_column_name | "" | mapped | - | = (the reference answer the rewards get; read as prompt_column_name)
train.train_policy.reward_function | ["single_choice"] | mapped | - | grpo.reward_function (a name or list: weight 1 each; ours defaults to single_choice + format)
train.train_policy.use_remote_reward | false | refused | [false] | use [remote_reward] (the reward service client)
train.train_policy.remote_reward | - | refused | - | use [remote_reward] (the reward service client)
train.train_policy.filter_reward_metric | [] | refused | [[]] | filter rewards in your reward function
train.train_policy.bypass_reward | false | refused | [false] | drop the reward functions from grpo.reward_function instead
train.train_policy.group_reward_calculation | false | refused | [false] | register a group reward (cp.rewards) instead
train.train_policy.temperature | 1.0 | mapped | - | grpo.temperature (the trainer scores logits / temperature; ours unset: the rollout's sampling temperature; a cosmos-rl file gets 1.0)
train.train_policy.epsilon_low | 0.2 | mapped | - | grpo.epsilon_low
train.train_policy.epsilon_high | 0.2 | mapped | - | grpo.epsilon_high
train.train_policy.advantage_low | -5.0 | refused | [-5.0] | advantages are not clipped here; remove the key
train.train_policy.advantage_high | 5.0 | refused | [5.0] | advantages are not clipped here; remove the key
train.train_policy.positive_nll_coef | - | mapped | - | grpo.positive_nll_coef
train.train_policy.lower_bound_ratio | 3.0 | mapped | - | grpo.dual_clip_c
train.train_policy.loss_type | "token-mean" | mapped | - | grpo.loss_type
train.train_policy.unbiased_loss_max_tokens | - | mapped | - | grpo.unbiased_loss_max_tokens
train.train_policy.unbiased_advantage | false | mapped | - | grpo.advantage_estimator ("drgrpo" when true)
train.train_policy.algo | "grpo" | refused | ["grpo"] | choose the policy loss with grpo.policy_loss / grpo.variant
train.train_policy.overlong_reward.enable_overlong_penalty | false | mapped | - | grpo.overlong_reward.enable_overlong_penalty
train.train_policy.overlong_reward.buffer_length | 4096 | mapped | - | grpo.overlong_reward.buffer_length
train.train_policy.overlong_reward.penalty_factor | 1.0 | mapped | - | grpo.overlong_reward.penalty_factor
train.train_policy.kl_beta | 0.0 | mapped | - | grpo.kl_beta
train.train_policy.unbiased_kl_estimate | false | refused | [false] | set grpo.kl_estimator
train.train_policy.off_policy_masking_delta | - | mapped | - | grpo.off_policy_masking_delta
train.train_policy.aipo_rho | - | mapped | - | grpo.aipo_rho
train.train_policy.mu_iterations | 1 | mapped | - | grpo.mu_iterations
train.train_policy.batch_size_per_optimize | - | refused | - | one optimizer step per GRPO step here: set train.train_batch_per_replica
train.train_policy.max_token_len_per_mini_batch | - | ignored | - | speed-only: token-budgeted mini-batches
train.train_policy.entropy_coeff | 0.0 | mapped | - | grpo.entropy_coeff
train.train_policy.allowed_outdated_steps | 4 | mapped | - | grpo.allowed_outdated_steps (0 with on_policy; raised to train.sync_weight_interval - 1 when below it, as cosmos-rl)
train.train_policy.on_policy | false | mapped | - | grpo.on_policy (true forces allowed_outdated_steps = 0, as cosmos-rl)
train.train_policy.uncentralized_training | false | ignored | - | launcher-only: controller layout
train.train_policy.outdated_rollout_fetch_batch_size | 0 | ignored | - | speed-only: queue fetch size
train.train_policy.max_inflight_steps | - | ignored | - | launcher-only: controller scheduling
train.train_policy.min_filter_prefix_tokens | - | mapped | - | grpo.min_filter_prefix_tokens (cp.algo.prefix_filter)
train.train_policy.max_retry_for_on_policy | -1 | ignored | - | launcher-only: controller retries
train.train_policy.reference_reset_interval | - | refused | - | the KL reference is fixed here; remove the key
train.train_policy.reset_optimizer_with_reference | true | ignored | - | only acts with reference_reset_interval
train.train_policy.use_decoupled_loss | false | refused | [false] | set grpo.behav_imp_weight_cap (the decoupled loss)
train.train_policy.behav_imp_weight_cap | - | mapped | - | grpo.behav_imp_weight_cap (= grpo.rollout_correction "mis" with rollout_is_lower 0, rollout_is_cap the cap: weights exp(old - rollout), 0 above the cap)
train.train_policy.rollout_as_token_ids | false | ignored | - | speed-only: records carry token ids here anyway
train.train_policy.collect_rollout_logprobs | false | ignored | - | records always carry the engine's log-probs here
train.train_policy.use_rollout_logprobs_for_loss | false | mapped | - | grpo.old_logprobs ("rollout" when true, else "recompute"; ours defaults to "rollout")
train.train_policy.dpo_reference_policy | false | ignored | - | only acts with trainer_type = "dpo" (refused)
train.optm_name | "AdamW" | mapped | - | =
train.optm_lr | 1e-6 | mapped | - | = (ours defaults to 1e-5)
train.optm_impl | "fused" | mapped | - | = (AdamW kernels: "fused" where torch has them for the parameters' device, else "foreach"; one value, not a list per model part)
train.optm_weight_decay | 0.01 | mapped | - | =
train.optm_betas | [0.9, 0.999] | mapped | - | =
train.optm_warmup_steps | 20 | mapped | - | = (a float <= 1 is a fraction of the total steps; clamped to the total steps; lr = peak x step / (W - 1) from 0, cosmos-rl's schedule, ours too; ours defaults to 0)
train.optm_warmup_start_factor | 0.0 | refused | [0.0] | warmup starts at 0 here; remove the key
train.optm_decay_ratio | - | refused | - | decay runs over all steps after warmup here; remove the key
train.optm_decay_type | - | mapped | - | = ("cosine", "linear", "sqrt"; unset or "none": "constant", ours' default)
train.optm_min_lr_factor | 0.0 | mapped | - | =
train.optm_grad_norm_clip | 1.0 | mapped | - | =
train.ema_enable | false | refused | [false] | EMA weights are not kept here; remove the key
train.ema_decay | 0.9999 | ignored | - | only acts with ema_enable
train.ema_update_step_interval | 0 | ignored | - | only acts with ema_enable
train.master_dtype | "float32" | mapped | - | = ("bfloat16": bf16 master weights, float32 AdamW math with stochastic rounding)
train.param_dtype | "bfloat16" | mapped | - | policy.dtype
train.transfer_dtype | - | mapped | - | disaggregated.transfer_dtype (unset in a cosmos-rl file: train.master_dtype, as cosmos-rl)
train.logprob_dtype | "float32" | refused | ["float32"] | log-probs are computed in float32 here; remove the key
train.fsdp_reduce_dtype | "float32" | ignored | - | speed-only: gradient reduce dtype
train.fsdp_offload | false | mapped | - | = (FSDP2 CPUOffloadPolicy: parameters, gradients and optimizer state in host memory)
train.fsdp_reshard_after_forward | "default" | mapped | - | = ("default": as cosmos-rl's (every block but the last reshards) with a shard group of 2+ ranks or fsdp_offload; with one shard rank nothing reshards (cheaper, same results); the root unit stays gathered through the backward)
train.train_batch_per_replica | 8 | mapped | - | = (per data-parallel rank and optimizer step, SFT's meaning in cosmos-rl too (n_init_replicas > 1: shared by the replica's ranks, as its multi-replica worker); GRPO: a replica's rollouts per step shared by its dp ranks, b = it / dp per rank, each generation lcm(b, n_generation) / n_generation prompts (grpo.rollout_batch_size) trained in steps of b rollouts (grpo.rollouts_per_step))
train.fp8.enable_fp8 | false | refused | [false] | FP8 training is not supported; remove [train.fp8]
train.fp8.fp8_recipe | "dynamic_scaling" | ignored | - | only acts with enable_fp8
train.fp8.quant_recipe | "rowwise" | ignored | - | only acts with enable_fp8
train.fp4.enable_fp4 | false | refused | [false] | FP4 training is not supported; remove [train.fp4]
train.fp4.fp4_recipe | "dynamic_scaling" | ignored | - | only acts with enable_fp4
train.fp4.quant_recipe | "rowwise" | ignored | - | only acts with enable_fp4
train.ckpt.enable_checkpoint | false | mapped | - | =
train.ckpt.save_freq | 20 | mapped | - | = (ours defaults to 100)
train.ckpt.save_freq_in_epoch | 0 | refused | [0] | save by steps (train.ckpt.save_freq)
train.ckpt.save_mode | "async" | mapped | - | =
train.ckpt.max_keep | 5 | mapped | - | = (ours defaults to 2)
train.ckpt.export_safetensors | true | mapped | - | =
train.ckpt.upload_hf | false | mapped | - | =
train.ckpt.hf_repo_name | "Comos-Reason1" | mapped | - | = (ours defaults to "")
train.ckpt.upload_s3 | false | mapped | - | =
train.ckpt.s3_bucket | - | mapped | - | =
train.ckpt.s3_prefix | "outputs" | mapped | - | =
train.resume | false | mapped | - | =
train.epoch | 1 | mapped | - | =
train.output_dir | "./outputs" | mapped | - | =
train.timestamp | "" | ignored | - | launcher-only: the run folder is named at start
train.epsilon | 1e-6 | mapped | - | train.optm_eps (ours defaults to 1e-8)
train.async_tp_enabled | false | ignored | - | speed-only: async tensor parallelism
train.compile | true | mapped | - | = (torch.compile of every decoder layer, fullgraph; applied on CUDA only; ours defaults to false)
train.sync_weight_interval | 1 | mapped | - | =
train.prefetch_payloads | false | ignored | - | speed-only: payload lookahead
train.p2p_sync_pack_tensors | false | ignored | - | speed-only: weight-sync packing
train.p2r_sync_groups_per_round | 0 | ignored | - | speed-only: weight-sync grouping
train.coalesce_weight_sync | false | ignored | - | speed-only: weight-sync batching
train.deterministic | false | ignored | - | speed-only: deterministic kernels
train.activation_offload | false | ignored | - | speed-only: activation offload
train.fa_version | - | ignored | - | speed-only: flash-attention version
train.seed | - | mapped | - | = (unset: a seed drawn at start-up, the same on every rank, logged; ours defaults to 42)
train.local_dataset | true | ignored | - | launcher-only: dataset download placement
train.force_use_hf | false | ignored | - | speed-only: model implementation (always transformers here)
train.non_text | false | ignored | - | launcher-only: non-text trainers
train.max_num_steps | - | mapped | - | train.max_steps
train.sequence_packing | false | mapped | - | train.train_policy.sequence_packing (ours defaults to true)
train.save_ckpt_at_exit | true | mapped | - | = (a signal of signal_to_handle saves a checkpoint at the next step boundary, then the run stops with exit status 75; cp.checkpoint.Preemption)
train.signal_to_handle | ["SIGUSR1"] | mapped | - | = (ours defaults to ["SIGUSR1", "SIGTERM"] for every file: without cosmos-rl's launcher, SIGTERM is what a scheduler sends the training process itself)
train.enable_validation | false | ignored | - | an older cosmos-rl spelling, gone from its config class since 2025-09: cosmos-rl ignores it (no validation ran), so it is ignored here too; set validation.enable to validate (config.train.enable_validation reads validation.enable, as Cosmos-Reason1's dataset scripts expect)
train.validation_step | 20 | ignored | - | an older cosmos-rl spelling, gone from its config class: cosmos-rl ignores it; set validation.freq
train.validation_batch_per_replica | - | ignored | - | an older cosmos-rl spelling of validation batching (speed-only), gone from its config class
rollout.enforce_eager | true | mapped | - | =
rollout.include_stop_str_in_output | false | mapped | - | =
rollout.gpu_memory_utilization | 0.8 | mapped | - | = (ours defaults to 0.7)
rollout.enable_chunked_prefill | false | ignored | - | speed-only: vLLM scheduling
rollout.max_response_length | 2048 | mapped | - | = (ours defaults to 1024)
rollout.n_generation | 16 | mapped | - | grpo.num_samples_per_prompt (ours defaults to 8)
rollout.n_generation_to_batch | false | ignored | - | speed-only: generation batching
rollout.n_generation_mini_batch | - | ignored | - | speed-only: generation batching
rollout.batch_size | 1 | mapped | - | = (prompts per generate call there, sequences here: a cosmos-rl file's value is multiplied by n_generation)
rollout.quantization | "none" | refused | ["none"] | quantized rollout is not supported; remove the key
rollout.seed | - | mapped | - | =
rollout.sampling_config.temperature | 1.0 | mapped | - | =
rollout.sampling_config.top_p | 1.0 | mapped | - | =
rollout.sampling_config.top_k | -1 | mapped | - | =
rollout.sampling_config.repetition_penalty | 1.0 | mapped | - | =
rollout.sampling_config.use_flashinfer | false | ignored | - | speed-only: sampling kernel
rollout.vllm_use_flashinfer | false | ignored | - | speed-only: sampling kernel
rollout.backend | "vllm" | mapped | - | = ("vllm" or "hf"; other engines are refused; unset in any file: vLLM when it is installed and a GPU is present, else hf, logged)
rollout.multi_turn_config.enable | false | refused | [false] | multi-turn rollouts are not supported; remove [rollout.multi_turn_config]
rollout.multi_turn_config.enable_tools | false | ignored | - | only acts with multi-turn rollouts
rollout.multi_turn_config.enable_thinking | false | ignored | - | only acts with multi-turn rollouts
rollout.multi_turn_config.custom_chat_template_path | - | ignored | - | only acts with multi-turn rollouts
rollout.multi_turn_config.max_assistant_turns | 5 | ignored | - | only acts with multi-turn rollouts
rollout.multi_turn_config.add_generation_prompt | true | ignored | - | only acts with multi-turn rollouts
rollout.multi_turn_config.continue_final_message | false | ignored | - | only acts with multi-turn rollouts
rollout.mode | "sync" | ignored | - | launcher-only: rollout worker mode
rollout.async_config.max_concurrent_requests | 10 | ignored | - | launcher-only: rollout worker mode
rollout.async_r2r_sync | "disabled" | ignored | - | launcher-only: rollout-to-rollout weight sync
rollout.prefetch_rollout | false | ignored | - | speed-only: prefetching
rollout.prefetch_queue_maxsize | 2 | ignored | - | speed-only: prefetching
rollout.broadcast_all_params | false | ignored | - | speed-only: weight sync
rollout.completion_admission | false | ignored | - | launcher-only: the controller's completion reporting
rollout.r2r_sync_pack_tensors | false | ignored | - | speed-only: rollout-to-rollout weight sync
rollout.r2r_sync_bucket_size_bytes | 536870912 | ignored | - | speed-only: rollout-to-rollout weight sync
policy.diffusers | - | refused | - | diffusion models: use examples/wfm_rl.py and its [wfm] section
policy.is_diffusers | false | refused | [false] | diffusion models: use examples/wfm_rl.py and its [wfm] section
policy.model_name_or_path | "Qwen/Qwen2.5-VL-7B-Instruct" | mapped | - | = (ours has no default)
policy.model_safetensor_path | - | refused | - | point policy.model_name_or_path at the folder holding the weights
policy.model_revision | - | mapped | - | =
policy.model_max_length | 4096 | mapped | - | =
policy.model_gradient_checkpointing | true | mapped | - | = (ours defaults to false)
policy.lora.r | 8 | mapped | - | = (ours defaults to 32)
policy.lora.lora_names | ["default"] | refused | [["default"]] | one adapter is trained here; remove the key
policy.lora.lora_path | - | refused | - | load the adapter into the model folder first
policy.lora.lora_alpha | 8.0 | mapped | - | = (ours defaults to 64)
policy.lora.lora_dropout | 0.0 | mapped | - | =
policy.lora.target_modules | - | mapped | - | = (ours defaults to the attention projections)
policy.lora.primary_adapter | - | refused | - | one adapter is trained here; remove the key
policy.lora.use_rslora | false | refused | [false] | rank-stabilised LoRA is not supported; scale lora_alpha instead
policy.lora.modules_to_save | - | refused | - | unfreeze those modules with policy.trainable_patterns instead
policy.lora.alpha_pattern | - | refused | - | per-module alpha is not supported; remove the key
policy.lora.r_pattern | - | refused | - | per-module rank is not supported; remove the key
policy.lora.init_lora_weights | true | mapped | - | =
policy.trainable_map | - | refused | - | use policy.trainable_patterns / policy.freeze_patterns (regexes)
policy.freeze_pattern | - | mapped | - | policy.freeze_patterns
policy.trainable_pattern | - | mapped | - | policy.trainable_patterns
policy.enable_liger_kernel | false | ignored | - | speed-only: fused kernels
policy.enable_liger_cross_entropy | false | ignored | - | speed-only: fused kernels
policy.enable_liger_fused_cross_entropy | false | ignored | - | speed-only: fused kernels
policy.aux_loss_coeff | 0.0 | refused | [0.0] | mixture-of-experts auxiliary loss is not supported; remove the key
logging.logger | [] | mapped | - | = (ours defaults to ["console"]; JSONL metrics are written either way)
logging.log_interval | 100 | ignored | - | speed-only: console lines are written every logging.log_freq steps here
logging.multi_modal_log_interval | - | ignored | - | speed-only: media logging
logging.project_name | "cosmos_rl" | mapped | - | =
logging.group_name | - | mapped | - | = (the W&B group)
logging.experiment_name | - | mapped | - | = (the W&B run is named <experiment_name>/<timestamp>, as cosmos-rl; unset: the run folder)
logging.wandb_run_name | - | mapped | - | = (the W&B run's exact name)
logging.wandb_run_id | - | ignored | - | launcher-only: the W&B run id (the run folder's name here)
logging.wandb_resume | "allow" | ignored | - | launcher-only: W&B resumes a run of the same id ("allow" here)
logging.level | - | ignored | - | launcher-only: the log level (COSMOS_LOG_LEVEL)
logging.report_mfu | false | ignored | - | speed-only: MFU reporting
profiler | - | ignored | - | speed-only: profiling (use torch.profiler around a step)
validation.enable | false | mapped | - | = (SFT: token-mean loss of the validation split, logged as val/avg_loss; GRPO, colocated recipe: rewards of one completion per item of validation.dataset, or without its name of the train.train_policy.dataset.test_size items held out of training)
validation.val_before_train | false | mapped | - | = (SFT; the GRPO recipe validates before its first step always)
validation.freq | 20 | mapped | - | =
validation.batch_size | - | ignored | - | speed-only: validation batching
validation.dataset.name | "" | mapped | - | =
validation.dataset.subset | "" | mapped | - | =
validation.dataset.revision | "" | mapped | - | =
validation.dataset.split | "" | mapped | - | =
validation.dataset.test_size | - | refused | - | not read (nor by cosmos-rl's trainers): hold out part of the training data with train.train_policy.dataset.test_size, or point validation.dataset at a smaller split; the recipes stop at start-up when it is set
validation.dataset.local_dir | "" | refused | [""] | set validation.dataset.name to the local folder or file
validation.temperature | 0.0 | mapped | - | =
validation.top_p | - | refused | [1.0] | validation samples with temperature only; remove the key
validation.top_k | 1 | refused | [1, -1] | validation samples with temperature only; remove the key
validation.repetition_penalty | 1.0 | refused | [1.0] | validation samples with temperature only; remove the key
validation.n_generation | 1 | refused | [1] | one completion per item here; remove the key
validation.max_response_length | - | mapped | - | = (unset: rollout.max_response_length)
validation.reward_function | [] | mapped | - | = (empty: the training rewards, grpo.reward_function, as cosmos-rl)
validation.use_remote_reward | - | refused | [false] | use [remote_reward]
validation.remote_reward | - | refused | - | use [remote_reward]
distillation | - | refused | - | distillation is not supported here
vla | - | refused | - | vision-language-action training is not supported here
"""


# [policy.parallelism] and [rollout.parallelism] share cosmos-rl's ParallelismConfig
_PARALLELISM = r"""
{s}.parallelism.n_init_replicas | 1 | ignored | - | launcher-only: torchrun starts the ranks; replicas are data-parallel ranks here
{s}.parallelism.tp_size | 2 | mapped | - | = (ours defaults to 1)
{s}.parallelism.cp_size | 1 | mapped | - | = (policy: Ulysses context parallel over the decoder, heads divisible by cp_size; rollout engines do not split sequences)
{s}.parallelism.ep_size | 1 | refused | [1] | expert parallelism is not supported; remove the key
{s}.parallelism.dp_shard_size | 1 | mapped | - | = (ours defaults to -1: all remaining ranks)
{s}.parallelism.pp_size | 1 | mapped | - | = (above 1 is refused when the mesh is built: pipeline parallelism is not implemented)
{s}.parallelism.pp_dynamic_shape | false | ignored | - | only acts with pp_size > 1
{s}.parallelism.pp_micro_batch_size | 1 | ignored | - | only acts with pp_size > 1
{s}.parallelism.dp_replicate_size | 1 | mapped | - | =
{s}.parallelism.pp_schedule | "Interleaved1F1B" | ignored | - | only acts with pp_size > 1
{s}.parallelism.pp_layers_per_stage | 2 | ignored | - | only acts with pp_size > 1
{s}.parallelism.cp_rotate_method | - | ignored | - | only acts with cp_size > 1
"""


def _toml_value(text: str) -> Any:
    return None if text == "-" else tomllib.loads(f"v = {text}")["v"]


def _parse(table: str) -> dict[str, KeyRule]:
    rules = {}
    for line in filter(None, table.strip().splitlines()):
        key, default, how, noop, note = (part.strip() for part in line.split(" | ", 4))
        assert how in ("mapped", "ignored", "refused"), line
        rules[key] = KeyRule(key, _toml_value(default), how, note, tuple(_toml_value(noop) or ()))  # type: ignore[arg-type]
    return rules


RULES: dict[str, KeyRule] = _parse(_TABLE + "".join(_PARALLELISM.format(s=s) for s in ("policy", "rollout")))
"""cosmos-rl dotted key -> :class:`KeyRule` (a whole section for ``profiler``, ``distillation``, ``vla``,
``policy.diffusers``, ``train.train_policy.remote_reward``, ``validation.remote_reward``)."""


def rule_for(path: str) -> KeyRule | None:
    """The rule of ``path`` or of the section it lies in."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        rule = RULES.get(".".join(parts[:i]))
        if rule is not None:
            return rule
    return None


# cosmos-rl's defaults that differ from ours, given to a cosmos-rl style file for the keys it leaves
# unset (our canonical keys); the table's notes say the same in words
COSMOS_RL_DEFAULTS: dict[str, Any] = {
    "policy.model_name_or_path": "Qwen/Qwen2.5-VL-7B-Instruct",
    "policy.model_gradient_checkpointing": True,
    "policy.parallelism.tp_size": 2,
    "policy.parallelism.dp_shard_size": 1,
    "rollout.parallelism.tp_size": 2,
    "rollout.parallelism.dp_shard_size": 1,
    "train.optm_lr": 1e-6,
    "train.optm_eps": 1e-6,
    "train.optm_warmup_steps": 20,
    "train.compile": True,
    "train.seed": None,  # unseeded there: a seed is drawn at start here (cp.config.check_runnable) and logged
    "train.train_policy.mini_batch": 2,
    "train.train_policy.sequence_packing": False,
    "train.train_policy.dataloader_seed": 0,  # its data order does not follow train.seed
    "train.train_policy.dataset.system_prompt": "",  # an empty system message, not the template's default
    "train.ckpt.save_freq": 20,
    "train.ckpt.max_keep": 5,
    "grpo.num_samples_per_prompt": 16,
    "grpo.reward_function": {"single_choice": 1.0},
    "grpo.old_logprobs": "recompute",
    "grpo.temperature": 1.0,  # the trainer scores logits / 1.0 whatever the rollout sampled at
    "rollout.max_response_length": 2048,
    "rollout.gpu_memory_utilization": 0.8,
    "rollout.batch_size": 1,
    "logging.logger": [],
    "logging.project_name": "cosmos_rl",
}
COSMOS_RL_LORA_DEFAULTS = {"r": 8, "lora_alpha": 8.0}

_ENGINES = ("hf", "vllm")

Style = Literal["cosmos-rl", "cosmos_primitives"]
STYLE_KEY = "config_style"
"""The top-level key that says how a file is read (``"cosmos-rl"`` or ``"cosmos_primitives"``);
cosmos-rl ignores it, so a cosmos-rl file carrying it still runs there. ``dump_config`` writes it."""


@dataclass
class CosmosRLReading:
    """What reading a cosmos-rl style file did: keys ignored (key, why), refused (key -> what to do),
    defaults filled (canonical key -> value), meanings translated (one line each) and why the file
    was read as cosmos-rl's (``style_reason``)."""

    ignored: list[tuple[str, str]]
    refused: dict[str, str]
    defaults: dict[str, Any]
    translated: list[str]
    style_reason: str = ""
    # policy.parallelism.n_init_replicas (launcher-only, taken out of the tree): SFT with several
    # replicas runs cosmos-rl's multi-replica worker, which shares train_batch_per_replica among the dp ranks
    policy_replicas: int = 1

    def warning(self, source: str) -> str:
        """The one start-up message about the file."""
        parts = [f"{source} is read as a cosmos-rl config ({self.style_reason})"]
        if self.ignored:
            parts.append("ignored (no effect here): " + "; ".join(f"{k} ({why})" for k, why in self.ignored))
        if self.defaults:
            parts.append("cosmos-rl defaults for keys it leaves unset: "
                         + ", ".join(f"{k} = {v!r}" for k, v in self.defaults.items()))
        parts += self.translated
        if self.refused:
            refused = "; ".join(f"{k}: {v}" for k, v in self.refused.items())
            parts.append(f"refused (a recipe stops on these): {refused}")
        return ". ".join(parts)


def leaves(tree: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and path not in RULES:
            out += leaves(value, path + ".")
        else:
            out.append((path, value))
    return out


def _get(tree: dict[str, Any], path: str) -> Any:
    node: Any = tree
    for part in path.split("."):
        node = node[part]
    return node


def _has(tree: dict[str, Any], path: str) -> bool:
    try:
        _get(tree, path)
    except (KeyError, TypeError):
        return False
    return True


def _put(tree: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node = tree
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def _drop(tree: dict[str, Any], path: str) -> Any:
    *parents, last = path.split(".")
    node = _get(tree, ".".join(parents)) if parents else tree
    return node.pop(last)


def _drop_empty_tables(tree: dict[str, Any], path: str, is_ours: Any) -> None:
    """Remove the tables above ``path`` that taking it out left empty and that are not tables of ours."""
    parts = path.split(".")[:-1]
    while parts and not is_ours(".".join(parts)) and _get(tree, ".".join(parts)) == {}:
        _drop(tree, ".".join(parts))
        parts.pop()


@functools.cache
def cosmos_rl_tables() -> frozenset[str]:
    """Every table of cosmos-rl's config class ("" for the root), from :data:`RULES`."""
    return frozenset(".".join(key.split(".")[:i]) for key in RULES for i in range(key.count(".") + 1))


def _all_paths(tree: dict[str, Any], prefix: str = "") -> list[str]:
    """Every key of a parsed file, tables included (an empty ``[grpo]`` says as much as a key in it)."""
    out = []
    for key, value in tree.items():
        out.append(f"{prefix}{key}")
        if isinstance(value, dict) and f"{prefix}{key}" not in RULES:
            out += _all_paths(value, f"{prefix}{key}.")
    return out


def _wfm_guide_key(path: str) -> bool:
    """A key of the world-model guide's layout (``[model]``, ``[model_parallel]``): no sign of either style."""
    return path.split(".")[0] in ("model", "model_parallel")


def file_style(tree: dict[str, Any], is_own_key: Callable[[str], bool], is_alias: Callable[[str], bool],
               marker: Any = None) -> tuple[Style, str, bool]:
    """How a parsed file is read, decided once for the whole file: ``(style, why, written_for_cosmos_rl)``.

    1. ``config_style = "cosmos-rl"`` / ``"cosmos_primitives"`` at the top of the file decides.
    2. Else a key only cosmos-rl's config class has (``train.epsilon``, ``rollout.n_generation``, GRPO
       knobs under ``[train.train_policy]``, ``[train.fp8]``, a top-level ``redis`` port string, ...)
       makes it cosmos-rl's, whatever else it holds (keys of this library added to it are read too).
    3. Else a key only this library has (``[grpo]``, ``[wfm]``, ``policy.dtype``, ``train.optm_eps``,
       a ``[redis]`` table, ...) makes it this library's.
    4. Else (every key is one both have: ``policy.model_name_or_path``, ``train.optm_lr``, ...) it is
       cosmos-rl's, with cosmos-rl's defaults: such files are cosmos-rl files (this library's own
       configs and ``dump_config`` always carry keys of their own); an empty file is this library's.

    ``written_for_cosmos_rl``: cases 1 (``"cosmos-rl"``) and 2, where the file is known to have run
    under cosmos-rl; keys neither config has are then ignored as cosmos-rl ignored them
    (:func:`read_cosmos_rl`), elsewhere they are errors. ``is_own_key(path)``: a key of this
    library's config (not an alias); ``is_alias(path)``: a spelling the loader moves onto one.
    """
    if marker is not None:
        return marker, f"{STYLE_KEY} = {marker!r}", marker == "cosmos-rl"
    if not tree:
        return "cosmos_primitives", "it is empty", False
    if isinstance(tree.get("redis"), str):
        return "cosmos-rl", "its top-level redis is cosmos-rl's controller port", True
    paths = [path for path in _all_paths(tree) if not _wfm_guide_key(path)]
    tables = cosmos_rl_tables()
    for path in paths:
        if (rule_for(path) is not None or path in tables) and not is_own_key(path):
            return "cosmos-rl", f"it holds '{path}', a key of cosmos-rl's config that is not this library's", True
    if isinstance(tree.get("redis"), dict):
        return "cosmos_primitives", "it holds a [redis] table, a section of this library's config", False
    for path in paths:
        if (is_own_key(path) or is_alias(path)) and rule_for(path) is None and path not in tables:
            return ("cosmos_primitives", f"it holds '{path}', a key of this library's config that cosmos-rl's lacks",
                    False)
    return "cosmos-rl", (f"every key it holds is one cosmos-rl's config has too, so it gets cosmos-rl's defaults; "
                         f"write {STYLE_KEY} = \"cosmos_primitives\" at its top to read it with this library's"), False


def _infer_type(tree: dict[str, Any]) -> str | None:
    """cosmos-rl's ``train_policy.type`` when the file leaves it unset: GRPO when ``[train.train_policy]``
    holds one of its GRPO-only keys (cosmos-rl's ``Config.preprocess``) or is absent (its default
    ``GrpoConfig``), else SFT. None when the file sets it."""
    policy = tree.get("train", {}).get("train_policy") if isinstance(tree.get("train"), dict) else None
    if not isinstance(policy, dict):
        return "grpo"
    if "type" in policy:
        return None
    grpo_keys = ("temperature", "epsilon_low", "epsilon_high", "kl_beta", "use_remote_reward")
    return "grpo" if any(key in policy for key in grpo_keys) else "sft"


def read_cosmos_rl(tree: dict[str, Any], is_ours: Callable[[str], bool],
                   suggest: Callable[[str], str] | None = None) -> CosmosRLReading:
    """Take the ignored and refused cosmos-rl keys out of ``tree`` (in place) and report them.

    Only keys that are not keys of ours are taken out (``policy.parallelism.cp_size`` is ours and
    stays, to be refused where the mesh is built). Values in a key's ``noop`` ask for nothing and go
    silently. With ``suggest`` (a file written for cosmos-rl, :func:`file_style`), a key neither
    cosmos-rl's class nor this library has, in a table of cosmos-rl's, is ignored with the reason
    (cosmos-rl ignores keys it does not know, so it changed nothing there) and ``suggest(path)``, the
    closest key (``"; did you mean ..."``); without, it stays for the loader to reject.
    ``train_policy.type`` left unset is filled as cosmos-rl infers it.
    """
    reading = CosmosRLReading([], {}, {}, [])
    if isinstance(tree.get("redis"), str):
        tree.pop("redis")
        reading.ignored.append(("redis", "launcher-only: the cosmos-rl controller's Redis port"))
    train = tree.get("train") if isinstance(tree.get("train"), dict) else {}
    seed = train.get("seed")
    if (seed is None and train.get("deterministic") is True) or (isinstance(seed, int) and seed < 0):
        train["seed"] = 42  # cosmos-rl's TrainingConfig: deterministic runs and negative seeds get 42
        reading.defaults["train.seed"] = 42
    inferred = _infer_type(tree)
    if inferred is not None:
        _put(tree, "train.train_policy.type", inferred)
        reading.defaults["train.train_policy.type"] = inferred
    replicas = tree.get("policy", {}).get("parallelism", {}) if isinstance(tree.get("policy"), dict) else {}
    if isinstance(replicas, dict) and isinstance(replicas.get("n_init_replicas"), int):
        reading.policy_replicas = replicas["n_init_replicas"]
    backend = tree.get("rollout", {}).get("backend") if isinstance(tree.get("rollout"), dict) else None
    if backend is not None and backend not in _ENGINES:
        _drop(tree, "rollout.backend")
        reading.refused["rollout.backend"] = (f"= {backend!r}: the engines here are 'vllm' and 'hf'; "
                                              "set rollout.backend to one of them")
    tables = cosmos_rl_tables()
    for path, value in leaves(tree):
        rule = rule_for(path)
        if rule is None:
            if suggest and not is_ours(path) and not _wfm_guide_key(path) and path.rpartition(".")[0] in tables:
                _drop(tree, path)
                _drop_empty_tables(tree, path, is_ours)
                reading.ignored.append((path, "not a key of cosmos-rl's config (it ignores keys it does not have, "
                                              f"so this one changed nothing there) nor of this library's{suggest(path)}"))
            continue
        if is_ours(path) or rule.how == "mapped":
            continue
        _drop(tree, path)
        _drop_empty_tables(tree, path, is_ours)
        if value in rule.noop or (isinstance(value, dict) and not value and rule.how == "ignored"):
            continue
        if rule.how == "ignored":
            reading.ignored.append((path, rule.note))
        else:
            reading.refused[path] = f"= {value!r}: {rule.note}"
    return reading


def apply_cosmos_rl_meanings(tree: dict[str, Any], reading: CosmosRLReading, explicit: set[str]) -> None:
    """Give a cosmos-rl style ``tree`` (aliases already on their canonical keys) cosmos-rl's meanings:
    its defaults for keys the file leaves unset, ``disaggregated.transfer_dtype`` = ``train.master_dtype``
    when unset, ``rollout.batch_size`` in prompts, and ``train_batch_per_replica`` as its trainers read
    it (:func:`_batch_sizes`), and a Cosmos-Reason example's ``[custom.dataset]`` / ``[custom.vision]``
    as its script reads them (:func:`~cosmos_primitives.config.cosmos_rl_custom.read_custom_dataset`).
    ``explicit``: canonical keys given on the command line, taken as they are."""
    translated, refused = read_custom_dataset(tree, explicit)
    reading.translated += translated
    reading.refused.update(refused)
    for key, value in COSMOS_RL_DEFAULTS.items():
        if not _has(tree, key) and key not in explicit:
            _put(tree, key, copy.deepcopy(value))
            reading.defaults[key] = value
    if _has(tree, "policy.lora") and isinstance(_get(tree, "policy.lora"), dict):
        for name, value in COSMOS_RL_LORA_DEFAULTS.items():
            if name not in _get(tree, "policy.lora"):
                _put(tree, f"policy.lora.{name}", value)
                reading.defaults[f"policy.lora.{name}"] = value
    transfer = "disaggregated.transfer_dtype"
    if not _has(tree, transfer) and transfer not in explicit:
        master = _get(tree, "train.master_dtype") if _has(tree, "train.master_dtype") else "float32"
        _put(tree, transfer, master)
        reading.defaults[transfer] = master
    n = _get(tree, "grpo.num_samples_per_prompt")
    prompts_set = isinstance(_get(tree, "rollout.batch_size"), int)
    if "rollout.batch_size" not in explicit and isinstance(n, int) and prompts_set:
        prompts = _get(tree, "rollout.batch_size")
        _put(tree, "rollout.batch_size", prompts * n)
        reading.translated.append(f"rollout.batch_size = {prompts} prompts is {prompts * n} sequences here "
                                  f"(x n_generation {n})")
    _batch_sizes(tree, reading, explicit)


def _batch_sizes(tree: dict[str, Any], reading: CosmosRLReading, explicit: set[str]) -> None:
    """``train_batch_per_replica`` as cosmos-rl's trainers read it, onto this library's keys.

    SFT: the batch of each data-parallel rank (cosmos-rl's SFT worker gives every dp rank a loader of
    that batch size), as here: kept. With ``n_init_replicas`` > 1 cosmos-rl's multi-replica SFT worker
    shares it among the replica's dp ranks: divided by ``dp_shard_size x dp_replicate_size``.

    GRPO: the rollouts of one optimizer step of a replica, shared by its dp ranks: ``b = batch / dp``
    rollouts per rank and step (``train_batch_per_replica`` here). A rank generates whole groups of
    ``n`` (``num_samples_per_prompt``), so each generation takes ``lcm(b, n) / n`` prompts
    (``grpo.rollout_batch_size``) and trains them in ``lcm(b, n) / b`` optimizer steps of ``b``
    rollouts (``grpo.rollouts_per_step``, set when that is more than one step): ``b = 8`` of groups of
    16 is one prompt per two steps, as cosmos-rl's queue trains half a group per step.
    """
    key = "train.train_batch_per_replica"
    grpo = _get(tree, "train.train_policy.type") != "sft"
    batch = _get(tree, key) if _has(tree, key) else 8  # cosmos-rl's default, ours too
    if not isinstance(batch, int) or batch < 1:
        return  # an invalid value is reported by the range check, under its own key
    if key in explicit:
        per_rank = batch  # given on the command line: this library's meaning, per rank
    else:
        parallelism = tree.get("policy", {}).get("parallelism", {})
        shard, replicate = parallelism.get("dp_shard_size", 1), parallelism.get("dp_replicate_size", 1)
        if not grpo and reading.policy_replicas <= 1:
            return
        if not (isinstance(shard, int) and isinstance(replicate, int) and shard > 0 and replicate > 0):
            if grpo:
                reading.refused[key] = (f"= {batch} with policy.parallelism.dp_shard_size = {shard!r}: cosmos-rl shares "
                                        "a GRPO batch among the data-parallel ranks it finds at start-up; here each "
                                        "rank's share is fixed when the file is read, so set dp_shard_size to their "
                                        "number")
            return
        dp = shard * replicate
        if batch % dp:
            reading.refused[key] = (f"= {batch}: cosmos-rl shares it among the replica's {dp} data-parallel ranks "
                                    "(dp_shard_size x dp_replicate_size) and stops when it does not divide evenly, "
                                    "as this library does; make it a multiple of the data-parallel size")
            return
        per_rank = batch // dp
        _put(tree, key, per_rank)
        if dp > 1:
            reading.translated.append(f"{key} = {batch} per replica is {per_rank} per data-parallel rank "
                                      f"(/ data-parallel size {dp})")
    if not grpo:
        return
    n = _get(tree, "grpo.num_samples_per_prompt")
    if not isinstance(n, int) or n < 1:
        return  # reported by the range check under its own key
    whole = math.lcm(per_rank, n)
    prompts, steps = whole // n, whole // per_rank
    if "grpo.rollout_batch_size" not in explicit and not _has(tree, "grpo.rollout_batch_size"):
        _put(tree, "grpo.rollout_batch_size", prompts)
        reading.translated.append(f"GRPO: {per_rank} rollouts per step and rank: each generation takes "
                                  f"grpo.rollout_batch_size = {prompts} prompts x {n} samples")
    if steps > 1 and "grpo.rollouts_per_step" not in explicit and not _has(tree, "grpo.rollouts_per_step"):
        _put(tree, "grpo.rollouts_per_step", per_rank)
        reading.translated.append(f"GRPO: its {whole} rollouts train in {steps} optimizer steps of "
                                  f"grpo.rollouts_per_step = {per_rank}, as cosmos-rl trains {per_rank} of them per step")


def _shown(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, str) else str(value).replace("'", '"')


def render_table() -> str:
    """The markdown table of :data:`RULES` that ``docs/from_cosmos_rl.md`` carries (a test checks they agree)."""
    lines = ["| cosmos-rl key | cosmos-rl default | here | what it becomes / why / what to do |", "|---|---|---|---|"]
    for rule in RULES.values():
        note = rule.note.replace("|", "\\|")
        lines.append(f"| `{rule.key}` | `{_shown(rule.default)}` | {rule.how} | {note} |")
    return "\n".join(lines) + "\n"
