# ruff: noqa: E501  (messages kept whole on one line)
"""Reading a cosmos-rl LLM / VLM file: which style a file is (:func:`file_style`), its ignored and
refused keys taken out (:func:`read_cosmos_rl`) and cosmos-rl's meanings and defaults given
(:func:`apply_cosmos_rl_meanings`), all driven by the typed rule list of ``config/compat/rules.py``.
cosmos-rl's world-model files are read by ``config/compat/cosmos_rl_wfm.py`` instead, before these rules
are consulted.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from cosmos_primitives.config.compat.cosmos_rl_custom import read_custom_dataset
from cosmos_primitives.config.compat.rules import (  # noqa: F401  (re-exported: migrate, tests)
    COSMOS_RL_DEFAULTS,
    COSMOS_RL_LORA_DEFAULTS,
    RULES,
    KeyRule,
    Rule,
    render_table,
    rule_for,
)

_ENGINES = ("auto", "hf", "vllm")

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
                                              "set rollout.backend to one of them, or to 'auto' (vLLM where it is "
                                              "installed and a GPU is present, else hf, chosen when the engine is built)")
    decay_ratio = train.get("optm_decay_ratio")
    if isinstance(decay_ratio, (int, float)) and not isinstance(decay_ratio, bool) and decay_ratio == 0:
        # cosmos-rl: round(steps x 0) = 0 decay steps, so the lr holds its peak after warmup whatever the decay type
        train.pop("optm_decay_ratio")
        train["optm_decay_type"] = "constant"
        reading.translated.append("train.optm_decay_ratio = 0.0 (no decay steps, the peak held after warmup) is "
                                  "train.optm_decay_type = 'constant' here")
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
    as its script reads them (:func:`~cosmos_primitives.config.compat.cosmos_rl_custom.read_custom_dataset`).
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
