# ruff: noqa: E501  (the table below keeps one cosmos-rl key per line)
"""How every key of cosmos-rl's config class is read here: the one table behind the loader, the
migration report (``python -m cosmos_primitives.migrate``) and ``docs/from_cosmos_rl.md``.

The source of truth for cosmos-rl's keys, meanings and defaults is its config class
(``cosmos_rl/policy/config/__init__.py`` in nvidia-cosmos/cosmos-rl). Each key that applies to LLM /
VLM SFT and GRPO is one of:

- ``mapped``: read as the key named in the note (the same name unless said otherwise), same meaning;
  when cosmos-rl's default differs from ours, a file recognised as cosmos-rl style
  (:func:`is_cosmos_rl_style`) gets cosmos-rl's default for it (:func:`cosmos_rl_defaults`);
- ``ignored``: accepted, changes nothing here (speed-only or launcher-only); the loader lists such
  keys in one warning with the reason;
- ``refused``: the file loads (so it can be inspected and migrated), but a value that asks for
  something this library cannot do is recorded in ``Config.unsupported`` and the recipes stop at
  start-up (``cp.config.check_runnable``) with the note saying what to do instead.

A key whose value is one of its ``noop`` values asks for nothing (``fsdp_offload = false``) and is
dropped silently. Sections for other kinds of model (``[distillation]``, ``[vla]``,
``[policy.diffusers]``) are refused as a whole.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any, Literal

from cosmos_primitives.config.aliases import COSMOS_RL_ALIASES

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
redis | "" | ignored | - | launcher-only: the cosmos-rl controller's Redis port; the disaggregated recipe takes [redis] url or starts its own
eth_ips | "" | ignored | - | launcher-only: controller addresses; torchrun places the ranks
mode | "disaggregated" | ignored | - | launcher-only: pick the recipe instead (examples/grpo_vlm.py shares GPUs, examples/grpo_vlm_disaggregated.py splits them)
custom | - | mapped | - | = (free-form table for your own code)
train.train_policy.type | - | mapped | - | =
train.train_policy.trainer_type | "sft" | refused | ["sft", "grpo"] | a custom trainer class does not load here: give the recipe a dataset / reward plug-in, or write a loop from library calls
train.train_policy.dataset.name | "" | mapped | - | =
train.train_policy.dataset.subset | "" | mapped | - | =
train.train_policy.dataset.revision | "" | mapped | - | =
train.train_policy.dataset.split | "" | mapped | - | = (a list of splits is read as "a+b", the concatenation)
train.train_policy.dataset.test_size | - | mapped | - | = (with validation.enable and no validation.dataset.name, SFT and colocated GRPO (examples/grpo_vlm.py) validate on the items (int) or fraction (float, rounded up) held out of training, unset 0.1 as in cosmos-rl; drawn at random seeded by train.seed, where cosmos-rl takes the first / last rows)
train.train_policy.dataset.local_dir | "" | refused | [""] | set train.train_policy.dataset.name to the local folder or file
train.train_policy.mini_batch | 2 | mapped | - | = (sequences per forward / backward; ours defaults to 1)
train.train_policy.dataloader_shuffle | true | refused | [true] | the sampler always shuffles (seeded by [train] seed)
train.train_policy.dataloader_seed | 0 | ignored | - | speed-only: data order comes from [train] seed
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
train.train_policy.temperature | 1.0 | mapped | - | grpo.temperature (the trainer scores logits / temperature; ours unset: the rollout's sampling temperature)
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
train.train_policy.allowed_outdated_steps | 4 | mapped | - | grpo.allowed_outdated_steps
train.train_policy.on_policy | false | mapped | - | grpo.on_policy
train.train_policy.uncentralized_training | false | ignored | - | launcher-only: controller layout
train.train_policy.outdated_rollout_fetch_batch_size | 0 | ignored | - | speed-only: queue fetch size
train.train_policy.max_inflight_steps | - | ignored | - | launcher-only: controller scheduling
train.train_policy.min_filter_prefix_tokens | - | mapped | - | grpo.min_filter_prefix_tokens (cp.algo.prefix_filter)
train.train_policy.max_retry_for_on_policy | -1 | ignored | - | launcher-only: controller retries
train.train_policy.reference_reset_interval | - | refused | - | the KL reference is fixed here; remove the key
train.train_policy.reset_optimizer_with_reference | true | ignored | - | only acts with reference_reset_interval
train.train_policy.use_decoupled_loss | false | refused | [false] | set grpo.behav_imp_weight_cap (the decoupled loss)
train.train_policy.behav_imp_weight_cap | - | mapped | - | grpo.behav_imp_weight_cap
train.train_policy.rollout_as_token_ids | false | ignored | - | speed-only: records carry token ids here anyway
train.train_policy.collect_rollout_logprobs | false | ignored | - | records always carry the engine's log-probs here
train.train_policy.use_rollout_logprobs_for_loss | false | mapped | - | grpo.old_logprobs ("rollout" when true, else "recompute"; ours defaults to "rollout")
train.optm_name | "AdamW" | mapped | - | =
train.optm_lr | 1e-6 | mapped | - | = (ours defaults to 1e-5)
train.optm_impl | "fused" | mapped | - | = (AdamW kernels: "fused" where torch has them for the parameters' device, else "foreach"; one value, not a list per model part)
train.optm_weight_decay | 0.01 | mapped | - | =
train.optm_betas | [0.9, 0.999] | mapped | - | =
train.optm_warmup_steps | 20 | mapped | - | = (a float <= 1 is a fraction of the total steps; ours defaults to 0)
train.optm_warmup_start_factor | 0.0 | refused | [0.0] | warmup starts at 0 here; remove the key
train.optm_decay_ratio | - | refused | - | decay runs over all steps after warmup here; remove the key
train.optm_decay_type | - | mapped | - | = (unset there: constant after warmup, as ours)
train.optm_min_lr_factor | 0.0 | mapped | - | =
train.optm_grad_norm_clip | 1.0 | mapped | - | =
train.ema_enable | false | refused | [false] | EMA weights are not kept here; remove the key
train.ema_decay | 0.9999 | ignored | - | only acts with ema_enable
train.ema_update_step_interval | 0 | ignored | - | only acts with ema_enable
train.master_dtype | "float32" | mapped | - | = ("bfloat16": bf16 master weights, float32 AdamW math with stochastic rounding)
train.param_dtype | "bfloat16" | mapped | - | policy.dtype
train.transfer_dtype | - | mapped | - | disaggregated.transfer_dtype
train.logprob_dtype | "float32" | refused | ["float32"] | log-probs are computed in float32 here; remove the key
train.fsdp_reduce_dtype | "float32" | ignored | - | speed-only: gradient reduce dtype
train.fsdp_offload | false | mapped | - | = (FSDP2 CPUOffloadPolicy: parameters, gradients and optimizer state in host memory)
train.fsdp_reshard_after_forward | "default" | mapped | - | = ("default": as cosmos-rl's (every block but the last reshards) with a shard group of 2+ ranks or fsdp_offload; with one shard rank nothing reshards (cheaper, same results); the root unit stays gathered through the backward)
train.train_batch_per_replica | 8 | mapped | - | = (a cosmos-rl file's value is per replica: divided by its data-parallel size; in GRPO it counts rollouts, so grpo.rollout_batch_size = it / n_generation)
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
train.coalesce_weight_sync | false | ignored | - | speed-only: weight-sync batching
train.deterministic | false | ignored | - | speed-only: deterministic kernels
train.activation_offload | false | ignored | - | speed-only: activation offload
train.fa_version | - | ignored | - | speed-only: flash-attention version
train.seed | - | mapped | - | = (ours defaults to 42)
train.local_dataset | true | ignored | - | launcher-only: dataset download placement
train.force_use_hf | false | ignored | - | speed-only: model implementation (always transformers here)
train.non_text | false | ignored | - | launcher-only: non-text trainers
train.max_num_steps | - | mapped | - | train.max_steps
train.sequence_packing | false | mapped | - | train.train_policy.sequence_packing (ours defaults to true)
train.save_ckpt_at_exit | true | mapped | - | = (a signal of signal_to_handle saves a checkpoint at the next step boundary, then the run stops with exit status 75; cp.checkpoint.Preemption)
train.signal_to_handle | ["SIGUSR1"] | mapped | - | = (ours defaults to ["SIGUSR1", "SIGTERM"] for every file: without cosmos-rl's launcher, SIGTERM is what a scheduler sends the training process itself)
train.enable_validation | false | mapped | - | validation.enable (older cosmos-rl spelling; see validation.enable)
train.validation_step | 20 | mapped | - | validation.freq (older cosmos-rl spelling)
train.validation_batch_per_replica | - | ignored | - | speed-only: validation batching (older cosmos-rl spelling)
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
logging.logger | [] | mapped | - | = (ours defaults to ["console"])
logging.log_interval | 100 | ignored | - | speed-only: console lines are written every logging.log_freq steps here
logging.multi_modal_log_interval | - | ignored | - | speed-only: media logging
logging.project_name | "cosmos_rl" | mapped | - | =
logging.group_name | - | ignored | - | launcher-only: W&B grouping
logging.experiment_name | - | mapped | - | =
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
validation.max_response_length | - | refused | - | validation uses rollout.max_response_length
validation.reward_function | [] | mapped | - | = (ours defaults to single_choice)
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
    "train.train_policy.mini_batch": 2,
    "train.train_policy.sequence_packing": False,
    "train.train_policy.dataset.system_prompt": "",  # an empty system message, not the template's default
    "train.ckpt.save_freq": 20,
    "train.ckpt.max_keep": 5,
    "grpo.num_samples_per_prompt": 16,
    "grpo.reward_function": {"single_choice": 1.0},
    "grpo.old_logprobs": "recompute",
    "rollout.max_response_length": 2048,
    "rollout.gpu_memory_utilization": 0.8,
    "rollout.batch_size": 1,
    "logging.project_name": "cosmos_rl",
}
COSMOS_RL_LORA_DEFAULTS = {"r": 8, "lora_alpha": 8.0}

_ENGINES = ("hf", "vllm")


@dataclass
class CosmosRLReading:
    """What reading a cosmos-rl style file did: keys ignored (key, why), refused (key -> what to do),
    defaults filled (canonical key -> value) and meanings translated (one line each)."""

    ignored: list[tuple[str, str]]
    refused: dict[str, str]
    defaults: dict[str, Any]
    translated: list[str]

    def warning(self, source: str) -> str:
        """The one start-up message about the file (empty when there is nothing to say)."""
        parts = []
        if self.ignored:
            parts.append("ignored (no effect here): " + "; ".join(f"{k} ({why})" for k, why in self.ignored))
        if self.defaults:
            parts.append("cosmos-rl defaults for keys it leaves unset: "
                         + ", ".join(f"{k} = {v!r}" for k, v in self.defaults.items()))
        parts += self.translated
        if self.refused:
            refused = "; ".join(f"{k}: {v}" for k, v in self.refused.items())
            parts.append(f"refused (a recipe stops on these): {refused}")
        return f"{source} is read as a cosmos-rl config. " + ". ".join(parts) if parts else ""


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


def is_cosmos_rl_style(tree: dict[str, Any], is_ours: Any) -> bool:
    """Whether a parsed file spells a key only cosmos-rl has: the top-level ``redis`` port string, a
    cosmos-rl-only spelling of one of our keys (``train.epsilon``), or a key the table ignores or refuses.
    ``is_ours(path)``: whether ``path`` is a key of this library's config (or an older spelling of one)."""
    if isinstance(tree.get("redis"), str):
        return True
    return any(path in COSMOS_RL_ALIASES or (not is_ours(path) and (rule := rule_for(path)) is not None
                                             and rule.how != "mapped")
               for path, _ in leaves(tree))


def read_cosmos_rl(tree: dict[str, Any], is_ours: Any) -> CosmosRLReading:
    """Take the ignored and refused cosmos-rl keys out of ``tree`` (in place) and report them.

    Only keys that are not keys of ours are taken out (``policy.parallelism.cp_size`` is ours and
    stays, to be refused where the mesh is built). Values in a key's ``noop`` ask for nothing and go
    silently.
    """
    reading = CosmosRLReading([], {}, {}, [])
    if isinstance(tree.get("redis"), str):
        tree.pop("redis")
        reading.ignored.append(("redis", "launcher-only: the cosmos-rl controller's Redis port"))
    backend = tree.get("rollout", {}).get("backend") if isinstance(tree.get("rollout"), dict) else None
    if backend is not None and backend not in _ENGINES:
        _drop(tree, "rollout.backend")
        reading.refused["rollout.backend"] = (f"= {backend!r}: the engines here are 'vllm' and 'hf'; "
                                              "set rollout.backend to one of them")
    for path, value in leaves(tree):
        rule = rule_for(path)
        if rule is None or is_ours(path) or rule.how == "mapped":
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
    its defaults for keys the file leaves unset, ``rollout.batch_size`` in prompts, and
    ``train_batch_per_replica`` per replica (and in rollouts for GRPO). ``explicit``: canonical keys
    given on the command line, which are taken as they are."""
    sft = tree.get("train", {}).get("train_policy", {}).get("type", "grpo") == "sft"
    for key, value in COSMOS_RL_DEFAULTS.items():
        if sft and key.startswith(("grpo.", "rollout.")):
            continue  # nothing of SFT reads them
        if not _has(tree, key) and key not in explicit:
            _put(tree, key, value)
            reading.defaults[key] = value
    if _has(tree, "policy.lora") and isinstance(_get(tree, "policy.lora"), dict):
        for name, value in COSMOS_RL_LORA_DEFAULTS.items():
            if name not in _get(tree, "policy.lora"):
                _put(tree, f"policy.lora.{name}", value)
                reading.defaults[f"policy.lora.{name}"] = value
    if sft:
        _per_replica_batch(tree, reading, None, explicit)
        return
    n = _get(tree, "grpo.num_samples_per_prompt")
    prompts_set = isinstance(_get(tree, "rollout.batch_size"), int)
    if "rollout.batch_size" not in explicit and isinstance(n, int) and prompts_set:
        prompts = _get(tree, "rollout.batch_size")
        _put(tree, "rollout.batch_size", prompts * n)
        reading.translated.append(f"rollout.batch_size = {prompts} prompts is {prompts * n} sequences here "
                                  f"(x n_generation {n})")
    _per_replica_batch(tree, reading, n, explicit)


def _per_replica_batch(tree: dict[str, Any], reading: CosmosRLReading, n: Any, explicit: set[str]) -> None:
    """``train_batch_per_replica``: per replica there (shared by its data-parallel ranks), per rank
    here; in GRPO it counts rollouts per optimizer step, i.e. ``n`` per prompt."""
    key = "train.train_batch_per_replica"
    if not _has(tree, key) or key in explicit or not isinstance(_get(tree, key), int) or _get(tree, key) < 1:
        return  # an invalid value is reported by the range check, under its own key
    batch = _get(tree, key)
    shard = tree.get("policy", {}).get("parallelism", {}).get("dp_shard_size", 1)
    replicate = tree.get("policy", {}).get("parallelism", {}).get("dp_replicate_size", 1)
    dp = shard * replicate if isinstance(shard, int) and isinstance(replicate, int) and shard > 0 else 1
    grpo = isinstance(n, int) and n > 0
    unit = n if grpo else 1  # a GRPO group stays on one rank here
    if batch % (unit * dp):
        what = (f"{batch // n if batch % n == 0 else batch / n:g} prompts x {n} samples" if grpo else f"{batch} samples")
        reading.refused[key] = (f"= {batch}: per replica there, per rank here: its {what} per step cannot be "
                                f"shared evenly among the replica's {dp} data-parallel ranks "
                                f"(dp_shard_size x dp_replicate_size)" + ("; a group stays on one rank here, so set "
                                                                          "grpo.rollout_batch_size (prompts per rank)"
                                                                          if grpo else ""))
        return
    per_rank = batch // dp
    _put(tree, key, per_rank)
    if dp > 1:
        reading.translated.append(f"{key} = {batch} per replica is {per_rank} per rank (/ data-parallel size {dp})")
    if grpo and "grpo.rollout_batch_size" not in explicit and not _has(tree, "grpo.rollout_batch_size"):
        _put(tree, "grpo.rollout_batch_size", per_rank // n)
        reading.translated.append(f"GRPO: {per_rank} rollouts per step and rank is grpo.rollout_batch_size = "
                                  f"{per_rank // n} prompts x {n} samples")


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
