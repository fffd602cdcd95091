"""Dataset plug-ins: users' dataset classes named in the config (``[train.train_policy.dataset]
plugin``, ``[validation.dataset] plugin``) or by the recipes' ``--dataset`` flag, including the
classes of cosmos-rl dataset scripts, run unchanged by SFT and GRPO.

A plug-in is named ``"package.module:Name"`` (importable from ``sys.path``),
``"path/to/script.py:Name"`` (a file, imported as running it would: its folder first on
``sys.path``), or ``"path/to/script.py"``: a cosmos-rl dataset script, run as cosmos-rl's launcher
runs it (:func:`run_script`), whose ``__main__`` block hands the dataset (or its factory) to
``cosmos_rl.launcher.worker_entry.main``; a file that hands none names the one dataset class
(``__len__`` and ``__getitem__``) it defines. Its imports of ``cosmos_rl`` resolve to the stand-ins
of :mod:`cosmos_primitives.data.cosmos_rl_shim` where cosmos-rl is not installed.

The named object is made as cosmos-rl's scripts make theirs (:func:`make_plugin`), then its
``setup`` is called as cosmos-rl's launcher calls it (:func:`call_setup`). A cosmos-rl dataset has
the method shape ``setup(config[, tokenizer])``, ``__len__``, ``__getitem__(idx) -> conversation``
(a list of chat messages, media parts by path) and, for GRPO, ``get_reference_answer(idx) -> str``.
:class:`CosmosRLPromptDataset` turns its items into GRPO :class:`~cosmos_primitives.data.records.Prompt`
s and :class:`CosmosRLConversationDataset` into SFT
:class:`~cosmos_primitives.data.conversation.ConversationSample` s (assistant turns included), media
loaded. A conversation is used as it is, system message included (cosmos-rl's Reason1 scripts send
an empty one, so the chat template adds no default).
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import runpy
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from cosmos_primitives.config.dataset import DatasetConfig
from cosmos_primitives.config.errors import ConfigError
from cosmos_primitives.data import cosmos_rl_shim
from cosmos_primitives.data.bad_samples import BadSampleError, bad_sample_boundary
from cosmos_primitives.data.conversation import ConversationSample, load_conversation, normalize_conversation
from cosmos_primitives.data.hf_conversations import load_hf_dataset
from cosmos_primitives.data.mcq import MCQPromptDataset
from cosmos_primitives.data.media import MediaSettings, default_media_dir
from cosmos_primitives.data.records import Prompt
from cosmos_primitives.logging.console import get_logger
from cosmos_primitives.utils.extras import require
from cosmos_primitives.utils.imports import import_object

if TYPE_CHECKING:  # pragma: no cover
    from cosmos_primitives.config.root import Config

PLUGIN_KEYS = ("train.train_policy.dataset.plugin", "validation.dataset.plugin")
"""The config keys that name dataset plug-ins."""


def load_plugin(path: str, what: str = "dataset plug-in", config: Any = None) -> Any:
    """The object a plug-in path names (see the module docstring for the spellings).

    A script path without ``:Name`` is, given the run's ``config``, run as cosmos-rl's launcher runs
    it (:func:`run_script`): the dataset (or factory) its ``__main__`` block hands
    ``cosmos_rl.launcher.worker_entry.main`` is the plug-in; a script that hands none (or no
    ``config``) names the one dataset class it defines.

    Raises:
        ImportError: the module or file does not import, lacks the name, or (a file without
            ``:Name``) defines no dataset class or several; the message names ``path`` and ``what``.
    """
    cosmos_rl_shim.install()
    module_part, sep, name = path.rpartition(":")
    if not sep or not name.replace(".", "").isidentifier():
        module_part, name = path, ""
    if not (module_part.endswith(".py") or "/" in module_part):
        return import_object(path, what=what)
    file = Path(module_part).expanduser().resolve()
    if not file.is_file():
        raise ImportError(f"{what}: no such file {file} (from {path!r})")
    if not name and config is not None:
        handed = run_script(file, config, what)
        if handed.get("dataset") is not None:
            return handed["dataset"]
    module = _import_file(file, what)
    if not name:
        return _only_dataset_class(module, file, what)
    obj: Any = module
    for part in name.split("."):
        if not hasattr(obj, part):
            raise ImportError(f"{what}: {file} has no attribute {name!r} ({path!r})")
        obj = getattr(obj, part)
    return obj


def run_script(file: Path, config: Any, what: str = "dataset plug-in") -> dict[str, Any]:
    """Run a cosmos-rl dataset script as cosmos-rl's launcher runs it in each policy worker (as
    ``__main__``, ``sys.argv = [script, "--config", <TOML>]``, ``COSMOS_ROLE=Policy``), with the TOML
    holding ``config`` (the run's config, overrides included), and return what it handed
    ``cosmos_rl.launcher.worker_entry.main`` (``dataset``, ``val_dataset``, ...; ``{}`` when it
    called nothing). Arguments other than ``dataset`` are not used here: each is named in a warning.

    Raises:
        ImportError: cosmos-rl itself is installed, whose launcher the script would start: name the
            class instead (``script.py:ClassName``).
    """
    if cosmos_rl_shim.real_cosmos_rl_installed():
        raise ImportError(f"{what}: cosmos-rl is installed here, so running {file} would start its launcher: name "
                          f"the dataset class instead, e.g. '{file}:MyDataset'")
    from cosmos_primitives.config.loader import dump_config

    argv, role = sys.argv, os.environ.get("COSMOS_ROLE")
    with tempfile.TemporaryDirectory() as folder, cosmos_rl_shim.capturing_launch() as handed:
        sys.argv = [str(file), "--config", str(dump_config(config, Path(folder) / "config.toml"))]
        os.environ["COSMOS_ROLE"] = "Policy"
        if str(file.parent) not in sys.path:
            sys.path.insert(0, str(file.parent))
        try:
            runpy.run_path(str(file), run_name="__main__")
        finally:
            sys.argv = argv
            if role is None:
                os.environ.pop("COSMOS_ROLE", None)
            else:
                os.environ["COSMOS_ROLE"] = role
    unused = sorted(k for k, v in handed.items() if k != "dataset" and v is not None)
    if unused:
        get_logger("cosmos.plugins").warning(
            "%s handed cosmos-rl's launcher %s, which the recipe does not take from a script: pass rewards with "
            "--reward, a validation dataset class as [validation.dataset] plugin; packing is the recipe's",
            file, unused)
    return dict(handed)


def _import_file(file: Path, what: str) -> Any:
    """Import the script ``file`` as a module named after it (its folder first on ``sys.path``, as
    ``python file`` would have it), or return it when it already was."""
    for module in list(sys.modules.values()):
        if getattr(module, "__file__", None) and Path(module.__file__).resolve() == file:
            return module
    name = file.stem if file.stem not in sys.modules else f"{file.stem}_{abs(hash(str(file))):x}"
    if str(file.parent) not in sys.path:
        sys.path.insert(0, str(file.parent))
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        del sys.modules[name]
        if isinstance(exc, ImportError):
            raise ImportError(f"{what}: importing {file} failed: {exc}") from exc
        raise
    return module


def _only_dataset_class(module: Any, file: Path, what: str) -> type:
    classes = [obj for obj in vars(module).values() if inspect.isclass(obj) and obj.__module__ == module.__name__
               and callable(getattr(obj, "__getitem__", None)) and callable(getattr(obj, "__len__", None))]
    if len(classes) != 1:
        found = ", ".join(c.__name__ for c in classes) or "none"
        raise ImportError(f"{what}: {file} defines {len(classes)} dataset classes ({found}): name one, "
                          f"e.g. '{file}:{classes[0].__name__ if classes else 'MyDataset'}'")
    return classes[0]


def load_dataset_splits(dataset_cfg: Any) -> Any:
    """Every split of the data ``dataset_cfg`` names, what cosmos-rl scripts hand their class before
    its ``setup`` picks ``split`` (Cosmos-Reason1's ``load_dataset(name, subset)``): a
    ``datasets.DatasetDict``. A ``save_to_disk`` folder is loaded as it was saved; a data file is the
    one split ``split`` names."""
    datasets = require("datasets", "a dataset plug-in that takes the loaded dataset")
    path = Path(dataset_cfg.name).expanduser()
    if path.is_dir() and ((path / "dataset_dict.json").is_file() or (path / "dataset_info.json").is_file()):
        loaded = datasets.load_from_disk(str(path))
        return loaded if isinstance(loaded, datasets.DatasetDict) else datasets.DatasetDict({dataset_cfg.split: loaded})
    if path.is_file():
        return datasets.DatasetDict({dataset_cfg.split: load_hf_dataset(str(path), split=dataset_cfg.split)})
    return datasets.load_dataset(dataset_cfg.name, dataset_cfg.subset or None, revision=dataset_cfg.revision or None)


def make_plugin(factory: Any, dataset_cfg: Any, config: Any = None, what: str = "dataset plug-in") -> Any:
    """The dataset ``factory`` (what :func:`load_plugin` returned) makes, as cosmos-rl scripts make theirs.

    An object that is not callable is used as it is. A class or function gets, by the names of its
    required parameters, ``config`` (the run's config, as in cosmos-rl's ``get_dataset(config)``
    factories) and ``dataset`` (:func:`load_dataset_splits`, as Cosmos-Reason1's ``cosmos_sft.py``
    hands its ``CosmosSFTDataset``); a function with one required parameter of another name is
    such a factory and gets the config.

    Raises:
        TypeError: a required parameter has another name: wrap the class in a factory of yours.
    """
    if not callable(factory):
        return factory
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature
        return factory()
    required = [p for p in parameters if p.default is inspect.Parameter.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if len(required) == 1 and not inspect.isclass(factory) and required[0].name not in ("config", "dataset"):
        return factory(config)  # cosmos-rl's factory convention: called with the config
    values = {"config": lambda: config, "dataset": lambda: load_dataset_splits(dataset_cfg)}
    unknown = [p.name for p in required if p.name not in values]
    if unknown:
        raise TypeError(f"{what}: {getattr(factory, '__qualname__', factory)} requires {unknown}, which the "
                        "recipe cannot supply (it passes 'config' and 'dataset' by name): give a factory of yours "
                        "instead, e.g. def make(config): return YourDataset(...)")
    args = [values[p.name]() for p in required if p.kind is p.POSITIONAL_ONLY]
    kwargs = {p.name: values[p.name]() for p in required if p.kind is not p.POSITIONAL_ONLY}
    return factory(*args, **kwargs)


def cosmos_rl_view(config: Any) -> Any:
    """``config`` shaped as cosmos-rl's ``Config`` hands it to a dataset's ``setup``: each dataset
    section's ``split`` a list of split names (cosmos-rl keeps a list; the loader here joins one as
    ``"a+b"``). Other values are this library's (see ``docs/from_cosmos_rl.md``)."""
    if not hasattr(config, "train") or not hasattr(config, "validation"):
        return config

    def listed(section: Any) -> Any:
        return msgspec.structs.replace(section, split=[s for s in str(section.split).split("+") if s])

    policy = msgspec.structs.replace(config.train.train_policy, dataset=listed(config.train.train_policy.dataset))
    validation = msgspec.structs.replace(config.validation, dataset=listed(config.validation.dataset))
    return msgspec.structs.replace(config, train=msgspec.structs.replace(config.train, train_policy=policy),
                                   validation=validation)


def call_setup(dataset: Any, config: Any = None, tokenizer: Any = None) -> None:
    """Call ``dataset.setup`` (if any) as cosmos-rl's launcher does: ``setup(config)`` or, the older
    signature with two required parameters, ``setup(config, tokenizer)``; ``config`` as
    :func:`cosmos_rl_view` shapes it.

    Raises:
        TypeError: ``setup`` requires another number of parameters, naming the class and signature.
    """
    setup = getattr(dataset, "setup", None)
    if setup is None:
        return
    signature = inspect.signature(setup)
    required = [p for p in signature.parameters.values()
                if p.kind is p.POSITIONAL_OR_KEYWORD and p.default is inspect.Parameter.empty]
    view = cosmos_rl_view(config)
    if len(required) == 1:
        setup(view)
    elif len(required) == 2:
        setup(view, tokenizer)
    else:
        raise TypeError(f"{type(dataset).__name__}.setup{signature} must take (config) or (config, tokenizer), "
                        "as cosmos-rl calls it")


class _SetUpPlugin:
    """A user's dataset object with cosmos-rl's method shape, set up (:func:`call_setup`) and read
    with this library's media settings; subclasses say what ``dataset[i]`` becomes."""

    def __init__(self, dataset: Any, config: Any = None, tokenizer: Any = None, media_dir: Any = None,
                 settings: MediaSettings | None = None, name: str = "plugin") -> None:
        call_setup(dataset, config, tokenizer)
        self.dataset = dataset
        self.media_dir = media_dir
        self.settings = settings or MediaSettings()
        self.name = name

    def __len__(self) -> int:
        return len(self.dataset)


class CosmosRLPromptDataset(_SetUpPlugin):
    """Prompts from a dataset object with cosmos-rl's method shape.

    Args:
        dataset: the instance (its ``setup`` is called here, :func:`call_setup`).
        config: what ``setup`` receives as its config (the loaded :class:`~cosmos_primitives.config.Config`).
        tokenizer: what ``setup`` receives as its tokenizer.
        media_dir, settings: where relative media paths resolve and how media are read.
        name: used in bad-sample messages.

    ``dataset[i]`` is a :class:`Prompt`; an item that fails (an exception in the user's
    ``__getitem__``, a missing media file) raises :class:`BadSampleError` naming the index, so the
    recipes count and skip it within the bad-sample budget.
    """

    def __getitem__(self, index: int) -> Prompt:
        where = f"{self.name}[{index}]"
        try:
            item = self.dataset[index]
            reference = self.dataset.get_reference_answer(index) if hasattr(self.dataset, "get_reference_answer") \
                else None
        except Exception as exc:  # the user's code: one bad item is a counted bad sample, not a dead run
            raise BadSampleError(where, f"{type(exc).__name__}: {exc}") from exc
        if isinstance(item, str):  # plain text, used as it is (cosmos-rl's text models do the same)
            return Prompt(conversation=item, prompt_id=where, reference="" if reference is None else str(reference),
                          row={"index": index})
        if not isinstance(item, list) or not all(isinstance(m, dict) and "role" in m for m in item):
            raise BadSampleError(where, f"__getitem__ must return a conversation (a list of messages) or a "
                                        f"string, got {type(item).__name__}")
        loaded = load_conversation(item, self.media_dir, self.settings, sample_id=where)
        return Prompt(conversation=loaded.conversation, prompt_id=where, images=loaded.images, videos=loaded.videos,
                      video_fps=loaded.video_fps,
                      video_metadata=loaded.video_metadata, reference="" if reference is None else str(reference),
                      row={"index": index})


class CosmosRLConversationDataset(_SetUpPlugin):
    """SFT conversations from a dataset object with cosmos-rl's method shape (what cosmos-rl's SFT
    trainer takes from a user's dataset: ``dataset[i]`` is the whole conversation, assistant turns
    included, a list of messages or its JSON text).

    Args: as :class:`CosmosRLPromptDataset`.

    ``dataset[i]`` is a :class:`ConversationSample` with its media loaded (an item that already is
    one, this library's shape, is passed on as it is); an item that fails (an exception in the
    user's ``__getitem__``, a malformed conversation, a missing media file) raises
    :class:`BadSampleError` naming ``name[i]`` (or the media file), which the SFT loader counts and
    skips within the bad-sample budget.
    """

    def __getitem__(self, index: int) -> ConversationSample:
        where = f"{self.name}[{index}]"
        with bad_sample_boundary(where):  # the user's code: one bad item is a counted bad sample
            item = self.dataset[index]
            if isinstance(item, ConversationSample):
                return item
            conversation = normalize_conversation(item, where)
        return load_conversation(conversation, self.media_dir, self.settings, sample_id=where)


class ColumnPromptDataset:
    """GRPO prompts from rows with a prompt column and a reference-answer column (cosmos-rl's
    ``prompt_column_name`` / ``response_column_name``), text-only or with an image / video.

    A string prompt is plain text used as it is, with no chat template (as cosmos-rl and TRL take a
    string prompt), unless the row has an image or video or ``system_prompt`` is a non-empty string:
    then it becomes the user message (after the media) of a conversation that goes through the chat
    template. A prompt that is already a conversation (a list of messages) is used as it is.
    ``system_prompt`` (unless None) adds a system message before a conversation; ``""`` is an empty
    one, as cosmos-rl's Reason1 script sends (a plain-text prompt stays plain). The reference answer
    is the response column's value as text ("" when no response column is named); the rewards
    receive it and the row.
    """

    def __init__(self, rows: Any, prompt_column: str, response_column: str = "", media_dir: Any = None,
                 settings: MediaSettings | None = None, image_column: str = "image", video_column: str = "video",
                 system_prompt: str | None = None, name: str = "dataset") -> None:
        self.rows = rows
        self.prompt_column, self.response_column = prompt_column, response_column
        self.media_dir = media_dir
        self.settings = settings or MediaSettings()
        self.image_column, self.video_column = image_column, video_column
        self.system_prompt = system_prompt
        self.name = name

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> Prompt:
        row = dict(self.rows[index])
        where = f"{self.name}[{index}]"
        if self.prompt_column not in row:
            raise BadSampleError(where, f"no prompt column {self.prompt_column!r} "
                                        f"(train.train_policy.prompt_column_name); row has {sorted(row)}")
        prompt = row[self.prompt_column]
        media = row.get(self.video_column) or row.get(self.image_column)
        reference = row.get(self.response_column, "") if self.response_column else ""
        reference = "" if reference is None else str(reference)
        if isinstance(prompt, str) and not media and not self.system_prompt:
            return Prompt(conversation=prompt, prompt_id=str(row.get("id", where)), reference=reference, row=row)
        if isinstance(prompt, str):
            content: list[dict[str, Any]] = []
            if row.get(self.video_column):
                content.append({"type": "video", "video": str(row[self.video_column])})
            elif row.get(self.image_column):
                content.append({"type": "image", "image": str(row[self.image_column])})
            content.append({"type": "text", "text": prompt})
            messages = [{"role": "user", "content": content}]
        elif isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt):
            messages = prompt
        else:
            raise BadSampleError(where, f"prompt column {self.prompt_column!r} holds a {type(prompt).__name__}, "
                                        "not a string or a conversation: read such rows with a dataset plug-in "
                                        "(train.train_policy.dataset.plugin) or the MCQ reader's dotted columns")
        if self.system_prompt is not None:
            messages = [{"role": "system", "content": self.system_prompt}, *messages]
        loaded = load_conversation(messages, self.media_dir, self.settings, sample_id=where)
        return Prompt(conversation=loaded.conversation, prompt_id=str(row.get("id", where)), images=loaded.images,
                      videos=loaded.videos, video_fps=loaded.video_fps,
                      video_metadata=loaded.video_metadata, reference=reference, row=row)


def plugin_key(dataset_cfg: Any, config: Any = None) -> str:
    """The config key of ``dataset_cfg``'s plug-in: the validation dataset's or the training data's."""
    validation = getattr(getattr(config, "validation", None), "dataset", None)
    return PLUGIN_KEYS[1] if validation is not None and dataset_cfg is validation else PLUGIN_KEYS[0]


def build_plugin(dataset_cfg: Any, config: Any = None) -> Any:
    """The dataset ``dataset_cfg.plugin`` names, loaded (:func:`load_plugin`) and made
    (:func:`make_plugin`); its ``setup`` is not called yet."""
    what = plugin_key(dataset_cfg, config)
    return make_plugin(load_plugin(dataset_cfg.plugin, what=what, config=config), dataset_cfg, config, what=what)


def prompt_dataset(dataset_cfg: DatasetConfig, *, prompt_column: str = "", response_column: str = "",
                   processor: Any = None, setup_config: Config | None = None) -> Any:
    """The GRPO prompt source of a ``DatasetConfig``: its ``plugin`` (:func:`build_plugin`; an object
    with cosmos-rl's ``setup`` / ``get_reference_answer`` is wrapped in :class:`CosmosRLPromptDataset`,
    any other is taken to yield :class:`Prompt` items itself); else, with a ``prompt_column``
    (``[train.train_policy] prompt_column_name``), a :class:`ColumnPromptDataset` over the dataset's
    rows whose reference answers are ``response_column`` (``response_column_name``); else the
    built-in MCQ reader. ``setup_config`` (the run's config, what cosmos-rl hands a dataset's
    ``setup``) and ``processor``'s tokenizer (or ``processor`` itself when it is one) go to the
    plug-in's ``setup``.

    Raises:
        ImportError: the plug-in does not import (naming the path and the key).
    """
    if not dataset_cfg.plugin and prompt_column:
        rows = load_hf_dataset(dataset_cfg.name, split=dataset_cfg.split, subset=dataset_cfg.subset,
                               revision=dataset_cfg.revision)
        return ColumnPromptDataset(rows, prompt_column, response_column,
                                   media_dir=default_media_dir(dataset_cfg),
                                   settings=MediaSettings.from_config(dataset_cfg, processor),
                                   image_column=dataset_cfg.image_column, video_column=dataset_cfg.video_column,
                                   system_prompt=dataset_cfg.system_prompt, name=dataset_cfg.name or "dataset")
    if not dataset_cfg.plugin:
        return MCQPromptDataset.from_config(dataset_cfg, processor=processor)
    dataset = build_plugin(dataset_cfg, setup_config)
    if not (hasattr(dataset, "setup") or hasattr(dataset, "get_reference_answer")):
        return dataset  # this library's shape: dataset[i] is a Prompt
    tokenizer = getattr(processor, "tokenizer", processor)
    return CosmosRLPromptDataset(dataset, setup_config, tokenizer, media_dir=default_media_dir(dataset_cfg),
                                 settings=MediaSettings.from_config(dataset_cfg, processor), name=dataset_cfg.plugin)


def sft_plugin_dataset(dataset_cfg: Any, config: Any = None, processor: Any = None) -> CosmosRLConversationDataset:
    """The SFT dataset ``dataset_cfg.plugin`` names (:func:`build_plugin`), in a
    :class:`CosmosRLConversationDataset`: its ``setup`` gets ``config`` and ``processor``'s tokenizer
    (or ``processor`` itself when it is one); items that are chat conversations (cosmos-rl's shape)
    have their media loaded, relative paths under ``default_media_dir(dataset_cfg)``, with
    ``dataset_cfg``'s media settings; :class:`ConversationSample` items pass as they are."""
    dataset = build_plugin(dataset_cfg, config)
    tokenizer = getattr(processor, "tokenizer", processor)
    return CosmosRLConversationDataset(dataset, config, tokenizer, media_dir=default_media_dir(dataset_cfg),
                                       settings=MediaSettings.from_config(dataset_cfg, processor),
                                       name=dataset_cfg.plugin)


def check_plugins_read(config: Any, source: str, reads: tuple[str, ...] = PLUGIN_KEYS) -> None:
    """Refuse a plug-in key that the recipe would not read, rather than train on other data.

    Args:
        config: the loaded config.
        source: the config file (named in the message).
        reads: the plug-in keys (of :data:`PLUGIN_KEYS`) the recipe reads; ``validation.dataset.plugin``
            counts only with ``[validation] enable``.

    Raises:
        ConfigError: one line per plug-in key that is set but not read, naming it and what to do.
    """
    values = dict(zip(PLUGIN_KEYS, (config.train.train_policy.dataset.plugin, config.validation.dataset.plugin),
                      strict=True))
    read = {key for key in reads if key != PLUGIN_KEYS[1] or config.validation.enable}
    problems = [f"{source}: key '{key}' = {values[key]!r} is not read by this recipe"
                + (" (validation is off: set validation.enable = true, or remove the key)"
                   if key == PLUGIN_KEYS[1] and key in reads else
                   " (it reads its own data section: remove the key, or run a recipe that takes a dataset plug-in)")
                for key in PLUGIN_KEYS if values[key] and key not in read]
    if problems:
        raise ConfigError("\n".join(problems), problems)
