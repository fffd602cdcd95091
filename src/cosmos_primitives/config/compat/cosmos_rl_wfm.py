# ruff: noqa: E501  (the tables below keep one cosmos-rl key per line)
"""How cosmos-rl's world-model config files are read (``configs/cosmos-predict2-5/`` there): the
translation onto ``[wfm]`` / ``[policy]`` / ``[train]`` / ``[remote_reward]`` / ``[logging]``, the
key tables behind ``python -m cosmos_primitives.migrate`` and ``docs/from_cosmos_rl.md``.

cosmos-rl has two kinds of world-model file, both recognised by :func:`world_model_kind`:

- ``"cosmos"``: its Cosmos-Predict2.5 trainer (``CosmosVisionGenConfig``,
  ``cosmos_rl/policy/config/wfm/__init__.py``; launched with ``--wfm-mode``): top-level
  ``[model]`` (with ``[model.rl]``), ``[model_parallel]``, ``[trainer]``, ``[optimizer]``,
  ``[scheduler]``, ``[dataloader_train]``, ``[dataloader_val]``, ``[job]``, ``[checkpoint]``.
  FlowGRPO (``model.rl.data_beta = 0``) or DDRL, full fine-tuning, the rollout group of a prompt
  spread over ``num_rollout`` data-parallel ranks (one rollout per rank).
- ``"diffusers"``: its own ``Config`` with ``[policy] is_diffusers`` / ``[policy.diffusers]``, e.g.
  DiffusionNFT (``trainer_type = "diffusion_nft"``) with LoRA on a diffusers Cosmos-Predict2.5.

Each key is ``mapped`` (the note starts with our key and says how), ``ignored`` (changes nothing
that trains, or a difference docs/from_cosmos_rl.md states with its reason) or ``refused`` (the
file loads, the value goes to ``Config.unsupported`` and ``examples/wfm_rl.py`` stops at start-up
with the note saying what to do), as in ``config/compat/cosmos_rl.py``. A value among a key's ``noop``
values asks for nothing. cosmos-rl's defaults (the table's second column, checked against its own
classes by ``tests/test_cosmos_rl_wfm.py``) fill the keys a file leaves out, so a file means the
same whichever keys it happens to spell. A diffusers file's keys that are not world-model specific
(``train.optm_lr``, ``train.ckpt.*``, ...) follow ``config/compat/cosmos_rl.py``'s table.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Literal

from cosmos_primitives.config.compat import cosmos_rl
from cosmos_primitives.config.compat.rules import RULE_LIST

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

How = Literal["mapped", "ignored", "refused"]
Kind = Literal["cosmos", "diffusers"]


@dataclass(frozen=True)
class WorldModelRule:
    """How one key of a cosmos-rl world-model file is read; ``default``: cosmos-rl's (None: none)."""

    key: str
    default: Any
    how: How
    note: str
    noop: tuple[Any, ...] = ()


# key | cosmos-rl default (TOML, "-" = none) | how | values asking for nothing (TOML array, "-") | note.
# A rule on a table covers every key inside it unless a longer rule names one.
_COSMOS = r"""
model.tokenizer | - | ignored | - | the VAE is the model folder's vae/ (its temporal window and chunking are its own)
model.conditioner | - | ignored | - | the transformer's inputs (fps, padding mask, text, condition flag) are fed as the diffusers model takes them; a text dropout_rate (caption dropout, which cosmos-rl applies to the DDRL data term) is not applied here
model.text_encoder_class | "T5" | mapped | - | wfm.data.text_dim ("T5": 1024; "reason1_7B": Cosmos-Reason1-7B's hidden states combined by embedding_concat_strategy, 100352 wide with full_concat)
model.text_encoder_config.compute_online | false | mapped | - | wfm.data.text_encoder ("none": the embeddings are computed ahead of the run here, by the same encoder and prompt: python -m cosmos_primitives.data.precompute_text_embeddings DATASET --encoder nvidia/Cosmos-Reason1-7B --max-tokens 512, into the clip folder's text_embedding/)
model.text_encoder_config.embedding_concat_strategy | "mean_pooling" | mapped | ["full_concat"] | wfm.data.text_dim (the precompute step writes full_concat; another strategy with compute_online is refused: precompute those embeddings yourself)
model.text_encoder_config.n_layers_per_group | 5 | ignored | - | only acts with embedding_concat_strategy = "pool_every_n_layers_and_concat"
model.text_encoder_config.ckpt_path | "nvidia/Cosmos-Reason1-7B" | ignored | - | the text encoder of the precompute step (its --encoder)
model.text_encoder_config.tokenizer_type | "Qwen/Qwen2-VL-2B-Instruct" | ignored | - | the text encoder's tokenizer comes with its checkpoint
model.text_encoder_config.encoder_model_config | - | ignored | - | the text encoder's architecture comes with its checkpoint
model.net.sac_config.mode | "block_wise" | mapped | - | policy.model_gradient_checkpointing (true unless "none": activation checkpointing of the transformer blocks)
model.net.sac_config.every_n_blocks | 1 | ignored | - | speed-only: which blocks recompute (every block here)
model.net | - | ignored | - | the network's architecture is the model folder's transformer/config.json
model.ema | - | ignored | - | EMA weights are not kept here (cosmos-rl keeps them for its every_n_sample_ema samples and validation; rollouts and training use the regular weights in both)
model.sde | - | ignored | - | cosmos-rl's EDM noise levels (rollout start sigma_max, data-term sigma draws); here the flow model's own sigma grid (docs/from_cosmos_rl.md)
model.fsdp_shard_size | 8 | mapped | - | policy.parallelism.dp_shard_size
model.dp_replicate_size | 1 | ignored | - | not read by cosmos-rl (its replicas are world size / (fsdp_shard_size x context_parallel_size)); policy.parallelism.dp_replicate_size = -1 infers them the same way here
model.sigma_data | 1.0 | ignored | - | EDM parameterisation of cosmos-rl's network (the diffusers model predicts the flow velocity)
model.precision | "bfloat16" | mapped | - | policy.dtype
model.input_data_key | "video" | ignored | - | batch key names of cosmos-rl's loaders
model.input_caption_key | "ai_caption" | ignored | - | batch key names of cosmos-rl's loaders
model.input_image_key | "images" | ignored | - | batch key names of cosmos-rl's loaders
model.loss_reduce | "mean" | refused | ["mean"] | the losses are means here; remove the key
model.loss_scale | 10.0 | mapped | - | wfm.loss_scale (the loss is multiplied by it before backward; it changes what the gradient-norm clip sees)
model.use_torch_compile | false | ignored | - | speed-only: torch.compile of the network
model.adjust_video_noise | true | ignored | - | EDM training-noise scaling of cosmos-rl's network
model.state_ch | 16 | ignored | - | the latent shape comes from the model folder's VAE
model.state_t | 24 | ignored | - | the latent shape comes from the model folder's VAE
model.resolution | "480" | ignored | - | the clip size is dataloader_train's (video_size, or the mock data's resolution)
model.scaling | "rectified_flow" | ignored | - | the diffusers model is a rectified-flow model
model.rectified_flow_t_scaling_factor | 1.0 | ignored | - | parameterisation of cosmos-rl's network
model.rectified_flow_loss_weight_uniform | true | ignored | - | parameterisation of cosmos-rl's network
model.resize_online | true | ignored | - | the clips are resized when read
model.min_num_conditional_frames | 1 | ignored | - | the RL step takes the number of condition frames from model.rl
model.max_num_conditional_frames | 2 | ignored | - | the RL step takes the number of condition frames from model.rl
model.sigma_conditional | 0.0001 | ignored | - | the condition frames are clean here (cosmos-rl adds noise of this sigma to them)
model.conditioning_strategy | "frame_replace" | refused | ["frame_replace"] | the condition frames replace the first latent frames here; remove the key
model.denoise_replace_gt_frames | true | ignored | - | the condition frames are replaced in every step here
model.high_sigma_strategy | "LOGUNIFORM200_100000" | ignored | - | EDM sigma draws of cosmos-rl's pre-training loss
model.high_sigma_ratio | 0.05 | ignored | - | EDM sigma draws of cosmos-rl's pre-training loss
model.low_sigma_ratio | 0.05 | ignored | - | EDM sigma draws of cosmos-rl's pre-training loss
model.use_rf_ckpts | false | ignored | - | the diffusers checkpoint is a rectified-flow one
model.rl.enabled | true | refused | [true] | world-model SFT (model.rl.enabled = false) has no recipe here
model.rl.update_ref_every_iter | 16 | mapped | - | wfm.reference_update_interval (only acts with kl_beta > 0)
model.rl.num_rollout | 8 | mapped | - | wfm.num_samples_per_prompt, wfm.group_ranks (the group is spread over that many data-parallel ranks, one rollout each per prompt)
model.rl.sample_steps | 10 | mapped | - | wfm.num_inference_steps
model.rl.train_on | [0, 1, 2, 3, 4, 5, 6, 7] | mapped | - | wfm.train_steps (-1: a random step not listed)
model.rl.on_policy | true | refused | [true] | rollouts come from the current policy here (on_policy = false rolls out with the reference); remove the key
model.rl.solver_option | "2ab" | ignored | - | differs: cosmos-rl's EDM multistep solver with churn; here the Flow-GRPO SDE on the flow model's sigma grid ([wfm.sampler]; docs/from_cosmos_rl.md)
model.rl.s_churn | 1.0 | ignored | - | differs: the churn of cosmos-rl's solver; here [wfm.sampler] noise_level sets the SDE noise
model.rl.s_t_max | inf | ignored | - | differs: the churn window of cosmos-rl's solver; here every step is stochastic (sde_window_size = 0)
model.rl.s_t_min | 0.0 | ignored | - | differs: the churn window of cosmos-rl's solver; here every step is stochastic (sde_window_size = 0)
model.rl.s_noise | 1.0 | ignored | - | differs: the churn noise scale of cosmos-rl's solver; here [wfm.sampler] noise_level
model.rl.guidance | 0.0 | mapped | - | wfm.guidance_scale (wfm.guidance_convention = "cosmos": cond + g (cond - uncond), 0 = none)
model.rl.min_num_conditional_frames | 1 | mapped | - | wfm.min_num_conditional_frames, wfm.conditioning (0 = text-to-world, 1 = image, more = video; a range is drawn per step)
model.rl.max_num_conditional_frames | 1 | mapped | - | wfm.num_conditional_frames, wfm.conditioning
model.rl.clip_ratio | 0.0001 | mapped | - | wfm.clip_range
model.rl.kl_beta | 0.01 | mapped | - | wfm.kl_beta (the KL is the Gaussian's here, cosmos-rl takes the squared mean difference: docs/from_cosmos_rl.md)
model.rl.data_beta | 0.0 | mapped | - | wfm.data_beta, wfm.algorithm ("ddrl" when data_beta > 0, else "flow_grpo")
model.rl.use_rl_sigma_and_noise | true | mapped | - | wfm.ddrl_rollout_noise, wfm.ddrl_rollout_sigma
model.rl.data_on_first_only | false | refused | [false] | the DDRL data term is taken at every trained step here; remove the key
model.rl.use_same_seed | true | mapped | - | wfm.shared_initial_noise
model.rl.exp_reward | false | mapped | - | wfm.advantage_transform ("neg_exp" when true)
model.rl.reward_config.ALL_REWARD_MODELS | - | ignored | - | the list of reward kinds cosmos-rl knows
model.rl.reward_config.adv_clip_max | 5.0 | mapped | - | wfm.adv_clip_max
model.rl.reward_config.adv_clip_min | -5.0 | refused | [-5.0] | advantages are clipped symmetrically here (+-adv_clip_max); make adv_clip_min = -adv_clip_max
model.rl.reward_config.aesthetic.enabled | false | refused | [false] | reward models run in the reward service here ([remote_reward])
model.rl.reward_config.aesthetic.model_path | - | ignored | - | only acts with aesthetic.enabled
model.rl.reward_config.image_reward.enabled | false | refused | [false] | reward models run in the reward service here ([remote_reward])
model.rl.reward_config.image_reward.model_path | "ImageReward-v1.0" | ignored | - | only acts with image_reward.enabled
model.rl.reward_config.fake_reward.enabled | false | refused | [false] | a constant reward trains nothing; use a reward of the service ([remote_reward])
model.rl.reward_config.fake_reward.reward_fn | "fake_reward" | ignored | - | only acts with fake_reward.enabled
model.rl.reward_config.fake_reward.scale | 1.0 | ignored | - | only acts with fake_reward.enabled
model.rl.reward_config.remote_reward.enabled | true | mapped | - | remote_reward.rewards (one reward, weight 1)
model.rl.reward_config.remote_reward.score_key | "overall_reward" | mapped | - | remote_reward.rewards.score_key
model.rl.reward_config.remote_reward.scale | 1.0 | mapped | - | remote_reward.scale
model.rl.reward_config.remote_reward.reward_fn | "dance_grpo" | mapped | - | remote_reward.rewards.name
model.rl.reward_config.remote_reward.reward_clip_min | -5.0 | mapped | - | remote_reward.rewards.clip (low end; the score is clipped before the scale, as there)
model.rl.reward_config.remote_reward.reward_clip_max | 5.0 | mapped | - | remote_reward.rewards.clip (high end)
model.rl.reward_config.remote_reward.token | "" | refused | [""] | tokens do not belong in config files: export WFM_REWARD_TOKEN (read by both)
model.rl.reward_config.remote_reward.enqueue_url | "" | mapped | - | remote_reward.enqueue_url (empty: WFM_REWARD_ENQUEUE_URL, as there)
model.rl.reward_config.remote_reward.fetch_url | "" | mapped | - | remote_reward.fetch_url (empty: WFM_REWARD_FETCH_URL, as there)
optimizer.optim_type | "fusedadam" | mapped | - | train.optm_name ("fusedadam" and "adamw" are both AdamW)
optimizer.lr | 1e-5 | mapped | - | train.optm_lr (x scheduler.f_max)
optimizer.weight_decay | 0.0001 | mapped | - | train.optm_weight_decay (cosmos-rl decays every weight; here not biases and norm scales)
optimizer.betas | [0.9, 0.99] | mapped | - | train.optm_betas
optimizer.eps | 1e-8 | mapped | - | train.optm_eps
optimizer.master_weights | true | mapped | - | train.master_dtype ("float32"; false: "bfloat16")
optimizer.capturable | true | ignored | - | speed-only: CUDA-graph capturable optimizer state
scheduler.scheduler_type | "lambda_linear" | refused | ["lambda_linear"] | the schedule is linear warmup then constant or linear decay here; use lambda_linear
scheduler.verbosity_interval | 0 | ignored | - | logging of the schedule
scheduler.warm_up_steps | [1000] | mapped | - | train.optm_warmup_steps (one cycle; more are refused)
scheduler.cycle_lengths | [10000000000000] | mapped | - | train.optm_decay_type ("constant" when f_min = f_max; a decay to f_min is refused unless its cycle ends at trainer.max_iter)
scheduler.f_start | [1e-6] | ignored | - | differs: cosmos-rl's warmup starts at f_start x lr, here at 0 (1e-6 x lr is no step at all)
scheduler.f_max | [1.0] | mapped | - | train.optm_lr (lr x f_max)
scheduler.f_min | [1.0] | mapped | - | train.optm_decay_type, train.optm_min_lr_factor (f_min / f_max)
trainer.callbacks | - | mapped | - | train.optm_grad_norm_clip, wfm.eval_num_inference_steps, wfm.eval_freq, logging.logger (grad_clip: clip_norm, none: 0, no clipping; every_n_sample_reg with guidance values: num_sampling_step and every_n, none: no evaluation rollouts; wandb: W&B; the others only log, time or collect garbage, listed as ignored)
trainer.use_s3 | false | ignored | - | launcher-only: S3 output of cosmos-rl's callbacks
trainer.distributed_parallelism | "fsdp" | ignored | - | the weights are FSDP2-sharded over [policy.parallelism] here (DDP gives the same updates)
trainer.ddp | - | ignored | - | only acts with distributed_parallelism = "ddp"
trainer.cudnn | - | ignored | - | speed-only: cuDNN flags
trainer.seed | 0 | mapped | - | train.seed
trainer.grad_scaler_args | - | ignored | - | bf16 training needs no gradient scaler
trainer.max_iter | 25 | mapped | - | train.max_steps (an iteration is one optimizer step)
trainer.max_val_iter | - | ignored | - | only acts with run_validation
trainer.logging_iter | 2 | mapped | - | logging.log_freq
trainer.run_validation | false | refused | [false] | the loss on dataloader_val is not computed here; evaluation rollouts score fixed prompts ([wfm] eval_freq)
trainer.validation_iter | 100 | ignored | - | only acts with run_validation
trainer.timeout_period | 999999999 | ignored | - | launcher-only: hang detection
trainer.memory_format | "preserve_format" | ignored | - | speed-only: tensor memory layout
trainer.grad_accum_iter | 1 | refused | [1] | one optimizer step per rollout batch here; raise dataloader batch_size instead
trainer.straggler_detection | - | ignored | - | speed-only: straggler detection
trainer.profiling | - | ignored | - | speed-only: profiling (use torch.profiler around a step)
dataloader_train.type | "web" | mapped | - | wfm.data.kind ("local": "clip_folder"; "web" with dataset len_t5: "mock", cosmos-rl's random mock data; "web" otherwise is refused)
dataloader_train.video_dataloader.type | "video" | ignored | - | the local loader's kind
dataloader_train.video_dataloader.ratio | - | ignored | [1] | the video loader trains here (a ratio of 0 is refused)
dataloader_train.video_dataloader.dataset_dir | - | mapped | - | wfm.data.path (videos/*.mp4, metas/*.txt)
dataloader_train.video_dataloader.num_frames | - | mapped | - | wfm.data.num_frames
dataloader_train.video_dataloader.video_size | - | mapped | - | wfm.data.height, wfm.data.width ((height, width) as cosmos-rl's resize reads it, so [768, 432] trains 768-high, 432-wide clips there and here)
dataloader_train.video_dataloader.offline_text_embedding | false | mapped | - | wfm.data.text_encoder ("none": every clip needs its precomputed embedding)
dataloader_train.video_dataloader.text_encoder_type | "t5_xxl" | mapped | - | wfm.data.embedding_dir ("t5_xxl": t5_xxl/, cosmos-rl's folder of offline T5 embeddings)
dataloader_train.video_dataloader.batch_size | - | mapped | - | wfm.data.prompts_per_step (prompts per data-parallel rank and step; also train.train_policy.mini_batch: a rank's rollouts go through one forward)
dataloader_train.video_dataloader.dataloader.batch_size | - | mapped | - | wfm.data.prompts_per_step (prompts per data-parallel rank and step)
dataloader_train.video_dataloader.dataloader.dataset.num_video_frames | - | mapped | - | wfm.data.num_frames
dataloader_train.video_dataloader.dataloader.dataset.resolution | - | mapped | - | wfm.data.height, wfm.data.width (cosmos-rl's mock video size of that resolution: "480" is 432 x 768)
dataloader_train.video_dataloader.dataloader.dataset.len_t5 | - | mapped | - | wfm.data.max_tokens
dataloader_train.video_dataloader.dataloader.dataset.t5_dim | - | mapped | - | wfm.data.text_dim
dataloader_train.video_dataloader.dataloader.dataset | - | ignored | - | cosmos-rl's web-dataset registry (caption and embedding kinds, decoders, augmentors)
dataloader_train.video_dataloader.dataloader | - | ignored | - | speed-only: loader workers, pinning, prefetching and replay caching
dataloader_train.video_dataloader | - | ignored | - | speed-only: loader workers, pinning, prefetching, shuffling (the sampler shuffles, seeded by [train] seed)
dataloader_train.image_dataloader.ratio | - | refused | [0] | image batches are not trained here (the world-model recipe trains video); set the image ratio to 0
dataloader_train.image_dataloader | - | ignored | - | only acts with an image ratio > 0
dataloader_val | - | ignored | - | only read with trainer.run_validation
job.project | "cosmos_wfm_v2" | mapped | - | logging.project_name, train.output_dir ($COSMOS_OUTPUT_DIR or ./outputs, then project/group/name, as there)
job.group | "official_runs_vid2vid_debug" | mapped | - | train.output_dir (W&B groups are not set here)
job.name | - | mapped | - | logging.experiment_name, train.output_dir
job.wandb_mode | "online" | mapped | - | logging.logger ("disabled" drops wandb; "offline": set WANDB_MODE=offline)
job.timestamp | - | mapped | - | train.resume (a run folder to go on in: resume the newest run under output_dir)
model_parallel.context_parallel_size | 1 | mapped | - | policy.parallelism.cp_size
model_parallel.tensor_model_parallel_size | 1 | refused | [1] | the world-model recipe has no tensor parallelism; use context_parallel_size / fsdp_shard_size
model_parallel.pipeline_model_parallel_size | 1 | refused | [1] | pipeline parallelism is not implemented; remove the key
model_parallel | - | ignored | - | Megatron settings that cosmos-rl's world-model trainer does not read (it reads the tensor / pipeline / context sizes)
checkpoint.type | - | ignored | - | checkpoints are DCP (sharded) here either way
checkpoint.load_path | "" | mapped | - | policy.model_name_or_path (a Hub repo or folder in diffusers layout here, transformer/ vae/ scheduler/; empty, a network of [model.net] with random weights, is refused unless policy.model_name_or_path is given)
checkpoint.model_id | - | refused | - | an imaginaire .pt checkpoint is not read here: give policy.model_name_or_path a diffusers folder of the same weights (diffusers' scripts/convert_cosmos_to_diffusers.py converts the .pt) and, for a Hub repo, policy.model_revision
checkpoint.save_iter | 1000 | mapped | - | train.ckpt.save_freq, train.ckpt.enable_checkpoint, train.ckpt.max_keep (true and -1: cosmos-rl always saves and keeps every checkpoint)
checkpoint.dcp_async_mode_enabled | false | mapped | - | train.ckpt.save_mode ("async" when true, else "sync")
checkpoint.save_to_object_store.enabled | false | refused | [false] | set train.ckpt.upload_s3 and s3_bucket (the AWS_* variables) instead
checkpoint.load_from_object_store.enabled | false | refused | [false] | download the weights and point policy.model_name_or_path at them
checkpoint.save_to_object_store | - | ignored | - | only acts with save_to_object_store.enabled
checkpoint.load_from_object_store | - | ignored | - | only acts with load_from_object_store.enabled
checkpoint | - | ignored | - | resume details of cosmos-rl's checkpointer (what to restore, strictness, JIT export, logging)
"""


# The keys of a diffusers file that are world-model specific; the rest follow config/compat/cosmos_rl.py's table.
_DIFFUSERS = r"""
mode | "disaggregated" | ignored | - | launcher-only: one process group rolls out and trains here
policy.is_diffusers | false | ignored | [true] | the file is read as a world-model file
policy.model_revision | - | mapped | - | = (the Hub branch of the diffusers weights)
policy.diffusers.dtype | "float32" | ignored | - | the weights load in float32 and compute in [policy] dtype (train.param_dtype there)
policy.diffusers.is_video | false | refused | [true] | image diffusion models have no recipe here
policy.diffusers.max_prompt_length | 300 | mapped | - | wfm.data.max_tokens
policy.diffusers.weighting_scheme | "logit_normal" | ignored | - | read by cosmos-rl's diffusion SFT trainer only
policy.diffusers.train_flow_shift | 3.0 | ignored | - | read by cosmos-rl's diffusion SFT trainer only
policy.diffusers.offload | true | ignored | - | speed-only: host offload of model parts
policy.diffusers.logit_mean | 0.0 | ignored | - | read by cosmos-rl's diffusion SFT trainer only
policy.diffusers.logit_std | 1.0 | ignored | - | read by cosmos-rl's diffusion SFT trainer only
policy.diffusers.inference_size | [1024, 1024] | mapped | - | wfm.data.height, wfm.data.width ([height, width])
policy.diffusers.inference_frames | 41 | ignored | - | not read by the DiffusionNFT rollout (train_frames is)
policy.diffusers.train_frames | 41 | mapped | - | wfm.data.num_frames
policy.diffusers.timesteps_fraction | 1.0 | mapped | - | wfm.nft_num_timesteps, wfm.nft_timesteps (int(sample.num_steps x timesteps_fraction) points per sample, "sampler": the sampler's timesteps in a random order per sample, as there)
policy.diffusers.timestep_fraction | - | ignored | - | not a cosmos-rl key (it spells timesteps_fraction): cosmos-rl ignores it and trains with timesteps_fraction = 1.0; so does this library
policy.diffusers.nft_beta | 1.0 | mapped | - | wfm.nft_beta
policy.diffusers.weight_copy_decay_type | 0 | ignored | - | differs: cosmos-rl rolls out with an "old" adapter copied from the trained one with this decay schedule; here the rollout and v_old are the policy at the start of the step (the same as decay type 0)
policy.diffusers.lora | - | refused | - | set [policy.lora] (cosmos-rl reads that one for the transformer)
policy.diffusers.sample.num_steps | 40 | mapped | - | wfm.num_inference_steps
policy.diffusers.sample.eval_num_steps | 40 | mapped | - | wfm.eval_num_inference_steps (with validation.enable; else 0, no evaluation rollouts)
policy.diffusers.sample.guidance_scale | 4.5 | mapped | [1.0] | wfm.guidance_scale (DiffusionNFT here is guidance-free: a value above 1 is refused)
policy.diffusers.sample.global_std | true | ignored | - | not read by cosmos-rl (its remote-reward advantages use the prompt group's std)
policy.diffusers.sample.noise_level | 1.0 | ignored | - | only acts with stochastic sampling (DiffusionNFT rolls out with deterministic steps)
policy.diffusers.sample.deterministic_sampling | false | refused | [true] | DiffusionNFT rolls out with deterministic (ODE) steps here; set it true
policy.diffusers.sample.solver | "dpm2" | ignored | - | differs: cosmos-rl's DPM-Solver-2 steps; here Euler steps on the same sigma grid
policy.diffusers.tokenizer | - | ignored | - | the VAE is the model folder's vae/
policy.lora.lora_names | ["default"] | ignored | [["default"], ["default", "old"]] | one adapter is trained here; DiffusionNFT's "old" adapter is the policy at the start of the step
rollout.backend | "vllm" | ignored | - | the world-model recipe samples with its own flow sampler
rollout.n_generation | 16 | mapped | - | wfm.num_samples_per_prompt
rollout.parallelism | - | ignored | - | the same ranks roll out and train here
rollout.batch_size | 1 | ignored | - | speed-only: prompts per rollout call
rollout.n_generation_mini_batch | - | ignored | - | speed-only: rollout micro-batching
train.train_policy.trainer_type | "sft" | mapped | - | wfm.algorithm ("diffusion_nft"; another diffusers trainer is refused)
train.train_policy.type | - | refused | ["grpo"] | diffusion SFT has no recipe here
train.train_policy.kl_beta | 0.0 | mapped | - | wfm.kl_beta (the velocity KL to the base model)
train.train_policy.mini_batch | 2 | mapped | - | train.train_policy.mini_batch (samples per forward / backward)
train.train_policy.batch_size_per_optimize | - | mapped | - | wfm.num_minibatches (rollouts per rank / it)
train.train_policy.advantage_low | -5.0 | refused | [-5.0] | advantages are clipped symmetrically here (+-adv_clip_max); make advantage_low = -advantage_high
train.train_policy.advantage_high | 5.0 | mapped | - | wfm.adv_clip_max
train.train_policy.mu_iterations | 1 | refused | [1] | one pass over each rollout batch here; remove the key
train.train_policy.use_remote_reward | false | mapped | - | remote_reward.rewards (the reward service; without it a world model has no reward here)
train.train_policy.remote_reward.scale | 1.0 | mapped | - | remote_reward.scale
train.train_policy.remote_reward.reward_fns | - | mapped | - | remote_reward.rewards (name, weight, score_key, clip = [clip_min, clip_max])
train.train_policy.remote_reward.reward_clip_min | -5.0 | ignored | - | the per-reward clips apply here (clip_min / clip_max of each reward_fns entry)
train.train_policy.remote_reward.reward_clip_max | 5.0 | ignored | - | the per-reward clips apply here (clip_min / clip_max of each reward_fns entry)
train.train_policy.remote_reward.batch_size | 1 | ignored | - | speed-only: reward requests are batched per step here
train.train_policy.dataset.name | "" | mapped | - | wfm.data.path (cosmos-rl's prompt-list datasets such as "pickscore" are not read here: give wfm.data.path a clip folder, whose captions are the prompts)
train.train_policy.dataset.split | "" | ignored | - | the clip folder is the training set
train.train_policy.uncentralized_training | false | ignored | - | launcher-only: controller layout
train.train_batch_per_replica | 8 | mapped | - | wfm.data.prompts_per_step (rollouts per replica / data-parallel ranks / n_generation)
train.ema_enable | false | ignored | - | differs: EMA weights are not kept here (cosmos-rl evaluates and exports the EMA weights with it; here the trained ones)
train.ema_decay | 0.9999 | ignored | - | only acts with ema_enable
train.ema_update_step_interval | 0 | ignored | - | only acts with ema_enable
train.non_text | false | ignored | - | launcher-only: non-text trainers
train.compile | true | ignored | - | speed-only: the world-model recipe does not compile the transformer
logging.multi_modal_log_interval | - | ignored | - | the evaluation rollouts write videos here ([wfm] eval_freq)
validation.enable | false | mapped | - | wfm.eval_num_inference_steps (0 without validation: no evaluation rollouts)
validation.freq | 20 | mapped | - | wfm.eval_freq
validation.dataset | - | ignored | - | evaluation prompts are fixed items of the training data here
"""


def _toml_value(text: str) -> Any:
    return None if text == "-" else tomllib.loads(f"v = {text}")["v"]


def _parse(table: str) -> dict[str, WorldModelRule]:
    rules = {}
    for line in filter(None, table.strip().splitlines()):
        key, default, how, noop, note = (part.strip() for part in line.split(" | ", 4))
        assert how in ("mapped", "ignored", "refused"), line
        rules[key] = WorldModelRule(key, _toml_value(default), how, note, tuple(_toml_value(noop) or ()))  # type: ignore[arg-type]
    return rules


COSMOS_RULES: dict[str, WorldModelRule] = _parse(_COSMOS)
"""Every key of cosmos-rl's Cosmos-Predict2.5 trainer config (``CosmosVisionGenConfig``) -> its rule."""
DIFFUSERS_RULES: dict[str, WorldModelRule] = _parse(_DIFFUSERS)
"""The world-model keys of a cosmos-rl diffusers file -> their rule (others: ``cosmos_rl.RULES``)."""

_COSMOS_TABLES = ("model", "model_parallel", "trainer", "optimizer", "scheduler", "dataloader_train",
                  "dataloader_val", "job", "checkpoint")
# the world-model guide's parallelism snippet, which a file of this library's own style may carry
_GUIDE_KEYS = {"model": {"fsdp_shard_size", "dp_replicate_size"}, "model_parallel": {"context_parallel_size"}}
T5_DIM = 1024
REASON1_LAYERS, REASON1_HIDDEN = 28, 3584
MOCK_VIDEO_SIZE = {"1080": (1072, 1920), "1024": (768, 1280), "720": (704, 1280), "512": (384, 640), "480": (432, 768)}
"""cosmos-rl's mock clip size (height, width) per resolution (its ``VIDEO_RES_SIZE_INFO[res]["9,16"]``)."""
MOCK_LENGTH = 1 << 15
"""Items of cosmos-rl's mock dataset (its ``LambdaDataset`` length)."""
_LOGGING_CALLBACKS = {"low_prec", "iter_speed", "param_count", "heart_beat", "device_monitor", "verify_data_batch_keys",
                      "manual_gc", "compile_tokenizer", "frame_loss_log", "dataloader_speed", "reward_callback",
                      "wandb_10x", "every_n_sample_ema", "progress_bar", "iteration_logger", "every_n"}


def world_model_kind(tree: dict[str, Any]) -> Kind | None:
    """Which kind of cosmos-rl world-model file a parsed TOML is (module docstring), or None.

    A file of this library's own style that carries only the world-model guide's parallel sizes
    (``[model] fsdp_shard_size`` / ``dp_replicate_size``, ``[model_parallel] context_parallel_size``)
    is not one: those keys are aliases of ``[policy.parallelism]`` there.
    """
    policy = tree.get("policy")
    if isinstance(policy, dict) and (policy.get("is_diffusers") is True or isinstance(policy.get("diffusers"), dict)):
        return "diffusers"
    for table in _COSMOS_TABLES:
        value = tree.get(table)
        if value is None:
            continue
        if table not in _GUIDE_KEYS or not isinstance(value, dict) or set(value) - _GUIDE_KEYS[table]:
            return "cosmos"
    return None


@dataclass
class WorldModelReading:
    """What reading a cosmos-rl world-model file did, in the shape of ``cosmos_rl.CosmosRLReading``:
    ``mapped`` ``(their key, our key(s), value)``, ``ignored`` ``(key, why)``, ``refused`` (key -> what
    to do), ``defaults`` (our key -> cosmos-rl's default for a key the file leaves out, where it
    differs from ours), ``translated`` (one line per meaning that changes shape). ``data_ranks``: the
    data-parallel size the file describes (for the per-step figures of :func:`effective_values`)."""

    kind: Kind
    mapped: list[tuple[str, str, Any]] = field(default_factory=list)
    ignored: list[tuple[str, str]] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)
    translated: list[str] = field(default_factory=list)
    data_ranks: int = 1
    # refusals that an explicit value of one of our keys lifts: our key -> (their key, what to do)
    unless_given: dict[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def title(self) -> str:
        return {"cosmos": "a cosmos-rl world-model config (its Cosmos-Predict2.5 trainer, --wfm-mode)",
                "diffusers": "a cosmos-rl world-model config (its diffusers trainer)"}[self.kind]

    @property
    def style_reason(self) -> str:
        """Why the file is read as a world-model file (the ``why`` of ``config.loader.read_cosmos_rl_file``)."""
        holds = {"cosmos": "top-level tables of its Cosmos-Predict2.5 trainer ([model], [trainer], [dataloader_train], ...)",
                 "diffusers": "[policy] is_diffusers / [policy.diffusers]"}[self.kind]
        return f"a cosmos-rl world-model file (configs/cosmos-predict2-5/ layout: {holds})"

    def finish(self, tree: dict[str, Any], explicit: set[str]) -> None:
        """The refusals that depend on what was given on the command line (``explicit``: our keys);
        every refusal goes to ``tree["unsupported"]``."""
        for ours, (theirs, what) in self.unless_given.items():
            if ours not in explicit:
                self.refused[theirs] = what
        if self.refused:
            tree.setdefault("unsupported", {}).update(self.refused)

    def warning(self, source: str) -> str:
        """The one start-up message about the file."""
        parts = [f"{source} is read as {self.title}"]
        if self.ignored:
            parts.append("ignored (no effect here): " + "; ".join(f"{k} ({why})" for k, why in self.ignored))
        parts += self.translated
        if self.refused:
            parts.append("refused (the recipe stops on these): " + "; ".join(f"{k}: {v}" for k, v in self.refused.items()))
        return ". ".join(parts)


def rule_for(path: str, kind: Kind = "cosmos") -> WorldModelRule | cosmos_rl.KeyRule | None:
    """The rule of ``path`` (or of the table it lies in) in a world-model file of ``kind``."""
    rules = COSMOS_RULES if kind == "cosmos" else DIFFUSERS_RULES
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        rule = rules.get(".".join(parts[:i]))
        if rule is not None:
            return rule
    return None if kind == "cosmos" else cosmos_rl.rule_for(path)


def _leaves(tree: dict[str, Any], kind: Kind, prefix: str = "") -> list[tuple[str, Any]]:
    """The file's keys down to the ones a rule names (a table a rule names exactly is one leaf unless
    a longer rule names a key inside it)."""
    rules = COSMOS_RULES if kind == "cosmos" else DIFFUSERS_RULES
    out = []
    for key, value in tree.items():
        path = f"{prefix}{key}"
        deeper = any(k.startswith(path + ".") for k in rules) or (kind == "diffusers" and path not in rules)
        if isinstance(value, dict) and value and (deeper or path not in rules):
            out += _leaves(value, kind, path + ".")
        else:
            out.append((path, value))
    return out


class _File:
    """A parsed file with cosmos-rl's defaults: :meth:`get` gives the file's value or the table's default."""

    def __init__(self, tree: dict[str, Any], rules: dict[str, WorldModelRule]) -> None:
        self.tree, self.rules = tree, rules

    def has(self, key: str) -> bool:
        node: Any = self.tree
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    def get(self, key: str, default: Any = None) -> Any:
        node: Any = self.tree
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                rule = self.rules.get(key)
                return rule.default if rule is not None and rule.default is not None else default
            node = node[part]
        return node


def targets(rule: WorldModelRule | cosmos_rl.KeyRule) -> tuple[str, str]:
    """``(our keys, the rest of the note)`` of a mapped rule: its note is ``"key[, key...][ (why)]"``
    (``"="``: the same key)."""
    head, _, rest = rule.note.partition(" (")
    ours = rule.key if head == "=" else head
    return ours, rest[:-1] if rest.endswith(")") else rest


def _classify(tree: dict[str, Any], kind: Kind, reading: WorldModelReading) -> None:
    """Every key of the file into ``reading``: mapped (with its note's targets), ignored (once per
    table a rule covers whole), refused."""
    seen_tables: set[str] = set()
    for path, value in _leaves(tree, kind):
        rule = rule_for(path, kind)
        if rule is None:
            reading.ignored.append((path, "not a key of cosmos-rl's world-model config: cosmos-rl ignores it too"))
            continue
        if rule.how == "mapped":
            reading.mapped.append((path, targets(rule)[0], value))
        elif value in rule.noop or (isinstance(value, dict) and not value):
            continue
        elif rule.how == "ignored":
            if rule.key != path:  # a key inside a table ignored whole: the table, once
                if rule.key not in seen_tables:
                    seen_tables.add(rule.key)
                    reading.ignored.append((rule.key, rule.note))
                continue
            reading.ignored.append((path, rule.note))
        else:
            reading.refused[path] = f"= {value!r}: {rule.note}"


def _put(tree: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node = tree
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def _text_dim(encoder: str, strategy: str, n_per_group: int) -> int:
    """Width of the text embeddings cosmos-rl's network takes (``compute_text_embeddings_online``)."""
    if encoder != "reason1_7B":
        return T5_DIM
    if strategy == "full_concat":
        return REASON1_LAYERS * REASON1_HIDDEN
    if strategy == "mean_pooling":
        return REASON1_HIDDEN
    return math.ceil(REASON1_LAYERS / n_per_group) * REASON1_HIDDEN


def _read_cosmos(f: _File, reading: WorldModelReading) -> dict[str, Any]:
    """Our tree for a Cosmos-trainer file (rules in :data:`COSMOS_RULES`)."""
    ours: dict[str, Any] = {}
    rl = "model.rl."

    # model, parallelism, precision: full fine-tuning of a diffusers folder, FSDP2 (HSDP replicas inferred)
    _put(ours, "policy.model_name_or_path", f.get("checkpoint.load_path") or "")
    if not f.get("checkpoint.load_path"):
        reading.unless_given["policy.model_name_or_path"] = (
            "checkpoint.load_path", "= '': cosmos-rl builds the network of [model.net] with random weights; here the "
            "network is a diffusers folder: give policy.model_name_or_path (or 'tiny', the tiny random test model)")
    elif f.has("checkpoint.model_id"):
        reading.unless_given["policy.model_name_or_path"] = (
            "checkpoint.model_id", f"= {f.get('checkpoint.model_id')!r}: {COSMOS_RULES['checkpoint.model_id'].note}")
    _put(ours, "policy.dtype", f.get("model.precision"))
    _put(ours, "policy.model_gradient_checkpointing", f.get("model.net.sac_config.mode") != "none")
    _put(ours, "policy.parallelism.dp_shard_size", f.get("model.fsdp_shard_size"))
    _put(ours, "policy.parallelism.dp_replicate_size", -1)
    _put(ours, "policy.parallelism.cp_size", f.get("model_parallel.context_parallel_size"))
    reading.data_ranks = f.get("model.fsdp_shard_size") * f.get("model.dp_replicate_size")

    # algorithm
    data_beta = f.get(rl + "data_beta")
    group = f.get(rl + "num_rollout")
    w = {
        "algorithm": "ddrl" if data_beta > 0 else "flow_grpo",
        "num_samples_per_prompt": group,
        "group_ranks": group,
        "num_inference_steps": f.get(rl + "sample_steps"),
        "train_steps": list(f.get(rl + "train_on")),
        "guidance_scale": f.get(rl + "guidance"),
        "guidance_convention": "cosmos",
        "clip_range": f.get(rl + "clip_ratio"),
        "kl_beta": f.get(rl + "kl_beta"),
        "data_beta": data_beta,
        "ddrl_rollout_noise": f.get(rl + "use_rl_sigma_and_noise"),
        "ddrl_rollout_sigma": f.get(rl + "use_rl_sigma_and_noise"),
        "shared_initial_noise": f.get(rl + "use_same_seed"),
        "advantage_transform": "neg_exp" if f.get(rl + "exp_reward") else "none",
        "adv_clip_max": f.get(rl + "reward_config.adv_clip_max"),
        "advantage_std": "sample",
        "loss_scale": f.get("model.loss_scale"),
        "reference_update_interval": f.get(rl + "update_ref_every_iter") if f.get(rl + "kl_beta") > 0 else 0,
        "start_reward_server": False,
        "sampler": {"sde_type": "flow_grpo", "sde_window_size": 0},
    }
    lo, hi = f.get(rl + "min_num_conditional_frames"), f.get(rl + "max_num_conditional_frames")
    w["num_conditional_frames"] = max(hi, 1)
    if hi == 0:
        w["conditioning"] = "text"
    elif lo == hi == 1:
        w["conditioning"] = "image"
    else:
        w["conditioning"] = "video"
        if lo != hi:
            w["min_num_conditional_frames"] = lo
            reading.translated.append(f"model.rl conditional frames {lo}..{hi}: each step draws the number of "
                                      "condition latent frames (0: text-to-world) for its whole batch, as there")
    if group > 1:
        reading.translated.append(f"model.rl.num_rollout = {group}: a prompt's {group} rollouts are spread over "
                                  f"{group} data-parallel ranks, one each, as there (wfm.group_ranks; a run with "
                                  "fewer ranks rolls out more of the group on each)")

    # rewards: the reward service (cosmos-rl's remote_reward), scored as there
    remote = rl + "reward_config.remote_reward."
    if f.get(remote + "enabled"):
        ours["remote_reward"] = {
            "enqueue_url": f.get(remote + "enqueue_url"), "fetch_url": f.get(remote + "fetch_url"),
            "token_env": "WFM_REWARD_TOKEN", "scale": f.get(remote + "scale"),
            "rewards": [{"name": f.get(remote + "reward_fn"), "weight": 1.0, "score_key": f.get(remote + "score_key"),
                         "clip": [f.get(remote + "reward_clip_min"), f.get(remote + "reward_clip_max")]}]}
    elif not any(f.get(rl + f"reward_config.{k}.enabled") for k in ("aesthetic", "image_reward", "fake_reward")):
        reading.refused[remote + "enabled"] = "= False: no reward is enabled; enable the reward service (remote_reward)"

    # optimizer and schedule
    f_max, f_min = f.get("scheduler.f_max"), f.get("scheduler.f_min")
    warmup, cycles = f.get("scheduler.warm_up_steps"), f.get("scheduler.cycle_lengths")
    max_iter = f.get("trainer.max_iter")
    train: dict[str, Any] = {
        "optm_name": "AdamW",
        "optm_lr": f.get("optimizer.lr") * f_max[0],
        "optm_weight_decay": f.get("optimizer.weight_decay"),
        "optm_betas": list(f.get("optimizer.betas")),
        "optm_eps": f.get("optimizer.eps"),
        "master_dtype": "float32" if f.get("optimizer.master_weights") else "bfloat16",
        "optm_warmup_steps": warmup[0],
        "optm_decay_type": "constant",
        "seed": f.get("trainer.seed"),
        "max_steps": max_iter,
        "resume": f.has("job.timestamp"),
        "ckpt": {"enable_checkpoint": True, "save_freq": f.get("checkpoint.save_iter"), "max_keep": -1,
                 "save_mode": "async" if f.get("checkpoint.dcp_async_mode_enabled") else "sync",
                 "export_safetensors": False},
    }
    if len(warmup) != 1 or len(cycles) != 1:
        reading.refused["scheduler.cycle_lengths"] = f"= {cycles!r}: one schedule cycle here; keep one"
    elif f_min[0] != f_max[0]:
        if cycles[0] != max_iter:
            reading.refused["scheduler.f_min"] = (f"= {f_min!r}: a linear decay that ends at cycle_lengths = {cycles[0]}, "
                                                  f"not at trainer.max_iter = {max_iter}; here the decay ends at the last step")
        train.update(optm_decay_type="linear", optm_min_lr_factor=f_min[0] / f_max[0])

    # callbacks: gradient clip, evaluation samples, W&B
    callbacks = {c.get("name"): c.get("args", {}) for c in f.get("trainer.callbacks", []) if isinstance(c, dict)}
    train["optm_grad_norm_clip"] = callbacks["grad_clip"].get("clip_norm", 1.0) if "grad_clip" in callbacks else 0.0
    sample = callbacks.get("every_n_sample_reg")
    if sample is not None and sample.get("guidance", [3.0, 7.0, 9.0, 13.0]):
        w.update(eval_num_inference_steps=sample.get("num_sampling_step", 35), eval_freq=sample.get("every_n", 1))
        reading.translated.append(f"trainer.callbacks every_n_sample_reg: evaluation rollouts of {w['eval_num_inference_steps']} "
                                  f"steps every {w['eval_freq']} steps, with the training guidance (cosmos-rl samples "
                                  f"at guidance {sample.get('guidance', [3.0, 7.0, 9.0, 13.0])})")
    else:
        w["eval_num_inference_steps"] = 0  # cosmos-rl samples nothing beyond the training rollouts
    for name in callbacks:
        if name not in ("grad_clip", "every_n_sample_reg", "wandb"):
            reading.ignored.append((f"trainer.callbacks.{name}", "only logs, times, checks or collects garbage"
                                    if name in _LOGGING_CALLBACKS else "not a callback cosmos-rl knows"))
    if callbacks.get("grad_clip", {}).get("force_finite", True) and "grad_clip" in callbacks:
        reading.ignored.append(("trainer.callbacks.grad_clip.force_finite",
                                "differs: cosmos-rl zeroes non-finite gradients and steps; here [train] nonfinite "
                                "decides (\"stop\": the run stops before a damaged step)"))
    wandb = "wandb" in callbacks and f.get("job.wandb_mode") != "disabled"
    ours["logging"] = {"logger": ["console", "wandb"] if wandb else ["console"], "log_freq": f.get("trainer.logging_iter"),
                       "project_name": f.get("job.project"), "experiment_name": f.get("job.name") or ""}
    root = os.environ.get("COSMOS_OUTPUT_DIR", "./outputs")
    train["output_dir"] = f"{root}/{f.get('job.project')}/{f.get('job.group')}/{f.get('job.name')}"

    # data; a rank's rollouts (one per prompt) go through the network in one forward, as there
    w["data"] = _cosmos_data(f, reading)
    train["train_policy"] = {"mini_batch": w["data"].get("prompts_per_step", 1)}
    ours["wfm"], ours["train"] = w, train
    return ours


def _cosmos_data(f: _File, reading: WorldModelReading) -> dict[str, Any]:
    """``[wfm.data]`` of a Cosmos-trainer file: a local clip folder, or cosmos-rl's mock data."""
    loader = "dataloader_train."
    text_dim = _text_dim(f.get("model.text_encoder_class"), f.get("model.text_encoder_config.embedding_concat_strategy"),
                         f.get("model.text_encoder_config.n_layers_per_group"))
    # fps: cosmos-rl sends every video to the reward service at 16 fps
    data: dict[str, Any] = {"text_dim": text_dim, "max_tokens": 512, "fps": 16.0}
    kind = f.get(loader + "type")
    if kind == "local":
        video = loader + "video_dataloader."
        if not f.has(video + "dataset_dir"):
            reading.refused[loader + "video_dataloader"] = "missing: the local loader needs a video_dataloader"
            return data
        height, width = f.get(video + "video_size")
        offline = f.get(video + "offline_text_embedding")
        online = f.get("model.text_encoder_config.compute_online") if f.has("model.text_encoder_config") else False
        data.update(kind="clip_folder", path=f.get(video + "dataset_dir"), num_frames=f.get(video + "num_frames"),
                    height=height, width=width, prompts_per_step=f.get(video + "batch_size"), text_encoder="none")
        if offline and not online:
            data["embedding_dir"] = "t5_xxl" if f.get(video + "text_encoder_type") == "t5_xxl" else "cosmos_reason1"
            reading.translated.append(f"offline text embeddings: <dataset>/{data['embedding_dir']}/<name>.pickle there; "
                                      "here .npy / .safetensors in that folder (pickles only with wfm.data.allow_pickle = true)")
        elif online:
            strategy = f.get("model.text_encoder_config.embedding_concat_strategy")
            if strategy != "full_concat":
                reading.refused["model.text_encoder_config.embedding_concat_strategy"] = (
                    f"= {strategy!r} with compute_online: the precompute step writes full_concat embeddings; "
                    "precompute these yourself into <dataset>/text_embedding/")
            reading.translated.append("model.text_encoder_config.compute_online = true: Cosmos-Reason1 embeddings are "
                                      "precomputed here: python -m cosmos_primitives.data.precompute_text_embeddings "
                                      f"{data['path']} --encoder {f.get('model.text_encoder_config.ckpt_path')} --max-tokens 512")
        else:
            reading.refused[video + "offline_text_embedding"] = (
                "= False without model.text_encoder_config.compute_online: cosmos-rl computes T5 embeddings online; "
                "precompute them into <dataset>/text_embedding/ (.npy / .safetensors)")
        reading.translated.append(f"video_size = [{height}, {width}] is (height, width) in cosmos-rl's resize: "
                                  f"{height}-high, {width}-wide clips, as there")
    elif kind == "web" and f.get(loader + "video_dataloader.dataloader.dataset.len_t5"):
        dataset = loader + "video_dataloader.dataloader."
        height, width = MOCK_VIDEO_SIZE[str(f.get(dataset + "dataset.resolution", "512"))]
        data.update(kind="mock", mock_num_samples=MOCK_LENGTH, num_frames=f.get(dataset + "dataset.num_video_frames"),
                    height=height, width=width, max_tokens=f.get(dataset + "dataset.len_t5"),
                    text_dim=f.get(dataset + "dataset.t5_dim", T5_DIM), prompts_per_step=f.get(dataset + "batch_size"),
                    text_encoder="hash")
        reading.translated.append("mock data: random clips with random captions' embeddings (the hashing embedder; "
                                  "cosmos-rl draws Gaussian embeddings)")
    else:
        reading.refused[loader + "type"] = (f"= {kind!r}: cosmos-rl's web-dataset registry is not read here; set "
                                            "wfm.data.kind = \"webdataset\" and wfm.data.shards")
    if f.get(loader + "video_dataloader.ratio", 1) == 0:
        reading.refused[loader + "video_dataloader.ratio"] = "= 0: the world-model recipe trains on video"
    return data


def _read_diffusers(f: _File, reading: WorldModelReading) -> dict[str, Any]:
    """Our tree for a diffusers-trainer file: the world-model keys by :data:`DIFFUSERS_RULES`, the
    others by ``cosmos_rl.RULES`` (mapped ones kept, with cosmos-rl's defaults where ours differ)."""
    ours: dict[str, Any] = {}
    d, tp = "policy.diffusers.", "train.train_policy."
    trainer = f.get(tp + "trainer_type")
    if trainer != "diffusion_nft":
        reading.refused[tp + "trainer_type"] = (f"= {trainer!r}: the diffusers trainer here is DiffusionNFT "
                                                "(\"diffusion_nft\"); FlowGRPO / DDRL run from [wfm] in our format")
    n = f.get("rollout.n_generation")
    shard = f.get("policy.parallelism.dp_shard_size", 1)
    replicate = f.get("policy.parallelism.dp_replicate_size", 1)
    reading.data_ranks = max(shard, 1) * replicate
    batch = f.get("train.train_batch_per_replica")
    per_rank, left = divmod(batch, reading.data_ranks * n)
    if left or not per_rank:
        reading.refused["train.train_batch_per_replica"] = (
            f"= {batch}: {batch} rollouts per replica cannot be shared as whole prompt groups of n_generation = {n} "
            f"by its {reading.data_ranks} data-parallel ranks")
        per_rank = max(per_rank, 1)
    else:
        reading.translated.append(f"train.train_batch_per_replica = {batch} rollouts per replica: {batch // reading.data_ranks} "
                                  f"per data-parallel rank = {per_rank} prompts x n_generation {n} (wfm.data.prompts_per_step)")
    steps = f.get(d + "sample.num_steps")
    guidance = f.get(d + "sample.guidance_scale")
    if guidance > 1.0:
        reading.refused[d + "sample.guidance_scale"] = f"= {guidance}: DiffusionNFT here is guidance-free; set it to 1.0"
    height, width = f.get(d + "inference_size")
    validating = f.get("validation.enable")
    rollouts = per_rank * n
    per_optimize = f.get(tp + "batch_size_per_optimize")
    minibatches = math.ceil(rollouts / min(per_optimize, rollouts)) if per_optimize else 1
    w = {
        "algorithm": "diffusion_nft",
        "num_samples_per_prompt": n,
        "num_inference_steps": steps,
        "eval_num_inference_steps": f.get(d + "sample.eval_num_steps") if validating else 0,
        "eval_freq": f.get("validation.freq"),
        "guidance_scale": 1.0,
        "kl_beta": f.get(tp + "kl_beta"),
        "adv_clip_max": f.get(tp + "advantage_high"),
        "advantage_std": "sample",
        "nft_beta": f.get(d + "nft_beta"),
        "nft_num_timesteps": max(1, int(steps * f.get(d + "timesteps_fraction"))),
        "nft_timesteps": "sampler",
        "num_minibatches": minibatches,
        "start_reward_server": False,
        "data": {"kind": "clip_folder", "path": "", "num_frames": f.get(d + "train_frames"), "height": height,
                 "width": width, "max_tokens": f.get(d + "max_prompt_length"), "prompts_per_step": per_rank,
                 "text_encoder": "none", "fps": 16.0},
    }
    reading.unless_given["wfm.data.path"] = (
        tp + "dataset.name", f"= {f.get(tp + 'dataset.name')!r}: cosmos-rl's prompt-list datasets are not read here; "
        "give wfm.data.path a clip folder (videos/, metas/ with the prompts as captions, text_embedding/)")
    ours["wfm"] = w
    fns = f.get(tp + "remote_reward.reward_fns", [])
    if f.get(tp + "use_remote_reward") and fns:
        ours["remote_reward"] = {"token_env": "WFM_REWARD_TOKEN", "scale": f.get(tp + "remote_reward.scale"),
                                 "rewards": [{"name": r["name"], "weight": r.get("weight", 1.0),
                                              "score_key": r.get("score_key"),
                                              "clip": [r.get("clip_min", -5.0), r.get("clip_max", 5.0)]} for r in fns]}
    else:
        reading.refused[tp + "use_remote_reward"] = "= False (or no reward_fns): a world model is scored by the reward service here; set use_remote_reward and remote_reward.reward_fns"
    _put(ours, "train.train_policy.mini_batch", f.get(tp + "mini_batch"))
    # the keys every cosmos-rl file shares: cosmos_rl.RULES decides, with cosmos-rl's defaults
    for key, value in _shared_keys(f, reading).items():
        _put(ours, key, value)
    return ours


# the keys a diffusers file shares with cosmos-rl's LLM / VLM config that the world-model recipe reads
# (our keys): a file leaving one out gets cosmos-rl's default from the rule list (config/compat/rules.py)
_SHARED_READ = (
    "train.optm_lr", "train.optm_eps", "train.optm_warmup_steps", "train.optm_weight_decay", "train.optm_betas",
    "train.optm_grad_norm_clip", "train.optm_min_lr_factor", "train.ckpt.save_freq", "train.ckpt.max_keep",
    "train.ckpt.enable_checkpoint", "train.ckpt.export_safetensors", "train.epoch", "train.output_dir",
    "logging.logger", "logging.project_name", "policy.model_gradient_checkpointing", "policy.dtype",
    "policy.parallelism.dp_shard_size", "policy.parallelism.dp_replicate_size", "policy.model_name_or_path",
)
_SHARED_DEFAULTS = {rule.target: rule.cosmos_rl_value() for rule in RULE_LIST
                    if rule.how == "mapped" and rule.target in _SHARED_READ}
if set(_SHARED_DEFAULTS) != set(_SHARED_READ):  # pragma: no cover - a key the rule list does not map
    raise ValueError(f"config/compat/cosmos_rl_wfm.py: no mapped rule for {set(_SHARED_READ) - set(_SHARED_DEFAULTS)}")
_SHARED_RENAMES = {key: cosmos_rl.RULES[key].target for key in ("train.epsilon", "train.param_dtype",
                                                                 "train.max_num_steps")}


def _our_defaults() -> dict[str, Any]:
    """Our default of every dotted key of :class:`~cosmos_primitives.config.root.Config`."""
    import msgspec

    from cosmos_primitives.config.root import Config

    def walk(node: Any, prefix: str) -> dict[str, Any]:
        out = {}
        for key, value in node.items():
            out.update(walk(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
        return out

    return walk(msgspec.to_builtins(Config()), "")


def _shared_keys(f: _File, reading: WorldModelReading) -> dict[str, Any]:
    """Our values of a diffusers file's non-world-model keys that ``cosmos_rl.RULES`` maps (same meaning),
    plus cosmos-rl's defaults for the ones the recipe reads and the file leaves out."""
    out: dict[str, Any] = {}
    kept = []
    for key, ours, value in reading.mapped:
        if rule_for(key, "diffusers") is not cosmos_rl.rule_for(key) or key in DIFFUSERS_RULES:
            kept.append((key, ours, value))  # a world-model key, read by _read_diffusers
            continue
        target = _SHARED_RENAMES.get(key, key)
        if target.startswith(("train.", "policy.", "logging.")) and not target.startswith("train.train_policy"):
            out[target] = value
            kept.append((key, target, value))
        else:  # an LLM / VLM setting (GRPO loss, text rollout, validation of text)
            reading.ignored.append((key, "a language-model setting: the world-model recipe does not read it"))
    reading.mapped = kept
    ours_by_default = _our_defaults()
    for key, value in _SHARED_DEFAULTS.items():
        if key not in out:
            out[key] = value
            if ours_by_default.get(key) != value:
                reading.defaults[key] = value
    if "policy.lora" in {k.rsplit(".", 1)[0] for k in out}:
        for name, value in cosmos_rl.COSMOS_RL_LORA_DEFAULTS.items():
            out.setdefault(f"policy.lora.{name}", value)
    if f.get("policy.model_revision"):
        out["policy.model_revision"] = f.get("policy.model_revision")
    return out


def read_world_model_file(tree: dict[str, Any]) -> WorldModelReading | None:
    """For a cosmos-rl world-model file (:func:`world_model_kind`): replace ``tree``'s contents by our
    keys (in place) and return the reading; None (``tree`` untouched) for any other file."""
    kind = world_model_kind(tree)
    if kind is None:
        return None
    reading = WorldModelReading(kind)
    _classify(tree, kind, reading)
    f = _File(tree, COSMOS_RULES if kind == "cosmos" else DIFFUSERS_RULES)
    ours = _read_cosmos(f, reading) if kind == "cosmos" else _read_diffusers(f, reading)
    for theirs, _ in reading.unless_given.values():  # refused in finish() unless our key is given
        reading.refused.pop(theirs, None)
    tree.clear()
    tree.update(ours)
    return reading


def effective_values(config: Any, data_ranks: int) -> dict[str, Any]:
    """What a world-model run of ``config`` trains with on ``data_ranks`` data-parallel ranks: rollouts
    per step per rank and in all, the peak learning rate, the warmup steps, the algorithm.
    (``config``: a ``cp.Config``; a ``[wfm] group_ranks`` group shares its prompts.)"""
    w = config.wfm
    spread = math.gcd(w.group_ranks, data_ranks)
    per_rank = w.data.prompts_per_step * w.num_samples_per_prompt // spread
    return {"samples_per_step_per_rank": per_rank, "samples_per_step": per_rank * data_ranks,
            "prompts_per_step": w.data.prompts_per_step * data_ranks // spread,
            "num_samples_per_prompt": w.num_samples_per_prompt, "lr": config.train.optm_lr,
            "warmup_steps": config.train.optm_warmup_steps, "algorithm": w.algorithm,
            "max_steps": config.train.max_steps, "data_ranks": data_ranks}


def _shown(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else str(value).replace("'", '"')


def render_tables() -> str:
    """The markdown tables of :data:`COSMOS_RULES` and :data:`DIFFUSERS_RULES` in docs/from_cosmos_rl.md."""
    out = []
    for title, rules in (("Cosmos-Predict2.5 trainer files", COSMOS_RULES), ("diffusers trainer files", DIFFUSERS_RULES)):
        out += [f"#### {title}", "", "| cosmos-rl key | cosmos-rl default | here | what it becomes / why / what to do |",
                "|---|---|---|---|"]
        out += [f"| `{r.key}` | `{_shown(r.default)}` | {r.how} | {r.note.replace('|', chr(92) + '|')} |" for r in rules.values()]
        out.append("")
    return "\n".join(out)
