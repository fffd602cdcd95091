"""The ``[custom.dataset]`` / ``[custom.vision]`` tables of the Cosmos-Reason example configs, read
as the example scripts that consume them read them.

cosmos-rl itself never reads ``[custom]``: the script started with the config does
(``cosmos-rl --config configs/hf_sft.toml scripts/hf_sft.py``). Each script known here is one
:class:`ExampleScript` description in :data:`EXAMPLE_SCRIPTS`, picked by the ``[custom.dataset]`` key
only it reads; another script is one more entry. A script whose data the built-in readers read has
its keys mapped onto ``[train.train_policy.dataset]``; one whose data they cannot read (LLaVA
annotations) maps nothing, and ``cp.config.check_runnable`` stops the recipes on it unless a dataset
plug-in is given (``--dataset <the script>``).

What the scripts do (cosmos-reason2 ``examples/cosmos_rl/scripts/hf_sft.py`` / ``llava_sft.py``,
cosmos-reason1 ``examples/post_training_hf/scripts/sft.py``): ``datasets.load_from_disk(path)``,
the conversation of each row from ``[train.train_policy] conversation_column_name`` (JSON text or a
list), and every image / video part given the ``[custom.vision]`` qwen-vl-utils keys (a whole
table replacing the script's default ``VisionConfig(fps=1)``; Reason1's: ``fps=1,
max_pixels=81920``); the Reason2 scripts then set every video's ``total_pixels`` to
``int(policy.model_max_length x 32 x 32 x 0.9)`` (0.9 x the context in Qwen3-VL tokens), whatever
``[custom.vision]`` says, which lands on ``[train.train_policy.dataset] total_pixels``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DATASET = "train.train_policy.dataset"
COSMOS_RL_MODEL_MAX_LENGTH = 4096  # cosmos-rl's policy.model_max_length default

VISION_KEYS = ("fps", "max_pixels", "min_pixels", "max_frames", "total_pixels")
"""The ``[custom.vision]`` keys that ``[train.train_policy.dataset]`` holds too (same names)."""


@dataclass(frozen=True)
class ExampleScript:
    """One example script that reads ``[custom.dataset]``.

    ``picked_by``: the ``[custom.dataset]`` key only this script reads; ``model_hint``: a substring of
    ``policy.model_name_or_path`` that tells it from a script reading the same keys ("" matches any);
    ``maps``: its ``[custom.dataset]`` keys onto ``[train.train_policy.dataset]`` keys (empty: the
    built-in readers cannot read its data, ``unreadable`` says why and what to do);
    ``vision_default``: its ``[custom.vision]`` when the file has none; ``total_pixels_tokens``:
    the share of ``model_max_length`` it gives every video as ``total_pixels``, in tokens of
    ``pixels_per_token`` pixels, replacing any ``[custom.vision] total_pixels`` (0: none); ``fixed``:
    dataset keys its reader implies (``datasets.load_from_disk``: a local ``"hf"`` dataset, so a
    relative ``path`` is taken as ``./path``, never as a Hub name)."""

    script: str
    picked_by: str
    model_hint: str = ""
    maps: dict[str, str] = field(default_factory=dict)
    fixed: dict[str, Any] = field(default_factory=dict)
    vision_default: dict[str, Any] = field(default_factory=dict)
    total_pixels_tokens: float = 0.0
    pixels_per_token: int = 0
    unreadable: str = ""


EXAMPLE_SCRIPTS = (
    ExampleScript("cosmos-reason1 examples/post_training_hf/scripts/sft.py", "path", model_hint="Reason1",
                  maps={"path": "name"}, fixed={"kind": "hf"}, vision_default={"fps": 1, "max_pixels": 81920}),
    ExampleScript("cosmos-reason2 examples/cosmos_rl/scripts/hf_sft.py", "path", maps={"path": "name"},
                  fixed={"kind": "hf"}, vision_default={"fps": 1}, total_pixels_tokens=0.9,
                  pixels_per_token=32 * 32),  # cosmos_reason2_utils.vision.PIXELS_PER_TOKEN
    ExampleScript("cosmos-reason2 examples/cosmos_rl/scripts/llava_sft.py", "annotation_path",
                  unreadable="LLaVA annotations (human / gpt turns, <image> tags) are read by that script, not by "
                             "the built-in readers: give it to the recipe as the dataset plug-in "
                             "(--dataset scripts/llava_sft.py), or convert the annotations to a 'conversations' "
                             "dataset and set train.train_policy.dataset.name"),
)


def example_script(tree: dict[str, Any]) -> ExampleScript | None:
    """The script a parsed file's ``[custom.dataset]`` is written for, or None."""
    custom = tree.get("custom")
    dataset = custom.get("dataset") if isinstance(custom, dict) else None
    if not isinstance(dataset, dict):
        return None
    policy = tree.get("policy") if isinstance(tree.get("policy"), dict) else {}
    model = str(policy.get("model_name_or_path", ""))
    return next((s for s in EXAMPLE_SCRIPTS if s.picked_by in dataset and s.model_hint in model), None)


def _unset(tree: dict[str, Any], key: str, explicit: set[str]) -> bool:
    dataset = tree.get("train", {}).get("train_policy", {}).get("dataset", {})
    return not (isinstance(dataset, dict) and dataset.get(key) not in (None, "")) and f"{DATASET}.{key}" not in explicit


def read_custom_dataset(tree: dict[str, Any], explicit: set[str]) -> tuple[list[str], dict[str, str]]:
    """Map a cosmos-rl file's ``[custom.dataset]`` / ``[custom.vision]`` onto
    ``[train.train_policy.dataset]`` in place, as :func:`example_script`'s script reads them.

    Nothing is mapped when the file (or ``explicit``, the command line) names a dataset or a plug-in
    itself, nor onto a dataset key the file or ``explicit`` sets. ``[custom]`` stays as it is.

    Returns:
        ``(translated, refused)``: one line per meaning carried over or not carried; refused
        ``[custom.vision]`` keys (key -> what to do) that ``[train.train_policy.dataset]`` cannot hold.
    """
    script = example_script(tree)
    if script is None or not script.maps or not (_unset(tree, "name", explicit) and _unset(tree, "plugin", explicit)):
        return [], {}
    custom = tree["custom"]
    tables = tree.setdefault("train", {}).setdefault("train_policy", {}).setdefault("dataset", {})
    translated = []
    for theirs, ours in script.maps.items():
        if theirs in custom["dataset"]:
            value = custom["dataset"][theirs]
            local = script.fixed.get("kind") == "hf" and isinstance(value, str)
            tables[ours] = f"./{value}" if local and value and not value.startswith(("/", ".", "~")) else value
            translated.append(f"custom.dataset.{theirs} = {tables[ours]!r} is {DATASET}.{ours} "
                              f"(read as {script.script} reads it)")
    for key, value in script.fixed.items():
        if _unset(tree, key, explicit):
            tables[key] = value
    vision = custom.get("vision")
    given = vision if isinstance(vision, dict) else script.vision_default
    replaced = script.total_pixels_tokens > 0 and _unset(tree, "total_pixels", explicit)
    refused = {}
    for key, value in given.items():
        if key == "total_pixels" and script.total_pixels_tokens:
            continue  # the script overwrites it (below)
        if key in VISION_KEYS:
            if _unset(tree, key, explicit):
                tables[key] = value
                translated.append(f"custom.vision.{key} = {value!r} is {DATASET}.{key}"
                                  + ("" if vision is not None else f" ({script.script}'s default)"))
        else:
            refused[f"custom.vision.{key}"] = (f"= {value!r}: {script.script} gives it to every media part; "
                                               f"{DATASET} has no such key: write it into the conversation parts "
                                               "(a part's own qwen-vl-utils keys are read)")
    if replaced:
        tables["total_pixels"] = script_total_pixels(script, tree)
        translated.append(f"{script.script} gives every video total_pixels = int(policy.model_max_length x "
                          f"{script.pixels_per_token} x {script.total_pixels_tokens}) = {tables['total_pixels']}: "
                          f"{DATASET}.total_pixels")
    return translated, refused


def script_total_pixels(script: ExampleScript, tree: dict[str, Any]) -> int:
    """The ``total_pixels`` ``script`` gives every video of a parsed file: ``int(model_max_length x
    pixels_per_token x total_pixels_tokens)``, ``model_max_length`` the file's (cosmos-rl's 4096 when
    unset)."""
    policy = tree.get("policy") if isinstance(tree.get("policy"), dict) else {}
    length = policy.get("model_max_length", COSMOS_RL_MODEL_MAX_LENGTH)
    return int(length * script.pixels_per_token * script.total_pixels_tokens)


def unreadable_custom_dataset(tree_or_custom: dict[str, Any], model: str = "") -> ExampleScript | None:
    """The example script whose ``[custom.dataset]`` the built-in readers cannot read, or None
    (``tree_or_custom``: a ``Config.custom`` table, ``model``: ``policy.model_name_or_path``)."""
    script = example_script({"custom": tree_or_custom, "policy": {"model_name_or_path": model}})
    return script if script is not None and not script.maps else None
