"""The input paths of a config: demo assets asked for explicitly, and local paths that must exist.

A path written ``demo:<path>`` (``model_name_or_path = "demo:./outputs/demo_models/tiny_qwen2_5_vl"``)
asks for a generated demo asset at ``<path>`` (``cp.testing.ensure_demo_assets`` writes it when it is
missing; ``[custom] demo_model`` / ``demo_data`` say which). Any other path is one the user means to
read: nothing is ever generated there, and :func:`check_input_paths` stops the run with an error
naming the key, the config file and the path when a local one does not exist.
"""

from __future__ import annotations

import math
from pathlib import Path

import msgspec

from cosmos_primitives.config.compat.cosmos_rl_custom import unreadable_custom_dataset
from cosmos_primitives.config.errors import ConfigError
from cosmos_primitives.config.root import Config
from cosmos_primitives.config.seed import resolve_seed

DEMO_PREFIX = "demo:"

# dotted key -> how to reach its value (and rebuild the config with another one)
INPUT_PATH_KEYS = (
    "policy.model_name_or_path",
    "train.train_policy.dataset.name",
    "train.train_policy.dataset.media_dir",
    "validation.dataset.name",
    "validation.dataset.media_dir",
)


def demo_target(value: str) -> Path | None:
    """The path a ``demo:<path>`` value asks a demo asset for, or None for any other value."""
    return Path(value[len(DEMO_PREFIX):]) if value.startswith(DEMO_PREFIX) else None


def looks_local(value: str) -> bool:
    """Whether ``value`` names a local file or folder rather than a Hub id (``owner/name``) or a
    built-in name (``tiny``): absolute, ``./`` / ``../`` / ``~``-relative, more than one ``/``, or a
    data-file suffix."""
    if not value:
        return False
    return (value.startswith(("/", "./", "../", "~", ".\\")) or value.count("/") >= 2
            or Path(value).suffix in {".json", ".jsonl", ".parquet", ".arrow", ".csv", ".safetensors"})


def _get(config: Config, key: str) -> str:
    node: object = config
    for part in key.split("."):
        node = getattr(node, part)
    return node  # type: ignore[return-value]


def _replace(node: msgspec.Struct, parts: list[str], value: str) -> msgspec.Struct:
    if len(parts) == 1:
        return msgspec.structs.replace(node, **{parts[0]: value})
    child = getattr(node, parts[0])
    return msgspec.structs.replace(node, **{parts[0]: _replace(child, parts[1:], value)})


def _keys_in_use(config: Config) -> tuple[str, ...]:
    keys = INPUT_PATH_KEYS if config.validation.enable else INPUT_PATH_KEYS[:3]
    if config.wfm.data.kind == "clip_folder":
        keys += ("wfm.data.path",)
    return keys


def resolve_demo_paths(config: Config) -> Config:
    """``config`` with every ``demo:<path>`` input path replaced by ``<path>`` (run this after the
    assets were written, e.g. by ``cp.testing.ensure_demo_assets`` on rank 0 and a barrier)."""
    for key in (*INPUT_PATH_KEYS, "wfm.data.path"):
        target = demo_target(_get(config, key))
        if target is not None:
            config = _replace(config, key.split("."), str(target))
    return config


def check_runnable(config: Config, source: str) -> Config:
    """What a recipe calls at start-up: :func:`check_input_paths` plus the settings the loader
    refused (``config.unsupported``, e.g. cosmos-rl keys asking for FP8 or expert parallelism),
    a ``[validation.dataset] test_size`` in SFT (which does not read it), a held-out validation split of 0 items,
    a response column without a prompt column, and a ``[custom.dataset]`` the built-in readers cannot
    read (a Cosmos-Reason example script's, ``config/compat/cosmos_rl_custom.py``) with neither a dataset
    name nor a plug-in. Returns the config with ``demo:`` dropped and an
    unset ``[train] seed`` drawn (:func:`~cosmos_primitives.config.seed.resolve_seed`).

    Raises:
        ConfigError: every such problem at once, one line each naming the key and ``source``.
    """
    problems = [f"{source}: key '{key}' {what}" for key, what in config.unsupported.items()]
    policy = config.train.train_policy
    if config.validation.enable and not config.validation.dataset.name and policy.dataset.test_size == 0:
        problems.append(f"{source}: key 'train.train_policy.dataset.test_size' = 0 holds nothing out, and "
                        "validation.enable with no validation.dataset.name validates on what it holds out: "
                        "set test_size (an item count or a fraction) or validation.dataset.name")
    if config.validation.dataset.test_size is not None and policy.type == "sft":
        problems.append(f"{source}: key 'validation.dataset.test_size' = {config.validation.dataset.test_size!r} is "
                        "not read by SFT (cosmos-rl's trainers do not read it either): the held-out part of the "
                        "training data is train.train_policy.dataset.test_size; to validate on part of a "
                        "validation dataset, point validation.dataset at a smaller split")
    if policy.response_column_name and not policy.prompt_column_name and not policy.dataset.plugin:
        problems.append(f"{source}: key 'train.train_policy.response_column_name' is set without "
                        "prompt_column_name: name the prompt column too (or give a dataset plug-in)")
    script = unreadable_custom_dataset(config.custom, config.policy.model_name_or_path)
    if script is not None and not policy.dataset.name and not policy.dataset.plugin:
        problems.append(f"{source}: key 'train.train_policy.dataset.name' is empty and no dataset plug-in is given; "
                        f"the file's [custom.dataset] is for {script.script}: {script.unreadable}")
    data = config.wfm.data
    if data.kind == "webdataset" and not data.shards:
        problems.append(f"{source}: key 'wfm.data.shards' is empty: [wfm.data] kind = \"webdataset\" reads the tar "
                        "shards it names (local files / folders / globs, s3://bucket/prefix, {0000..0099} ranges)")
    if data.kind == "webdataset" and not config.train.max_steps:
        problems.append(f"{source}: key 'train.max_steps' is unset: a [wfm.data] kind = "
                        "\"webdataset\" stream has no length to count epochs in; set train.max_steps")
    try:
        config = check_input_paths(config, source)
    except ConfigError as exc:
        problems += exc.problems
    if problems:
        raise ConfigError("\n".join(problems), problems)
    return resolve_seed(config)


def check_input_paths(config: Config, source: str) -> Config:
    """Resolve ``demo:`` paths (:func:`resolve_demo_paths`) and check that every local input path
    the run reads exists.

    Raises:
        ConfigError: one line per missing path, naming the key, ``source`` (the config file) and the
            path; nothing is created there.
    """
    config = resolve_demo_paths(config)
    problems = []
    for key in _keys_in_use(config):
        value = _get(config, key)
        local = bool(value) if key.endswith(("media_dir", "data.path")) else looks_local(value)
        if local and not Path(value).expanduser().exists():
            problems.append(f"{source}: key '{key}' = {value!r}: no such file or folder ({Path(value).resolve()}); "
                            f"fix the path (nothing is generated at a path you read; a demo asset is asked for "
                            f"as '{DEMO_PREFIX}<path>')")
    if problems:
        raise ConfigError("\n".join(problems), problems)
    return config


def parse_reward_flag(spec: str) -> tuple[str, float]:
    """``(reward, weight)`` of one ``--reward`` value: ``my_pkg.rewards:score`` (weight 1) or
    ``my_pkg.rewards:score=0.5``; the reward may also be a registered name (``format=0.25``).

    Raises:
        ConfigError: naming the flag value, when the weight is not a finite number or the name is empty.
    """
    name, sep, weight = spec.rpartition("=") if "=" in spec else (spec, "", "")
    name = name.strip()
    try:
        value = float(weight) if sep else 1.0
    except ValueError:
        value = math.nan
    if not name or not math.isfinite(value):
        problem = f"--reward {spec!r}: expected MODULE:FUNCTION or MODULE:FUNCTION=WEIGHT (e.g. my_mod:fn=0.5)"
        raise ConfigError(problem, [problem])
    return name, value


def with_plugins(config: Config, dataset: str | None = None, rewards: list[str] | tuple[str, ...] = ()) -> Config:
    """``config`` with the recipes' ``--dataset`` / ``--reward`` plug-ins: ``dataset`` (an import path)
    becomes ``[train.train_policy.dataset] plugin``; ``rewards`` (import paths or registered names,
    each with an optional ``=WEIGHT``, default 1; :func:`parse_reward_flag`) replace
    ``[grpo] reward_function`` (the functions handed over are the rewards, as with cosmos-rl's
    launcher)."""
    if dataset:
        config = _replace(config, ["train", "train_policy", "dataset", "plugin"], dataset)
    if rewards:
        weights: dict[str, float] = {}
        for spec in rewards:
            name, weight = parse_reward_flag(spec)
            if name in weights:
                problem = f"--reward {name!r} is given twice; give each reward once"
                raise ConfigError(problem, [problem])
            weights[name] = weight
        config = msgspec.structs.replace(config, grpo=msgspec.structs.replace(config.grpo, reward_function=weights))
    return config
