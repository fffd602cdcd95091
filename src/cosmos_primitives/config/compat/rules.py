# ruff: noqa: E501  (one cosmos-rl key per line)
"""The one typed list of how every key of cosmos-rl's config class is read here.

The source of truth for cosmos-rl's keys, meanings and defaults is its config class
(``cosmos_rl/policy/config/__init__.py`` in nvidia-cosmos/cosmos-rl, 0.4.7). Each :class:`Rule` is one of:

- ``mapped``: read as ``target`` (our key; the same name unless said otherwise), same meaning, with
  ``transform`` applied to the value when the spelling differs; ``fill``: cosmos-rl's default
  differs from ours, so a file read as cosmos-rl style gets cosmos-rl's default for it when unset;
- ``ignored``: accepted, changes nothing here (speed-only or launcher-only); the loader lists such
  keys in one warning with the reason;
- ``refused``: the file loads (so it can be inspected and migrated), but a value that asks for
  something this library cannot do is recorded in ``Config.unsupported`` and the recipes stop at
  start-up (``cp.config.check_runnable``) with the reason saying what to do instead.

A value among a key's ``noop`` values asks for nothing (``fsdp_offload = false``) and is dropped
silently. Sections for other kinds of model (``[vla]``, ``[policy.diffusers]``) are refused as a
whole.

Everything else is generated from :data:`RULE_LIST`: the aliases the loader moves onto our keys
(:func:`cosmos_rl_aliases`), the defaults a cosmos-rl file gets (:data:`COSMOS_RL_DEFAULTS`,
:data:`COSMOS_RL_LORA_DEFAULTS`) and the table in ``docs/from_cosmos_rl.md`` (:func:`render_table`,
rewritten by ``python -m cosmos_primitives.config.compat.docs_table --write``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from cosmos_primitives.config.grpo import reward_function_as_dict

How = Literal["mapped", "ignored", "refused"]
Family = Literal["llm", "cosmos", "diffusers"]
"""Which cosmos-rl files a rule reads: ``"llm"`` its LLM / VLM config class (``[policy]``, ``[train]``,
...); ``"cosmos"`` its Cosmos-Predict2.5 world-model trainer files (``[model]``, ``[trainer]``, ...);
``"diffusers"`` the world-model keys of its diffusers files (their other keys follow the ``"llm"`` rules)."""


@dataclass(frozen=True)
class Rule:
    """How one cosmos-rl key is read.

    ``default``: cosmos-rl's (None where it has none); ``reason``: for ``mapped`` how it is read
    (may be empty), for ``ignored`` why, for ``refused`` what to do; ``target``: our key (``mapped``
    only); ``transform``: cosmos-rl's value -> ours (None: the same); ``fill``: a cosmos-rl file that
    leaves the key unset gets ``transform(default)`` on ``target``; ``noop``: values asking for nothing;
    ``family``: which files the rule reads (:data:`Family`). A world-model rule's ``target`` may name
    several of our keys, comma-separated, when one cosmos-rl key sets them together.
    """

    key: str
    default: Any
    how: How
    reason: str
    target: str | None = None
    transform: Callable[[Any], Any] | None = None
    fill: bool = False
    noop: tuple[Any, ...] = ()
    family: Family = "llm"

    def __post_init__(self) -> None:
        if (self.how == "mapped") != (self.target is not None) or (self.fill and self.how != "mapped"):
            raise ValueError(f"rule {self.key!r}: a target and fill belong to mapped rules only")

    @property
    def note(self) -> str:
        """The docs table's last column: for ``mapped`` our key (``=``: the same) then the reason."""
        if self.how != "mapped":
            return self.reason
        head = "=" if self.target == self.key else str(self.target)
        return f"{head} {self.reason}" if self.reason else head

    def cosmos_rl_value(self) -> Any:
        """cosmos-rl's default as this library spells it (``transform(default)``)."""
        return self.transform(self.default) if self.transform is not None and self.default is not None \
            else self.default


KeyRule = Rule  # the name the loader and the migration report used before the rule list was typed


def mapped(key: str, default: Any, reason: str = "", *, to: str | None = None,
           transform: Callable[[Any], Any] | None = None, fill: bool = False, noop: tuple[Any, ...] = (),
           family: Family = "llm") -> Rule:
    """A key read as ``to`` (default: the same key)."""
    return Rule(key, default, "mapped", reason, to or key, transform, fill, noop, family)


def ignored(key: str, default: Any, why: str, noop: tuple[Any, ...] = (), family: Family = "llm") -> Rule:
    """A key accepted that changes nothing here."""
    return Rule(key, default, "ignored", why, noop=noop, family=family)


def refused(key: str, default: Any, what_to_do: str, noop: tuple[Any, ...] = (), family: Family = "llm") -> Rule:
    """A key whose values (other than ``noop``) this library cannot do."""
    return Rule(key, default, "refused", what_to_do, noop=noop, family=family)


def _bool_as(if_true: str, if_false: str) -> Callable[[Any], Any]:
    """A transform reading a switch as one of two values of a choice key (non-bools are left for the
    type check to reject with the key's name)."""
    def transform(value: Any) -> Any:
        return (if_true if value else if_false) if isinstance(value, bool) else value

    return transform


def _as_list(value: object) -> object:
    """cosmos-rl's ``freeze_pattern`` / ``trainable_pattern`` take one regex or a list."""
    return [value] if isinstance(value, str) else value


def _parallelism(s: str) -> tuple[Rule, ...]:
    """``[policy.parallelism]`` and ``[rollout.parallelism]`` share cosmos-rl's ParallelismConfig."""
    return (
        ignored(f"{s}.parallelism.n_init_replicas", 1, 'launcher-only: torchrun starts the ranks; replicas are data-parallel ranks here'),
        mapped(f"{s}.parallelism.tp_size", 2, '(ours defaults to 1)', fill=True),
        mapped(f"{s}.parallelism.cp_size", 1, '(policy: Ulysses context parallel over the decoder, heads divisible by cp_size; rollout engines do not split sequences)'),
        refused(f"{s}.parallelism.ep_size", 1, 'expert parallelism is not supported; remove the key', noop=(1,)),
        mapped(f"{s}.parallelism.dp_shard_size", 1, '(ours defaults to -1: all remaining ranks)', fill=True),
        mapped(f"{s}.parallelism.pp_size", 1, '(above 1 is refused when the mesh is built: pipeline parallelism is not implemented)'),
        ignored(f"{s}.parallelism.pp_dynamic_shape", False, 'only acts with pp_size > 1'),
        ignored(f"{s}.parallelism.pp_micro_batch_size", 1, 'only acts with pp_size > 1'),
        mapped(f"{s}.parallelism.dp_replicate_size", 1),
        ignored(f"{s}.parallelism.pp_schedule", 'Interleaved1F1B', 'only acts with pp_size > 1'),
        ignored(f"{s}.parallelism.pp_layers_per_stage", 2, 'only acts with pp_size > 1'),
        ignored(f"{s}.parallelism.cp_rotate_method", None, 'only acts with cp_size > 1'),
    )


# cosmos-rl's world-model files (config/compat/cosmos_rl_wfm.py reads them). A rule on a table covers
# every key inside it unless a longer rule names one; the defaults are checked against cosmos-rl's own
# classes by tests/test_cosmos_rl_wfm.py.
_COSMOS_WFM: tuple[Rule, ...] = (
    ignored('model.tokenizer', None, "the VAE is the model folder's vae/ (its temporal window and chunking are its own)", family='cosmos'),
    ignored('model.conditioner', None, "the transformer's inputs (fps, padding mask, text, condition flag) are fed as the diffusers model takes them; a text dropout_rate (caption dropout, which cosmos-rl applies to the DDRL data term) is not applied here", family='cosmos'),
    mapped('model.text_encoder_class', 'T5', '("T5": 1024; "reason1_7B": Cosmos-Reason1-7B\'s hidden states combined by embedding_concat_strategy, 100352 wide with full_concat)', to='wfm.data.text_dim', family='cosmos'),
    mapped('model.text_encoder_config.compute_online', False, '("none": the embeddings are computed ahead of the run here, by the same encoder and prompt: python -m cosmos_primitives.data.precompute_text_embeddings DATASET --encoder nvidia/Cosmos-Reason1-7B --max-tokens 512, into the clip folder\'s text_embedding/)', to='wfm.data.text_encoder', family='cosmos'),
    mapped('model.text_encoder_config.embedding_concat_strategy', 'mean_pooling', '(the precompute step writes full_concat; another strategy with compute_online is refused: precompute those embeddings yourself)', to='wfm.data.text_dim', noop=('full_concat',), family='cosmos'),
    ignored('model.text_encoder_config.n_layers_per_group', 5, 'only acts with embedding_concat_strategy = "pool_every_n_layers_and_concat"', family='cosmos'),
    ignored('model.text_encoder_config.ckpt_path', 'nvidia/Cosmos-Reason1-7B', 'the text encoder of the precompute step (its --encoder)', family='cosmos'),
    ignored('model.text_encoder_config.tokenizer_type', 'Qwen/Qwen2-VL-2B-Instruct', "the text encoder's tokenizer comes with its checkpoint", family='cosmos'),
    ignored('model.text_encoder_config.encoder_model_config', None, "the text encoder's architecture comes with its checkpoint", family='cosmos'),
    mapped('model.net.sac_config.mode', 'block_wise', '(true unless "none": activation checkpointing of the transformer blocks)', to='policy.model_gradient_checkpointing', family='cosmos'),
    ignored('model.net.sac_config.every_n_blocks', 1, 'speed-only: which blocks recompute (every block here)', family='cosmos'),
    ignored('model.net', None, "the network's architecture is the model folder's transformer/config.json", family='cosmos'),
    ignored('model.ema', None, 'EMA weights are not kept here (cosmos-rl keeps them for its every_n_sample_ema samples and validation; rollouts and training use the regular weights in both)', family='cosmos'),
    ignored('model.sde', None, "cosmos-rl's EDM noise levels (rollout start sigma_max, data-term sigma draws); here the flow model's own sigma grid (docs/from_cosmos_rl.md)", family='cosmos'),
    mapped('model.fsdp_shard_size', 8, '', to='policy.parallelism.dp_shard_size', family='cosmos'),
    ignored('model.dp_replicate_size', 1, 'not read by cosmos-rl (its replicas are world size / (fsdp_shard_size x context_parallel_size)); policy.parallelism.dp_replicate_size = -1 infers them the same way here', family='cosmos'),
    ignored('model.sigma_data', 1.0, "EDM parameterisation of cosmos-rl's network (the diffusers model predicts the flow velocity)", family='cosmos'),
    mapped('model.precision', 'bfloat16', '', to='policy.dtype', family='cosmos'),
    ignored('model.input_data_key', 'video', "batch key names of cosmos-rl's loaders", family='cosmos'),
    ignored('model.input_caption_key', 'ai_caption', "batch key names of cosmos-rl's loaders", family='cosmos'),
    ignored('model.input_image_key', 'images', "batch key names of cosmos-rl's loaders", family='cosmos'),
    refused('model.loss_reduce', 'mean', 'the losses are means here; remove the key', noop=('mean',), family='cosmos'),
    mapped('model.loss_scale', 10.0, '(the loss is multiplied by it before backward; it changes what the gradient-norm clip sees)', to='wfm.loss_scale', family='cosmos'),
    ignored('model.use_torch_compile', False, 'speed-only: torch.compile of the network', family='cosmos'),
    ignored('model.adjust_video_noise', True, "EDM training-noise scaling of cosmos-rl's network", family='cosmos'),
    ignored('model.state_ch', 16, "the latent shape comes from the model folder's VAE", family='cosmos'),
    ignored('model.state_t', 24, "the latent shape comes from the model folder's VAE", family='cosmos'),
    ignored('model.resolution', '480', "the clip size is dataloader_train's (video_size, or the mock data's resolution)", family='cosmos'),
    ignored('model.scaling', 'rectified_flow', 'the diffusers model is a rectified-flow model', family='cosmos'),
    ignored('model.rectified_flow_t_scaling_factor', 1.0, "parameterisation of cosmos-rl's network", family='cosmos'),
    ignored('model.rectified_flow_loss_weight_uniform', True, "parameterisation of cosmos-rl's network", family='cosmos'),
    ignored('model.resize_online', True, 'the clips are resized when read', family='cosmos'),
    ignored('model.min_num_conditional_frames', 1, 'the RL step takes the number of condition frames from model.rl', family='cosmos'),
    ignored('model.max_num_conditional_frames', 2, 'the RL step takes the number of condition frames from model.rl', family='cosmos'),
    ignored('model.sigma_conditional', 0.0001, 'the condition frames are clean here (cosmos-rl adds noise of this sigma to them)', family='cosmos'),
    refused('model.conditioning_strategy', 'frame_replace', 'the condition frames replace the first latent frames here; remove the key', noop=('frame_replace',), family='cosmos'),
    ignored('model.denoise_replace_gt_frames', True, 'the condition frames are replaced in every step here', family='cosmos'),
    ignored('model.high_sigma_strategy', 'LOGUNIFORM200_100000', "EDM sigma draws of cosmos-rl's pre-training loss", family='cosmos'),
    ignored('model.high_sigma_ratio', 0.05, "EDM sigma draws of cosmos-rl's pre-training loss", family='cosmos'),
    ignored('model.low_sigma_ratio', 0.05, "EDM sigma draws of cosmos-rl's pre-training loss", family='cosmos'),
    ignored('model.use_rf_ckpts', False, 'the diffusers checkpoint is a rectified-flow one', family='cosmos'),
    refused('model.rl.enabled', True, 'world-model SFT (model.rl.enabled = false) has no recipe here', noop=(True,), family='cosmos'),
    mapped('model.rl.update_ref_every_iter', 16, '(only acts with kl_beta > 0)', to='wfm.reference_update_interval', family='cosmos'),
    mapped('model.rl.num_rollout', 8, '(the group is spread over that many data-parallel ranks, one rollout each per prompt)', to='wfm.num_samples_per_prompt, wfm.group_ranks', family='cosmos'),
    mapped('model.rl.sample_steps', 10, '', to='wfm.num_inference_steps', family='cosmos'),
    mapped('model.rl.train_on', [0, 1, 2, 3, 4, 5, 6, 7], '(-1: a random step not listed)', to='wfm.train_steps', family='cosmos'),
    refused('model.rl.on_policy', True, 'rollouts come from the current policy here (on_policy = false rolls out with the reference); remove the key', noop=(True,), family='cosmos'),
    ignored('model.rl.solver_option', '2ab', "differs: cosmos-rl's EDM multistep solver with churn; here the Flow-GRPO SDE on the flow model's sigma grid ([wfm.sampler]; docs/from_cosmos_rl.md)", family='cosmos'),
    ignored('model.rl.s_churn', 1.0, "differs: the churn of cosmos-rl's solver; here [wfm.sampler] noise_level sets the SDE noise", family='cosmos'),
    ignored('model.rl.s_t_max', math.inf, "differs: the churn window of cosmos-rl's solver; here every step is stochastic (sde_window_size = 0)", family='cosmos'),
    ignored('model.rl.s_t_min', 0.0, "differs: the churn window of cosmos-rl's solver; here every step is stochastic (sde_window_size = 0)", family='cosmos'),
    ignored('model.rl.s_noise', 1.0, "differs: the churn noise scale of cosmos-rl's solver; here [wfm.sampler] noise_level", family='cosmos'),
    mapped('model.rl.guidance', 0.0, '(wfm.guidance_convention = "cosmos": cond + g (cond - uncond), 0 = none)', to='wfm.guidance_scale', family='cosmos'),
    mapped('model.rl.min_num_conditional_frames', 1, '(0 = text-to-world, 1 = image, more = video; a range is drawn per step)', to='wfm.min_num_conditional_frames, wfm.conditioning', family='cosmos'),
    mapped('model.rl.max_num_conditional_frames', 1, '', to='wfm.num_conditional_frames, wfm.conditioning', family='cosmos'),
    mapped('model.rl.clip_ratio', 0.0001, '', to='wfm.clip_range', family='cosmos'),
    mapped('model.rl.kl_beta', 0.01, "(the KL is the Gaussian's here, cosmos-rl takes the squared mean difference: docs/from_cosmos_rl.md)", to='wfm.kl_beta', family='cosmos'),
    mapped('model.rl.data_beta', 0.0, '("ddrl" when data_beta > 0, else "flow_grpo")', to='wfm.data_beta, wfm.algorithm', family='cosmos'),
    mapped('model.rl.use_rl_sigma_and_noise', True, '', to='wfm.ddrl_rollout_noise, wfm.ddrl_rollout_sigma', family='cosmos'),
    refused('model.rl.data_on_first_only', False, 'the DDRL data term is taken at every trained step here; remove the key', noop=(False,), family='cosmos'),
    mapped('model.rl.use_same_seed', True, '', to='wfm.shared_initial_noise', family='cosmos'),
    mapped('model.rl.exp_reward', False, '("neg_exp" when true)', to='wfm.advantage_transform', family='cosmos'),
    ignored('model.rl.reward_config.ALL_REWARD_MODELS', None, 'the list of reward kinds cosmos-rl knows', family='cosmos'),
    mapped('model.rl.reward_config.adv_clip_max', 5.0, '', to='wfm.adv_clip_max', family='cosmos'),
    refused('model.rl.reward_config.adv_clip_min', -5.0, 'advantages are clipped symmetrically here (+-adv_clip_max); make adv_clip_min = -adv_clip_max', noop=(-5.0,), family='cosmos'),
    refused('model.rl.reward_config.aesthetic.enabled', False, 'reward models run in the reward service here ([remote_reward])', noop=(False,), family='cosmos'),
    ignored('model.rl.reward_config.aesthetic.model_path', None, 'only acts with aesthetic.enabled', family='cosmos'),
    refused('model.rl.reward_config.image_reward.enabled', False, 'reward models run in the reward service here ([remote_reward])', noop=(False,), family='cosmos'),
    ignored('model.rl.reward_config.image_reward.model_path', 'ImageReward-v1.0', 'only acts with image_reward.enabled', family='cosmos'),
    refused('model.rl.reward_config.fake_reward.enabled', False, 'a constant reward trains nothing; use a reward of the service ([remote_reward])', noop=(False,), family='cosmos'),
    ignored('model.rl.reward_config.fake_reward.reward_fn', 'fake_reward', 'only acts with fake_reward.enabled', family='cosmos'),
    ignored('model.rl.reward_config.fake_reward.scale', 1.0, 'only acts with fake_reward.enabled', family='cosmos'),
    mapped('model.rl.reward_config.remote_reward.enabled', True, '(one reward, weight 1)', to='remote_reward.rewards', family='cosmos'),
    mapped('model.rl.reward_config.remote_reward.score_key', 'overall_reward', '', to='remote_reward.rewards.score_key', family='cosmos'),
    mapped('model.rl.reward_config.remote_reward.scale', 1.0, '', to='remote_reward.scale', family='cosmos'),
    mapped('model.rl.reward_config.remote_reward.reward_fn', 'dance_grpo', '', to='remote_reward.rewards.name', family='cosmos'),
    mapped('model.rl.reward_config.remote_reward.reward_clip_min', -5.0, '(low end; the score is clipped before the scale, as there)', to='remote_reward.rewards.clip', family='cosmos'),
    mapped('model.rl.reward_config.remote_reward.reward_clip_max', 5.0, '(high end)', to='remote_reward.rewards.clip', family='cosmos'),
    refused('model.rl.reward_config.remote_reward.token', '', 'tokens do not belong in config files: export WFM_REWARD_TOKEN (read by both)', noop=('',), family='cosmos'),
    mapped('model.rl.reward_config.remote_reward.enqueue_url', '', '(empty: WFM_REWARD_ENQUEUE_URL, as there)', to='remote_reward.enqueue_url', family='cosmos'),
    mapped('model.rl.reward_config.remote_reward.fetch_url', '', '(empty: WFM_REWARD_FETCH_URL, as there)', to='remote_reward.fetch_url', family='cosmos'),
    mapped('optimizer.optim_type', 'fusedadam', '("fusedadam" and "adamw" are both AdamW)', to='train.optm_name', family='cosmos'),
    mapped('optimizer.lr', 1e-05, '(x scheduler.f_max)', to='train.optm_lr', family='cosmos'),
    mapped('optimizer.weight_decay', 0.0001, '(cosmos-rl decays every weight; here not biases and norm scales)', to='train.optm_weight_decay', family='cosmos'),
    mapped('optimizer.betas', [0.9, 0.99], '', to='train.optm_betas', family='cosmos'),
    mapped('optimizer.eps', 1e-08, '', to='train.optm_eps', family='cosmos'),
    mapped('optimizer.master_weights', True, '("float32"; false: "bfloat16")', to='train.master_dtype', family='cosmos'),
    ignored('optimizer.capturable', True, 'speed-only: CUDA-graph capturable optimizer state', family='cosmos'),
    refused('scheduler.scheduler_type', 'lambda_linear', 'the schedule is linear warmup then constant or linear decay here; use lambda_linear', noop=('lambda_linear',), family='cosmos'),
    ignored('scheduler.verbosity_interval', 0, 'logging of the schedule', family='cosmos'),
    mapped('scheduler.warm_up_steps', [1000], '(one cycle; more are refused)', to='train.optm_warmup_steps', family='cosmos'),
    mapped('scheduler.cycle_lengths', [10000000000000], '("constant" when f_min = f_max; a decay to f_min is refused unless its cycle ends at trainer.max_iter)', to='train.optm_decay_type', family='cosmos'),
    ignored('scheduler.f_start', [1e-06], "differs: cosmos-rl's warmup starts at f_start x lr, here at 0 (1e-6 x lr is no step at all)", family='cosmos'),
    mapped('scheduler.f_max', [1.0], '(lr x f_max)', to='train.optm_lr', family='cosmos'),
    mapped('scheduler.f_min', [1.0], '(f_min / f_max)', to='train.optm_decay_type, train.optm_min_lr_factor', family='cosmos'),
    mapped('trainer.callbacks', None, '(grad_clip: clip_norm, none: 0, no clipping; every_n_sample_reg with guidance values: num_sampling_step and every_n, none: no evaluation rollouts; wandb: W&B; the others only log, time or collect garbage, listed as ignored)', to='train.optm_grad_norm_clip, wfm.eval_num_inference_steps, wfm.eval_freq, logging.logger', family='cosmos'),
    ignored('trainer.use_s3', False, "launcher-only: S3 output of cosmos-rl's callbacks", family='cosmos'),
    ignored('trainer.distributed_parallelism', 'fsdp', 'the weights are FSDP2-sharded over [policy.parallelism] here (DDP gives the same updates)', family='cosmos'),
    ignored('trainer.ddp', None, 'only acts with distributed_parallelism = "ddp"', family='cosmos'),
    ignored('trainer.cudnn', None, 'speed-only: cuDNN flags', family='cosmos'),
    mapped('trainer.seed', 0, '', to='train.seed', family='cosmos'),
    ignored('trainer.grad_scaler_args', None, 'bf16 training needs no gradient scaler', family='cosmos'),
    mapped('trainer.max_iter', 25, '(an iteration is one optimizer step)', to='train.max_steps', family='cosmos'),
    ignored('trainer.max_val_iter', None, 'only acts with run_validation', family='cosmos'),
    mapped('trainer.logging_iter', 2, '', to='logging.log_freq', family='cosmos'),
    refused('trainer.run_validation', False, 'the loss on dataloader_val is not computed here; evaluation rollouts score fixed prompts ([wfm] eval_freq)', noop=(False,), family='cosmos'),
    ignored('trainer.validation_iter', 100, 'only acts with run_validation', family='cosmos'),
    ignored('trainer.timeout_period', 999999999, 'launcher-only: hang detection', family='cosmos'),
    ignored('trainer.memory_format', 'preserve_format', 'speed-only: tensor memory layout', family='cosmos'),
    refused('trainer.grad_accum_iter', 1, 'one optimizer step per rollout batch here; raise dataloader batch_size instead', noop=(1,), family='cosmos'),
    ignored('trainer.straggler_detection', None, 'speed-only: straggler detection', family='cosmos'),
    ignored('trainer.profiling', None, 'speed-only: profiling (use torch.profiler around a step)', family='cosmos'),
    mapped('dataloader_train.type', 'web', '("local": "clip_folder"; "web" with dataset len_t5: "mock", cosmos-rl\'s random mock data; "web" otherwise is refused)', to='wfm.data.kind', family='cosmos'),
    ignored('dataloader_train.video_dataloader.type', 'video', "the local loader's kind", family='cosmos'),
    ignored('dataloader_train.video_dataloader.ratio', None, 'the video loader trains here (a ratio of 0 is refused)', noop=(1,), family='cosmos'),
    mapped('dataloader_train.video_dataloader.dataset_dir', None, '(videos/*.mp4, metas/*.txt)', to='wfm.data.path', family='cosmos'),
    mapped('dataloader_train.video_dataloader.num_frames', None, '', to='wfm.data.num_frames', family='cosmos'),
    mapped('dataloader_train.video_dataloader.video_size', None, "((height, width) as cosmos-rl's resize reads it, so [768, 432] trains 768-high, 432-wide clips there and here)", to='wfm.data.height, wfm.data.width', family='cosmos'),
    mapped('dataloader_train.video_dataloader.offline_text_embedding', False, '("none": every clip needs its precomputed embedding)', to='wfm.data.text_encoder', family='cosmos'),
    mapped('dataloader_train.video_dataloader.text_encoder_type', 't5_xxl', '("t5_xxl": t5_xxl/, cosmos-rl\'s folder of offline T5 embeddings)', to='wfm.data.embedding_dir', family='cosmos'),
    mapped('dataloader_train.video_dataloader.batch_size', None, "(prompts per data-parallel rank and step; also train.train_policy.mini_batch: a rank's rollouts go through one forward)", to='wfm.rollout_batch_size', family='cosmos'),
    mapped('dataloader_train.video_dataloader.dataloader.batch_size', None, '(prompts per data-parallel rank and step)', to='wfm.rollout_batch_size', family='cosmos'),
    mapped('dataloader_train.video_dataloader.dataloader.dataset.num_video_frames', None, '', to='wfm.data.num_frames', family='cosmos'),
    mapped('dataloader_train.video_dataloader.dataloader.dataset.resolution', None, '(cosmos-rl\'s mock video size of that resolution: "480" is 432 x 768)', to='wfm.data.height, wfm.data.width', family='cosmos'),
    mapped('dataloader_train.video_dataloader.dataloader.dataset.len_t5', None, '', to='wfm.data.max_tokens', family='cosmos'),
    mapped('dataloader_train.video_dataloader.dataloader.dataset.t5_dim', None, '', to='wfm.data.text_dim', family='cosmos'),
    ignored('dataloader_train.video_dataloader.dataloader.dataset', None, "cosmos-rl's web-dataset registry (caption and embedding kinds, decoders, augmentors)", family='cosmos'),
    ignored('dataloader_train.video_dataloader.dataloader', None, 'speed-only: loader workers, pinning, prefetching and replay caching', family='cosmos'),
    ignored('dataloader_train.video_dataloader', None, 'speed-only: loader workers, pinning, prefetching, shuffling (the sampler shuffles, seeded by [train] seed)', family='cosmos'),
    refused('dataloader_train.image_dataloader.ratio', None, 'image batches are not trained here (the world-model recipe trains video); set the image ratio to 0', noop=(0,), family='cosmos'),
    ignored('dataloader_train.image_dataloader', None, 'only acts with an image ratio > 0', family='cosmos'),
    ignored('dataloader_val', None, 'only read with trainer.run_validation', family='cosmos'),
    mapped('job.project', 'cosmos_wfm_v2', '($COSMOS_OUTPUT_DIR or ./outputs, then project/group/name, as there)', to='logging.project_name, train.output_dir', family='cosmos'),
    mapped('job.group', 'official_runs_vid2vid_debug', '(W&B groups are not set here)', to='train.output_dir', family='cosmos'),
    mapped('job.name', None, '', to='logging.experiment_name, train.output_dir', family='cosmos'),
    mapped('job.wandb_mode', 'online', '("disabled" drops wandb; "offline": set WANDB_MODE=offline)', to='logging.logger', family='cosmos'),
    mapped('job.timestamp', None, '(a run folder to go on in: resume the newest run under output_dir)', to='train.resume', family='cosmos'),
    mapped('model_parallel.context_parallel_size', 1, '', to='policy.parallelism.cp_size', family='cosmos'),
    refused('model_parallel.tensor_model_parallel_size', 1, 'the world-model recipe has no tensor parallelism; use context_parallel_size / fsdp_shard_size', noop=(1,), family='cosmos'),
    refused('model_parallel.pipeline_model_parallel_size', 1, 'pipeline parallelism is not implemented; remove the key', noop=(1,), family='cosmos'),
    ignored('model_parallel', None, "Megatron settings that cosmos-rl's world-model trainer does not read (it reads the tensor / pipeline / context sizes)", family='cosmos'),
    ignored('checkpoint.type', None, 'checkpoints are DCP (sharded) here either way', family='cosmos'),
    mapped('checkpoint.load_path', '', '(a Hub repo or folder in diffusers layout here, transformer/ vae/ scheduler/; empty, a network of [model.net] with random weights, is refused unless policy.model_name_or_path is given)', to='policy.model_name_or_path', family='cosmos'),
    refused('checkpoint.model_id', None, "an imaginaire .pt checkpoint is not read here: give policy.model_name_or_path a diffusers folder of the same weights (diffusers' scripts/convert_cosmos_to_diffusers.py converts the .pt) and, for a Hub repo, policy.model_revision", family='cosmos'),
    mapped('checkpoint.save_iter', 1000, '(true and -1: cosmos-rl always saves and keeps every checkpoint)', to='train.ckpt.save_freq, train.ckpt.enable_checkpoint, train.ckpt.max_keep', family='cosmos'),
    mapped('checkpoint.dcp_async_mode_enabled', False, '("async" when true, else "sync")', to='train.ckpt.save_mode', family='cosmos'),
    refused('checkpoint.save_to_object_store.enabled', False, 'set train.ckpt.upload_s3 and s3_bucket (the AWS_* variables) instead', noop=(False,), family='cosmos'),
    refused('checkpoint.load_from_object_store.enabled', False, 'download the weights and point policy.model_name_or_path at them', noop=(False,), family='cosmos'),
    ignored('checkpoint.save_to_object_store', None, 'only acts with save_to_object_store.enabled', family='cosmos'),
    ignored('checkpoint.load_from_object_store', None, 'only acts with load_from_object_store.enabled', family='cosmos'),
    ignored('checkpoint', None, "resume details of cosmos-rl's checkpointer (what to restore, strictness, JIT export, logging)", family='cosmos'),
)
# The keys of a diffusers file that are world-model specific; its other keys follow the "llm" rules.
_DIFFUSERS_WFM: tuple[Rule, ...] = (
    ignored('mode', 'disaggregated', 'launcher-only: one process group rolls out and trains here', family='diffusers'),
    ignored('policy.is_diffusers', False, 'the file is read as a world-model file', noop=(True,), family='diffusers'),
    mapped('policy.model_revision', None, '(the Hub branch of the diffusers weights)', family='diffusers'),
    ignored('policy.diffusers.dtype', 'float32', 'the weights load in float32 and compute in [policy] dtype (train.param_dtype there)', family='diffusers'),
    refused('policy.diffusers.is_video', False, 'image diffusion models have no recipe here', noop=(True,), family='diffusers'),
    mapped('policy.diffusers.max_prompt_length', 300, '', to='wfm.data.max_tokens', family='diffusers'),
    ignored('policy.diffusers.weighting_scheme', 'logit_normal', "read by cosmos-rl's diffusion SFT trainer only", family='diffusers'),
    ignored('policy.diffusers.train_flow_shift', 3.0, "read by cosmos-rl's diffusion SFT trainer only", family='diffusers'),
    ignored('policy.diffusers.offload', True, 'speed-only: host offload of model parts', family='diffusers'),
    ignored('policy.diffusers.logit_mean', 0.0, "read by cosmos-rl's diffusion SFT trainer only", family='diffusers'),
    ignored('policy.diffusers.logit_std', 1.0, "read by cosmos-rl's diffusion SFT trainer only", family='diffusers'),
    mapped('policy.diffusers.inference_size', [1024, 1024], '([height, width])', to='wfm.data.height, wfm.data.width', family='diffusers'),
    ignored('policy.diffusers.inference_frames', 41, 'not read by the DiffusionNFT rollout (train_frames is)', family='diffusers'),
    mapped('policy.diffusers.train_frames', 41, '', to='wfm.data.num_frames', family='diffusers'),
    mapped('policy.diffusers.timesteps_fraction', 1.0, '(int(sample.num_steps x timesteps_fraction) points per sample, "sampler": the sampler\'s timesteps in a random order per sample, as there)', to='wfm.nft_num_timesteps, wfm.nft_timesteps', family='diffusers'),
    ignored('policy.diffusers.timestep_fraction', None, 'not a cosmos-rl key (it spells timesteps_fraction): cosmos-rl ignores it and trains with timesteps_fraction = 1.0; so does this library', family='diffusers'),
    mapped('policy.diffusers.nft_beta', 1.0, '', to='wfm.nft_beta', family='diffusers'),
    ignored('policy.diffusers.weight_copy_decay_type', 0, 'differs: cosmos-rl rolls out with an "old" adapter copied from the trained one with this decay schedule; here the rollout and v_old are the policy at the start of the step (the same as decay type 0)', family='diffusers'),
    refused('policy.diffusers.lora', None, 'set [policy.lora] (cosmos-rl reads that one for the transformer)', family='diffusers'),
    mapped('policy.diffusers.sample.num_steps', 40, '', to='wfm.num_inference_steps', family='diffusers'),
    mapped('policy.diffusers.sample.eval_num_steps', 40, '(with validation.enable; else 0, no evaluation rollouts)', to='wfm.eval_num_inference_steps', family='diffusers'),
    mapped('policy.diffusers.sample.guidance_scale', 4.5, '(DiffusionNFT here is guidance-free: a value above 1 is refused)', to='wfm.guidance_scale', noop=(1.0,), family='diffusers'),
    ignored('policy.diffusers.sample.global_std', True, "not read by cosmos-rl (its remote-reward advantages use the prompt group's std)", family='diffusers'),
    ignored('policy.diffusers.sample.noise_level', 1.0, 'only acts with stochastic sampling (DiffusionNFT rolls out with deterministic steps)', family='diffusers'),
    refused('policy.diffusers.sample.deterministic_sampling', False, 'DiffusionNFT rolls out with deterministic (ODE) steps here; set it true', noop=(True,), family='diffusers'),
    ignored('policy.diffusers.sample.solver', 'dpm2', "differs: cosmos-rl's DPM-Solver-2 steps; here Euler steps on the same sigma grid", family='diffusers'),
    ignored('policy.diffusers.tokenizer', None, "the VAE is the model folder's vae/", family='diffusers'),
    ignored('policy.lora.lora_names', ['default'], 'one adapter is trained here; DiffusionNFT\'s "old" adapter is the policy at the start of the step', noop=(['default'], ['default', 'old']), family='diffusers'),
    ignored('rollout.backend', 'vllm', 'the world-model recipe samples with its own flow sampler', family='diffusers'),
    mapped('rollout.n_generation', 16, '', to='wfm.num_samples_per_prompt', family='diffusers'),
    ignored('rollout.parallelism', None, 'the same ranks roll out and train here', family='diffusers'),
    ignored('rollout.batch_size', 1, 'speed-only: prompts per rollout call', family='diffusers'),
    ignored('rollout.n_generation_mini_batch', None, 'speed-only: rollout micro-batching', family='diffusers'),
    mapped('train.train_policy.trainer_type', 'sft', '("diffusion_nft"; another diffusers trainer is refused)', to='wfm.algorithm', family='diffusers'),
    refused('train.train_policy.type', None, 'diffusion SFT has no recipe here', noop=('grpo',), family='diffusers'),
    mapped('train.train_policy.kl_beta', 0.0, '(the velocity KL to the base model)', to='wfm.kl_beta', family='diffusers'),
    mapped('train.train_policy.mini_batch', 2, '(samples per forward / backward)', family='diffusers'),
    mapped('train.train_policy.batch_size_per_optimize', None, '(rollouts per rank / it)', to='wfm.num_minibatches', family='diffusers'),
    refused('train.train_policy.advantage_low', -5.0, 'advantages are clipped symmetrically here (+-adv_clip_max); make advantage_low = -advantage_high', noop=(-5.0,), family='diffusers'),
    mapped('train.train_policy.advantage_high', 5.0, '', to='wfm.adv_clip_max', family='diffusers'),
    refused('train.train_policy.mu_iterations', 1, 'one pass over each rollout batch here; remove the key', noop=(1,), family='diffusers'),
    mapped('train.train_policy.use_remote_reward', False, '(the reward service; without it a world model has no reward here)', to='remote_reward.rewards', family='diffusers'),
    mapped('train.train_policy.remote_reward.scale', 1.0, '', to='remote_reward.scale', family='diffusers'),
    mapped('train.train_policy.remote_reward.reward_fns', None, '(name, weight, score_key, clip = [clip_min, clip_max])', to='remote_reward.rewards', family='diffusers'),
    ignored('train.train_policy.remote_reward.reward_clip_min', -5.0, 'the per-reward clips apply here (clip_min / clip_max of each reward_fns entry)', family='diffusers'),
    ignored('train.train_policy.remote_reward.reward_clip_max', 5.0, 'the per-reward clips apply here (clip_min / clip_max of each reward_fns entry)', family='diffusers'),
    ignored('train.train_policy.remote_reward.batch_size', 1, 'speed-only: reward requests are batched per step here', family='diffusers'),
    mapped('train.train_policy.dataset.name', '', '(cosmos-rl\'s prompt-list datasets such as "pickscore" are not read here: give wfm.data.path a clip folder, whose captions are the prompts)', to='wfm.data.path', family='diffusers'),
    ignored('train.train_policy.dataset.split', '', 'the clip folder is the training set', family='diffusers'),
    ignored('train.train_policy.uncentralized_training', False, 'launcher-only: controller layout', family='diffusers'),
    mapped('train.train_batch_per_replica', 8, '(rollouts per replica / data-parallel ranks / n_generation)', to='wfm.rollout_batch_size', family='diffusers'),
    ignored('train.ema_enable', False, 'differs: EMA weights are not kept here (cosmos-rl evaluates and exports the EMA weights with it; here the trained ones)', family='diffusers'),
    ignored('train.ema_decay', 0.9999, 'only acts with ema_enable', family='diffusers'),
    ignored('train.ema_update_step_interval', 0, 'only acts with ema_enable', family='diffusers'),
    ignored('train.non_text', False, 'launcher-only: non-text trainers', family='diffusers'),
    ignored('train.compile', True, 'speed-only: the world-model recipe does not compile the transformer', family='diffusers'),
    ignored('logging.multi_modal_log_interval', None, 'the evaluation rollouts write videos here ([wfm] eval_freq)', family='diffusers'),
    mapped('validation.enable', False, '(0 without validation: no evaluation rollouts)', to='wfm.eval_num_inference_steps', family='diffusers'),
    mapped('validation.freq', 20, '', to='wfm.eval_freq', family='diffusers'),
    ignored('validation.dataset', None, 'evaluation prompts are fixed items of the training data here', family='diffusers'),
)



RULE_LIST: tuple[Rule, ...] = (
    ignored('redis', '', "launcher-only: the cosmos-rl controller's Redis port; the trainer and rollout jobs take --redis (examples/run_jobs_local.sh starts a private one)"),
    ignored('eth_ips', '', 'launcher-only: controller addresses; torchrun places the ranks'),
    ignored('mode', 'disaggregated', 'launcher-only: pick the recipe instead (examples/grpo_vlm.py shares GPUs; examples/run_jobs_local.sh starts the trainer and rollout jobs on GPUs of their own)'),
    ignored('controller_execution_id', None, "launcher-only: the controller's attempt fence"),
    mapped('custom', None, '(free-form table for your own code)'),
    mapped('train.train_policy.type', None),
    refused('train.train_policy.trainer_type', 'sft', 'a custom trainer class does not load here: give the recipe a dataset / reward plug-in, or write a loop from library calls', noop=('sft', 'grpo')),
    mapped('train.train_policy.dataset.name', ''),
    mapped('train.train_policy.dataset.subset', ''),
    mapped('train.train_policy.dataset.revision', ''),
    mapped('train.train_policy.dataset.split', '', '(a list of splits is read as "a+b", the concatenation)'),
    mapped('train.train_policy.dataset.test_size', None, '(with validation.enable and no validation.dataset.name, SFT and colocated GRPO (examples/grpo_vlm.py) validate on the items (int) or fraction (float, rounded up) held out of training, unset 0.1 as in cosmos-rl; drawn at random seeded by train.seed, where cosmos-rl takes the first / last rows; 0 holds nothing out, so validation then needs validation.dataset.name, as in cosmos-rl)'),
    refused('train.train_policy.dataset.local_dir', '', 'set train.train_policy.dataset.name to the local folder or file', noop=('',)),
    mapped('train.train_policy.mini_batch', 2, '(sequences per forward / backward; ours defaults to 1)', fill=True),
    mapped('train.train_policy.dataloader_shuffle', True, "(false: the dataset's own order, each rank taking every dp-th item)"),
    mapped('train.train_policy.dataloader_seed', 0, "(the data order's seed: a permutation per epoch seeded seed + epoch, as torch's DistributedSampler; ours unset: train.seed)", fill=True),
    ignored('train.train_policy.dataloader_batch_size', 1, 'speed-only: loader batching'),
    ignored('train.train_policy.enable_dataset_cache', False, 'speed-only: dataset caching'),
    ignored('train.train_policy.dataloader_num_workers', 0, 'speed-only: loader worker processes'),
    ignored('train.train_policy.dataloader_prefetch_factor', None, 'speed-only: loader prefetch'),
    ignored('train.train_policy.dataloader_drop_last', True, 'speed-only: the SFT loader always forms full steps'),
    ignored('train.train_policy.data_dispatch_as_rank_in_mesh', False, 'launcher-only: data dispatch between replicas'),
    mapped('train.train_policy.conversation_column_name', 'conversations'),
    mapped('train.train_policy.system_prompt', '', to='train.train_policy.dataset.system_prompt', fill=True),
    ignored('train.train_policy.balance_dp_token', True, 'speed-only: token balancing between data-parallel ranks'),
    ignored('train.train_policy.enable_dp_load_balancing', False, 'speed-only: load balancing'),
    ignored('train.train_policy.load_balanced_pool_size', 32, 'speed-only: load balancing'),
    ignored('train.train_policy.load_balanced_max_tokens_for_batch', None, 'speed-only: load balancing'),
    ignored('train.train_policy.load_balanced_batching_strategy', 'prefer_closest', 'speed-only: load balancing'),
    ignored('train.train_policy.load_balanced_batches_per_optimizer_step', 1, 'speed-only: load balancing'),
    ignored('train.train_policy.dataloader_broadcast', False, 'speed-only: loader broadcast'),
    mapped('train.train_policy.variant', 'grpo', to='grpo.variant'),
    mapped('train.train_policy.prompt_column_name', '', "(the prompt column: a string (plain text used as it is, as cosmos-rl's text models take it) or a conversation per row, cp.data.ColumnPromptDataset; a dataset plug-in reads it itself)"),
    mapped('train.train_policy.response_column_name', '', '(the reference answer the rewards get; read as prompt_column_name)'),
    mapped('train.train_policy.reward_function', ['single_choice'], '(a name or list: weight 1 each; ours defaults to single_choice + format)', to='grpo.reward_function', transform=reward_function_as_dict, fill=True),
    refused('train.train_policy.use_remote_reward', False, 'use [remote_reward] (the reward service client)', noop=(False,)),
    refused('train.train_policy.remote_reward', None, 'use [remote_reward] (the reward service client)'),
    refused('train.train_policy.filter_reward_metric', [], 'filter rewards in your reward function', noop=([],)),
    refused('train.train_policy.bypass_reward', False, 'drop the reward functions from grpo.reward_function instead', noop=(False,)),
    refused('train.train_policy.group_reward_calculation', False, 'register a group reward (cp.rewards) instead', noop=(False,)),
    mapped('train.train_policy.temperature', 1.0, "(the trainer scores logits / temperature; ours unset: the rollout's sampling temperature; a cosmos-rl file gets 1.0)", to='grpo.temperature', fill=True),
    mapped('train.train_policy.epsilon_low', 0.2, '(negative: no clip at 1 - epsilon_low, as cosmos-rl reads it)', to='grpo.epsilon_low'),
    mapped('train.train_policy.epsilon_high', 0.2, '(negative: no clip at 1 + epsilon_high, as cosmos-rl reads it)', to='grpo.epsilon_high'),
    refused('train.train_policy.advantage_low', -5.0, 'advantages are not clipped here; remove the key', noop=(-5.0,)),
    refused('train.train_policy.advantage_high', 5.0, 'advantages are not clipped here; remove the key', noop=(5.0,)),
    mapped('train.train_policy.positive_nll_coef', None, to='grpo.positive_nll_coef'),
    mapped('train.train_policy.lower_bound_ratio', 3.0, to='grpo.dual_clip_c'),
    mapped('train.train_policy.loss_type', 'token-mean', to='grpo.loss_type'),
    mapped('train.train_policy.unbiased_loss_max_tokens', None, to='grpo.unbiased_loss_max_tokens'),
    mapped('train.train_policy.unbiased_advantage', False, '("drgrpo" when true)', to='grpo.advantage_estimator', transform=_bool_as("drgrpo", "grpo")),
    refused('train.train_policy.algo', 'grpo', 'choose the policy loss with grpo.policy_loss / grpo.variant', noop=('grpo',)),
    mapped('train.train_policy.overlong_reward.enable_overlong_penalty', False, to='grpo.overlong_reward.enable_overlong_penalty'),
    mapped('train.train_policy.overlong_reward.buffer_length', 4096, to='grpo.overlong_reward.buffer_length'),
    mapped('train.train_policy.overlong_reward.penalty_factor', 1.0, to='grpo.overlong_reward.penalty_factor'),
    mapped('train.train_policy.kl_beta', 0.0, to='grpo.kl_beta'),
    refused('train.train_policy.unbiased_kl_estimate', False, 'set grpo.kl_estimator', noop=(False,)),
    mapped('train.train_policy.off_policy_masking_delta', None, to='grpo.off_policy_masking_delta'),
    mapped('train.train_policy.aipo_rho', None, to='grpo.aipo_rho'),
    mapped('train.train_policy.mu_iterations', 1, to='grpo.mu_iterations'),
    refused('train.train_policy.batch_size_per_optimize', None, 'one optimizer step per GRPO step here: set train.train_batch_per_replica'),
    mapped('train.train_policy.max_token_len_per_mini_batch', None, "(GRPO: micro-batches of rows of similar length, rows x longest row <= this budget per CP rank, the same loss; cosmos-rl counts unpadded tokens, ours the padded forward's)"),
    mapped('train.train_policy.entropy_coeff', 0.0, to='grpo.entropy_coeff'),
    mapped('train.train_policy.allowed_outdated_steps', 4, '(0 with on_policy; raised to train.sync_weight_interval - 1 when below it, as cosmos-rl)', to='grpo.allowed_outdated_steps'),
    mapped('train.train_policy.on_policy', False, '(true forces allowed_outdated_steps = 0, as cosmos-rl)', to='grpo.on_policy'),
    ignored('train.train_policy.uncentralized_training', False, 'launcher-only: controller layout'),
    ignored('train.train_policy.outdated_rollout_fetch_batch_size', 0, 'speed-only: queue fetch size'),
    ignored('train.train_policy.max_inflight_steps', None, 'launcher-only: controller scheduling'),
    mapped('train.train_policy.min_filter_prefix_tokens', None, '(cp.algo.prefix_filter; unset with distillation.enable, where cosmos-rl bypasses the rewards, all 0, so its filter takes nothing out)', to='grpo.min_filter_prefix_tokens'),
    ignored('train.train_policy.max_retry_for_on_policy', -1, 'launcher-only: controller retries'),
    refused('train.train_policy.reference_reset_interval', None, 'the KL reference is fixed here; remove the key'),
    ignored('train.train_policy.reset_optimizer_with_reference', True, 'only acts with reference_reset_interval'),
    refused('train.train_policy.use_decoupled_loss', False, 'set grpo.behav_imp_weight_cap (the decoupled loss)', noop=(False,)),
    mapped('train.train_policy.behav_imp_weight_cap', None, '(= grpo.rollout_correction "mis" with rollout_is_lower 0, rollout_is_cap the cap: weights exp(old - rollout), 0 above the cap)', to='grpo.behav_imp_weight_cap'),
    ignored('train.train_policy.rollout_as_token_ids', False, 'speed-only: records carry token ids here anyway'),
    ignored('train.train_policy.collect_rollout_logprobs', False, "records always carry the engine's log-probs here"),
    mapped('train.train_policy.use_rollout_logprobs_for_loss', False, '("rollout" when true, else "recompute"; ours defaults to "rollout")', to='grpo.old_logprobs', transform=_bool_as("rollout", "recompute"), fill=True),
    ignored('train.train_policy.dpo_reference_policy', False, 'only acts with trainer_type = "dpo" (refused)'),
    mapped('train.optm_name', 'AdamW', '("Adam": torch.optim.Adam, weight decay added to the gradient as L2, as cosmos-rl; "AdamW": decoupled)'),
    mapped('train.optm_lr', 1e-06, '(ours defaults to 1e-5)', fill=True),
    mapped('train.optm_impl', 'fused', '(AdamW kernels: "fused" where torch has them for the parameters\' device, else "foreach"; one value, not a list per model part)'),
    mapped('train.optm_weight_decay', 0.01),
    mapped('train.optm_betas', [0.9, 0.999]),
    mapped('train.optm_warmup_steps', 20, "(a float <= 1 is a fraction of the total steps; clamped to the total steps; lr = peak x step / (W - 1) from 0, cosmos-rl's schedule, ours too; ours defaults to 0)", fill=True),
    refused('train.optm_warmup_start_factor', 0.0, 'warmup starts at 0 here; remove the key', noop=(0.0,)),
    refused('train.optm_decay_ratio', None, 'decay runs over all steps after warmup here; remove the key (0.0, no decay steps, is read as train.optm_decay_type = "constant", as cosmos-rl holds the peak after warmup then)'),
    mapped('train.optm_decay_type', None, '("cosine", "linear", "sqrt"; unset or "none": "constant", ours\' default)'),
    mapped('train.optm_min_lr_factor', 0.0),
    mapped('train.optm_grad_norm_clip', 1.0),
    refused('train.ema_enable', False, 'EMA weights are not kept here; remove the key', noop=(False,)),
    ignored('train.ema_decay', 0.9999, 'only acts with ema_enable'),
    ignored('train.ema_update_step_interval', 0, 'only acts with ema_enable'),
    mapped('train.master_dtype', 'float32', '("bfloat16": bf16 master weights, float32 AdamW math with stochastic rounding)'),
    mapped('train.param_dtype', 'bfloat16', to='policy.dtype'),
    mapped('train.transfer_dtype', None, '(unset in a cosmos-rl file: train.master_dtype, as cosmos-rl)', to='disaggregated.transfer_dtype'),
    refused('train.logprob_dtype', 'float32', 'log-probs are computed in float32 here; remove the key', noop=('float32',)),
    ignored('train.fsdp_reduce_dtype', 'float32', 'speed-only: gradient reduce dtype'),
    mapped('train.fsdp_offload', False, '(FSDP2 CPUOffloadPolicy: parameters, gradients and optimizer state in host memory)'),
    mapped('train.fsdp_reshard_after_forward', 'default', '("default": as cosmos-rl\'s (every block but the last reshards) with a shard group of 2+ ranks or fsdp_offload; with one shard rank nothing reshards (cheaper, same results); the root unit stays gathered through the backward)'),
    mapped('train.train_batch_per_replica', 8, "(per data-parallel rank and optimizer step, SFT's meaning in cosmos-rl too (n_init_replicas > 1: shared by the replica's ranks, as its multi-replica worker); GRPO: a replica's rollouts per step shared by its dp ranks, b = it / dp per rank, each generation lcm(b, n_generation) / n_generation prompts (grpo.rollout_batch_size) trained in steps of b rollouts (grpo.rollouts_per_step))"),
    refused('train.fp8.enable_fp8', False, 'FP8 training is not supported; remove [train.fp8]', noop=(False,)),
    ignored('train.fp8.fp8_recipe', 'dynamic_scaling', 'only acts with enable_fp8'),
    ignored('train.fp8.quant_recipe', 'rowwise', 'only acts with enable_fp8'),
    refused('train.fp4.enable_fp4', False, 'FP4 training is not supported; remove [train.fp4]', noop=(False,)),
    ignored('train.fp4.fp4_recipe', 'dynamic_scaling', 'only acts with enable_fp4'),
    ignored('train.fp4.quant_recipe', 'rowwise', 'only acts with enable_fp4'),
    mapped('train.ckpt.enable_checkpoint', False),
    mapped('train.ckpt.save_freq', 20, '(ours defaults to 100)', fill=True),
    refused('train.ckpt.save_freq_in_epoch', 0, 'save by steps (train.ckpt.save_freq)', noop=(0,)),
    mapped('train.ckpt.save_mode', 'async'),
    mapped('train.ckpt.max_keep', 5, '(ours defaults to 2)', fill=True),
    mapped('train.ckpt.export_safetensors', True),
    mapped('train.ckpt.upload_hf', False),
    mapped('train.ckpt.hf_repo_name', 'Comos-Reason1', '(ours defaults to "")'),
    mapped('train.ckpt.upload_s3', False),
    mapped('train.ckpt.s3_bucket', None),
    mapped('train.ckpt.s3_prefix', 'outputs'),
    mapped('train.resume', False),
    mapped('train.epoch', 1),
    mapped('train.output_dir', './outputs'),
    ignored('train.timestamp', '', 'launcher-only: the run folder is named at start'),
    mapped('train.epsilon', 1e-06, '(ours defaults to 1e-8)', to='train.optm_eps', fill=True),
    ignored('train.async_tp_enabled', False, 'speed-only: async tensor parallelism'),
    mapped('train.compile', True, '(torch.compile of every decoder layer, fullgraph; applied on CUDA only; ours defaults to false)', fill=True),
    mapped('train.sync_weight_interval', 1),
    ignored('train.prefetch_payloads', False, 'speed-only: payload lookahead'),
    ignored('train.p2p_sync_pack_tensors', False, 'speed-only: weight-sync packing'),
    ignored('train.p2r_sync_groups_per_round', 0, 'speed-only: weight-sync grouping'),
    ignored('train.coalesce_weight_sync', False, 'speed-only: weight-sync batching'),
    ignored('train.deterministic', False, 'speed-only: deterministic kernels'),
    ignored('train.activation_offload', False, 'speed-only: activation offload'),
    ignored('train.fa_version', None, 'speed-only: flash-attention version'),
    mapped('train.seed', None, '(unset: a seed drawn at start-up, the same on every rank, logged; ours defaults to 42)', fill=True),
    ignored('train.local_dataset', True, 'launcher-only: dataset download placement'),
    ignored('train.force_use_hf', False, 'speed-only: model implementation (always transformers here)'),
    ignored('train.non_text', False, 'launcher-only: non-text trainers'),
    mapped('train.max_num_steps', None, to='train.max_steps'),
    mapped('train.sequence_packing', False, '(ours defaults to true)', to='train.train_policy.sequence_packing', fill=True),
    mapped('train.save_ckpt_at_exit', True, '(a signal of signal_to_handle saves a checkpoint at the next step boundary, then the run stops with exit status 75; cp.checkpoint.Preemption)'),
    mapped('train.signal_to_handle', ['SIGUSR1'], '(ours defaults to ["SIGUSR1", "SIGTERM"] for every file: without cosmos-rl\'s launcher, SIGTERM is what a scheduler sends the training process itself)'),
    ignored('train.enable_validation', False, "an older cosmos-rl spelling, gone from its config class since 2025-09: cosmos-rl ignores it (no validation ran), so it is ignored here too; set validation.enable to validate (config.train.enable_validation reads validation.enable, as Cosmos-Reason1's dataset scripts expect)"),
    ignored('train.validation_step', 20, 'an older cosmos-rl spelling, gone from its config class: cosmos-rl ignores it; set validation.freq'),
    ignored('train.validation_batch_per_replica', None, 'an older cosmos-rl spelling of validation batching (speed-only), gone from its config class'),
    mapped('rollout.enforce_eager', True),
    mapped('rollout.include_stop_str_in_output', False),
    mapped('rollout.gpu_memory_utilization', 0.8, '(ours defaults to 0.7)', fill=True),
    ignored('rollout.enable_chunked_prefill', False, 'speed-only: vLLM scheduling'),
    mapped('rollout.max_response_length', 2048, '(ours defaults to 1024)', fill=True),
    mapped('rollout.n_generation', 16, '(ours defaults to 8)', to='grpo.num_samples_per_prompt', fill=True),
    ignored('rollout.n_generation_to_batch', False, 'speed-only: generation batching'),
    ignored('rollout.n_generation_mini_batch', None, 'speed-only: generation batching'),
    mapped('rollout.batch_size', 1, "(prompts per generate call there, sequences here: a cosmos-rl file's value is multiplied by n_generation)", fill=True),
    refused('rollout.quantization', 'none', 'quantized rollout is not supported; remove the key', noop=('none',)),
    mapped('rollout.seed', None),
    mapped('rollout.sampling_config.temperature', 1.0),
    mapped('rollout.sampling_config.top_p', 1.0),
    mapped('rollout.sampling_config.top_k', -1),
    mapped('rollout.sampling_config.repetition_penalty', 1.0),
    ignored('rollout.sampling_config.use_flashinfer', False, 'speed-only: sampling kernel'),
    ignored('rollout.vllm_use_flashinfer', False, 'speed-only: sampling kernel'),
    mapped('rollout.backend', 'vllm', '("vllm" or "hf"; other engines are refused; unset in any file: "auto", resolved where the engine is built: vLLM when it is installed and a GPU is present, else hf, logged)'),
    mapped('rollout.multi_turn_config.enable', False, '(the colocated recipe runs each prompt as an episode of model turns and environment replies, cp.rollout.multi_turn.run_episodes; the reward functions score the last model turn, as cosmos-rl, and the environment\'s turn rewards are added)'),
    mapped('rollout.multi_turn_config.enable_tools', False, "(true: the environment's replies enter the chat as tool-response turns, QWEN_TOOL_REPLY; false: as plain text. cosmos-rl's tools come from the data packer its launcher script builds; here rollout.multi_turn_config.environment names the environment, module:function; unset: none, so an episode ends after its first turn, as cosmos-rl's default packer ends it)"),
    ignored('rollout.multi_turn_config.enable_thinking', False, "the prompt is rendered by the dataset (the model's chat template) as in a one-turn run; a Qwen3 thinking switch belongs in a dataset plug-in"),
    ignored('rollout.multi_turn_config.custom_chat_template_path', None, "the model's own chat template renders the prompt (cosmos-rl too falls back to it when the file is missing); later turns are token ids, never re-rendered"),
    mapped('rollout.multi_turn_config.max_assistant_turns', 5),
    ignored('rollout.multi_turn_config.add_generation_prompt', True, 'the prompt always ends with the assistant header here'),
    ignored('rollout.multi_turn_config.continue_final_message', False, 'each model turn starts after the last reply here'),
    ignored('rollout.mode', 'sync', 'launcher-only: rollout worker mode'),
    ignored('rollout.async_config.max_concurrent_requests', 10, 'launcher-only: rollout worker mode'),
    ignored('rollout.async_r2r_sync', 'disabled', 'launcher-only: rollout-to-rollout weight sync'),
    ignored('rollout.prefetch_rollout', False, 'speed-only: prefetching'),
    ignored('rollout.prefetch_queue_maxsize', 2, 'speed-only: prefetching'),
    ignored('rollout.broadcast_all_params', False, 'speed-only: weight sync'),
    ignored('rollout.completion_admission', False, "launcher-only: the controller's completion reporting"),
    ignored('rollout.r2r_sync_pack_tensors', False, 'speed-only: rollout-to-rollout weight sync'),
    ignored('rollout.r2r_sync_bucket_size_bytes', 536870912, 'speed-only: rollout-to-rollout weight sync'),
    refused('policy.diffusers', None, 'diffusion models: use examples/wfm_rl.py and its [wfm] section'),
    refused('policy.is_diffusers', False, 'diffusion models: use examples/wfm_rl.py and its [wfm] section', noop=(False,)),
    mapped('policy.model_name_or_path', 'Qwen/Qwen2.5-VL-7B-Instruct', '(ours has no default)', fill=True),
    refused('policy.model_safetensor_path', None, 'point policy.model_name_or_path at the folder holding the weights'),
    mapped('policy.model_revision', None),
    mapped('policy.model_max_length', 4096),
    mapped('policy.model_gradient_checkpointing', True, '(ours defaults to false)', fill=True),
    mapped('policy.lora.r', 8, '(ours defaults to 32)', fill=True),
    refused('policy.lora.lora_names', ['default'], 'one adapter is trained here; remove the key', noop=(['default'],)),
    refused('policy.lora.lora_path', None, 'load the adapter into the model folder first'),
    mapped('policy.lora.lora_alpha', 8.0, '(ours defaults to 64)', fill=True),
    mapped('policy.lora.lora_dropout', 0.0),
    mapped('policy.lora.target_modules', None, '(ours defaults to the attention projections)'),
    refused('policy.lora.primary_adapter', None, 'one adapter is trained here; remove the key'),
    refused('policy.lora.use_rslora', False, 'rank-stabilised LoRA is not supported; scale lora_alpha instead', noop=(False,)),
    refused('policy.lora.modules_to_save', None, 'unfreeze those modules with policy.trainable_patterns instead'),
    refused('policy.lora.alpha_pattern', None, 'per-module alpha is not supported; remove the key'),
    refused('policy.lora.r_pattern', None, 'per-module rank is not supported; remove the key'),
    mapped('policy.lora.init_lora_weights', True),
    refused('policy.trainable_map', None, 'use policy.trainable_patterns / policy.freeze_patterns (regexes)'),
    mapped('policy.freeze_pattern', None, to='policy.freeze_patterns', transform=_as_list),
    mapped('policy.trainable_pattern', None, to='policy.trainable_patterns', transform=_as_list),
    ignored('policy.enable_liger_kernel', False, 'speed-only: fused kernels'),
    ignored('policy.enable_liger_cross_entropy', False, 'speed-only: fused kernels'),
    ignored('policy.enable_liger_fused_cross_entropy', False, 'speed-only: fused kernels'),
    refused('policy.aux_loss_coeff', 0.0, 'mixture-of-experts auxiliary loss is not supported; remove the key', noop=(0.0,)),
    mapped('logging.logger', [], '(ours defaults to ["console"]; JSONL metrics are written either way)', fill=True),
    ignored('logging.log_interval', 100, 'speed-only: console lines are written every logging.log_freq steps here'),
    ignored('logging.multi_modal_log_interval', None, 'speed-only: media logging'),
    mapped('logging.project_name', 'cosmos_rl', fill=True),
    mapped('logging.group_name', None, '(the W&B group)'),
    mapped('logging.experiment_name', None, '(the W&B run is named <experiment_name>/<timestamp>, as cosmos-rl; unset: the run folder)'),
    mapped('logging.wandb_run_name', None, "(the W&B run's exact name)"),
    ignored('logging.wandb_run_id', None, "launcher-only: the W&B run id (the run folder's name here)"),
    ignored('logging.wandb_resume', 'allow', 'launcher-only: W&B resumes a run of the same id ("allow" here)'),
    ignored('logging.level', None, 'launcher-only: the log level (COSMOS_LOG_LEVEL)'),
    ignored('logging.report_mfu', False, 'speed-only: MFU reporting'),
    ignored('profiler', None, 'speed-only: profiling (use torch.profiler around a step)'),
    mapped('validation.enable', False, '(SFT: token-mean loss of the validation split, logged as val/avg_loss; GRPO, colocated recipe: rewards of one completion per item of validation.dataset, or without its name of the train.train_policy.dataset.test_size items held out of training)'),
    mapped('validation.val_before_train', False, '(SFT; the GRPO recipe validates before its first step always)'),
    mapped('validation.freq', 20),
    ignored('validation.batch_size', None, 'speed-only: validation batching'),
    mapped('validation.dataset.name', ''),
    mapped('validation.dataset.subset', ''),
    mapped('validation.dataset.revision', ''),
    mapped('validation.dataset.split', ''),
    mapped('validation.dataset.test_size', None, "(GRPO: the first int(test_size x N) of the N validation prompts, or the first test_size of them, as cosmos-rl's distillation launch scripts read it; cosmos-rl's own trainers do not read it; SFT stops at start-up when it is set: hold out part of the training data with train.train_policy.dataset.test_size)"),
    refused('validation.dataset.local_dir', '', 'set validation.dataset.name to the local folder or file', noop=('',)),
    mapped('validation.temperature', 0.0),
    mapped('validation.top_p', None, "(unset: rollout.sampling_config.top_p, as cosmos-rl)"),
    refused('validation.top_k', 1, 'validation samples with temperature and top_p only; remove the key', noop=(1, -1)),
    refused('validation.repetition_penalty', 1.0, 'validation samples with temperature and top_p only; remove the key', noop=(1.0,)),
    refused('validation.n_generation', 1, 'one completion per item here; remove the key', noop=(1,)),
    mapped('validation.max_response_length', None, '(unset: rollout.max_response_length)'),
    mapped('validation.reward_function', [], '(empty: the training rewards, grpo.reward_function, as cosmos-rl)'),
    refused('validation.use_remote_reward', None, 'use [remote_reward]', noop=(False,)),
    refused('validation.remote_reward', None, 'use [remote_reward]'),
    mapped('distillation.enable', False, '(the colocated recipe, examples/grpo_vlm.py: a frozen teacher scores each rollout token; the advantage is -kl_penalty_coef x the sampled reverse KL, summed forward with kl_discount_factor; the rewards are bypassed as cosmos-rl bypasses them, or added with distillation.reward_advantages = "add")'),
    mapped('distillation.model_name_or_path', 'Qwen/Qwen2.5-VL-7B-Instruct', '(the teacher, loaded with the policy loader in policy.dtype; it must share the student\'s tokenizer; ours has no default)', fill=True),
    mapped('distillation.model_revision', None),
    mapped('distillation.kl_penalty_coef', 1.0),
    mapped('distillation.kl_discount_factor', 0.0),
    mapped('distillation.mini_batch', 1, '(teacher rows per forward)'),
    refused('distillation.top_k', 0, "top-k generalised Jensen-Shannon distillation (jsd_beta 0: forward KL, 1: reverse KL) is not run: cosmos-rl puts the student's top-k log-probs inside the advantage with their gradient kept, a term the per-token advantage here does not carry; set top_k = 0 (the sampled reverse KL, as all three of cosmos-rl's distillation files); the divergence itself is cp.algo.distillation.topk_jsd_per_token, equal to cosmos-rl's on shared inputs", noop=(0,)),
    ignored('distillation.jsd_beta', 0.5, 'only acts with top_k > 0'),
    refused('distillation.include_prompt', False, 'the teacher scores the completion tokens only here; remove the key', noop=(False,)),
    ignored('distillation.trainer_token_ids_from_teacher', True, 'only acts with top_k > 0'),
    ignored('distillation.rollout_top_k_recompute', False, 'only acts with top_k > 0'),
    ignored('distillation.parallelism', None, 'the teacher is sharded as the policy (policy.parallelism) on the same ranks'),
    ignored('distillation.compile', True, 'speed-only: the frozen teacher is not compiled here'),
    ignored('distillation.master_dtype', 'float32', 'the teacher is frozen: no master weights'),
    ignored('distillation.param_dtype', 'bfloat16', 'the teacher is loaded in policy.dtype'),
    ignored('distillation.logprob_dtype', 'float32', 'teacher log-probs are float32 here'),
    ignored('distillation.fsdp_reduce_dtype', 'float32', 'the teacher is frozen: no gradients to reduce'),
    ignored('distillation.fsdp_offload', False, 'speed-only: the teacher is sharded as the policy'),
    ignored('distillation.fsdp_reshard_after_forward', 'never', 'speed-only: the teacher is sharded as the policy'),
    ignored('distillation.batch_size_per_replica', 8, 'speed-only: the teacher scores each step\'s rollouts in distillation.mini_batch rows'),
    ignored('distillation.max_token_len_per_mini_batch', None, 'speed-only: teacher batching'),
    ignored('distillation.sequence_packing', False, 'speed-only: teacher batching'),
    ignored('distillation.seed', None, 'the frozen teacher samples nothing'),
    ignored('distillation.model_max_length', None, "not a key of cosmos-rl 0.4.7's DistillationConfig (configs/qwen3/qwen3-8b-distill.toml sets it; cosmos-rl drops it): the teacher scores the student's sequences, bounded by policy.model_max_length"),
    refused('vla', None, 'vision-language-action training is not supported here'),
    *_parallelism("policy"),
    *_parallelism("rollout"),
    *_COSMOS_WFM,
    *_DIFFUSERS_WFM,
)
"""Every rule, of every :data:`Family`, in the order of the docs tables (a whole section for ``profiler``, ``distillation.parallelism``,
``vla``, ``policy.diffusers``, ``train.train_policy.remote_reward``, ``validation.remote_reward``)."""



def rules_of(family: Family) -> dict[str, Rule]:
    """cosmos-rl dotted key -> :class:`Rule`, for the files of ``family``."""
    found = {rule.key: rule for rule in RULE_LIST if rule.family == family}
    if len(found) != sum(rule.family == family for rule in RULE_LIST):  # pragma: no cover - a duplicated key would shadow a rule silently
        raise ValueError(f"config/compat/rules.py: a cosmos-rl key has two {family!r} rules")
    return found


RULES: dict[str, Rule] = rules_of("llm")
"""cosmos-rl dotted key of its LLM / VLM config class -> :class:`Rule`."""


def rule_for(path: str) -> Rule | None:
    """The rule of ``path`` or of the section it lies in."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        rule = RULES.get(".".join(parts[:i]))
        if rule is not None:
            return rule
    return None


def cosmos_rl_aliases() -> dict[str, tuple[str, Callable[[Any], Any] | None]]:
    """cosmos-rl's spellings of keys that exist here under another name: alias -> (our key, transform)."""
    return {rule.key: (rule.target, rule.transform) for rule in RULES.values()
            if rule.how == "mapped" and rule.target != rule.key}  # type: ignore[misc]


# keys inside a table a file may leave out whole: their defaults are given only when the table is there
_OPTIONAL_TABLE = "policy.lora."

COSMOS_RL_DEFAULTS: dict[str, Any] = {rule.target: rule.cosmos_rl_value() for rule in RULES.values()  # type: ignore[misc]
                                      if rule.fill and not rule.target.startswith(_OPTIONAL_TABLE)}  # type: ignore[union-attr]
"""cosmos-rl's defaults that differ from ours (our keys), given to a cosmos-rl style file for the keys
it leaves unset; generated from the rules marked ``fill``."""

COSMOS_RL_LORA_DEFAULTS: dict[str, Any] = {
    rule.target[len(_OPTIONAL_TABLE):]: rule.cosmos_rl_value() for rule in RULES.values()  # type: ignore[index]
    if rule.fill and rule.target.startswith(_OPTIONAL_TABLE)}  # type: ignore[union-attr]
"""The same, for the keys of a ``[policy.lora]`` table a file has."""


def _shown(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, str) else str(value).replace("'", '"')


def render_table() -> str:
    """The markdown table of the ``"llm"`` rules of :data:`RULE_LIST` that ``docs/from_cosmos_rl.md``
    carries (a test checks they agree; the world-model rules: ``cosmos_rl_wfm.render_tables``)."""
    lines = ["| cosmos-rl key | cosmos-rl default | here | what it becomes / why / what to do |", "|---|---|---|---|"]
    for rule in RULES.values():
        note = rule.note.replace("|", "\\|")
        lines.append(f"| `{rule.key}` | `{_shown(rule.default)}` | {rule.how} | {note} |")
    return "\n".join(lines) + "\n"
