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
values asks for nothing. The rules are the ``"cosmos"`` and ``"diffusers"`` families of the one typed
list, ``config/compat/rules.py``'s ``RULE_LIST``. cosmos-rl's defaults (the rules' ``default``, checked
against its own classes by ``tests/test_cosmos_rl_wfm.py``) fill the keys a file leaves out, so a file means the
same whichever keys it happens to spell. A diffusers file's keys that are not world-model specific
(``train.optm_lr``, ``train.ckpt.*``, ...) follow ``config/compat/cosmos_rl.py``'s table.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Literal

from cosmos_primitives.config.compat import cosmos_rl
from cosmos_primitives.config.compat.rules import Rule, rules_of

Kind = Literal["cosmos", "diffusers"]


COSMOS_RULES: dict[str, Rule] = rules_of("cosmos")
"""Every key of cosmos-rl's Cosmos-Predict2.5 trainer config (``CosmosVisionGenConfig``) -> its rule."""
DIFFUSERS_RULES: dict[str, Rule] = rules_of("diffusers")
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


def rule_for(path: str, kind: Kind = "cosmos") -> Rule | None:
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

    def __init__(self, tree: dict[str, Any], rules: dict[str, Rule]) -> None:
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


def targets(rule: Rule) -> tuple[str, str]:
    """``(our keys, how)`` of a mapped rule: its typed ``target`` (comma-separated where one cosmos-rl
    key sets several of ours) and its reason without the parentheses."""
    reason = rule.reason
    if reason.startswith("(") and reason.endswith(")"):
        reason = reason[1:-1]
    return str(rule.target), reason


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
    if "rollout_batch_size" in w["data"]:
        w["rollout_batch_size"] = w["data"].pop("rollout_batch_size")
    train["train_policy"] = {"mini_batch": w.get("rollout_batch_size", 1)}
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
                    height=height, width=width, rollout_batch_size=f.get(video + "batch_size"), text_encoder="none")
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
                    text_dim=f.get(dataset + "dataset.t5_dim", T5_DIM), rollout_batch_size=f.get(dataset + "batch_size"),
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
                                  f"per data-parallel rank = {per_rank} prompts x n_generation {n} (wfm.rollout_batch_size)")
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
        "rollout_batch_size": per_rank,
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
                 "width": width, "max_tokens": f.get(d + "max_prompt_length"),
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
_SHARED_DEFAULTS = {rule.target: rule.cosmos_rl_value() for rule in cosmos_rl.RULES.values()
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
    per_rank = w.rollout_batch_size * w.num_samples_per_prompt // spread
    return {"samples_per_step_per_rank": per_rank, "samples_per_step": per_rank * data_ranks,
            "prompts_per_step": w.rollout_batch_size * data_ranks // spread,
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
