"""Stand-ins for the ``cosmos_rl`` modules that cosmos-rl dataset scripts import, so that such a
script loads here unchanged as a dataset plug-in (:mod:`cosmos_primitives.data.plugins`).

cosmos-rl cannot share an environment with this library (it pins ``transformers < 5``), yet its
users' scripts open with ``from cosmos_rl.policy.config import Config`` and the like, mostly for
type hints and for their ``__main__`` block, which starts cosmos-rl's launcher. :func:`install`
adds an import hook, last in ``sys.meta_path``, that serves the modules below only where no real
``cosmos_rl`` (or ``toml``) is importable; an installed cosmos-rl always wins.

- ``cosmos_rl.policy.config``: ``Config`` is this library's config class (the object a plug-in's
  ``setup`` receives), with cosmos-rl's ``Config.from_dict``.
- ``cosmos_rl.utils.util``: ``basename_from_modelpath`` (cosmos-rl's rule: the last two
  ``/``-separated parts of a dataset name, which its clip folders under ``$COSMOS_CACHE`` use) and
  ``prepare_cosmos_data`` (checks that the clips are there; downloads nothing).
- ``cosmos_rl.utils.logging``: ``logger``, the ``"cosmos"`` logger.
- ``cosmos_rl.launcher.worker_entry``: ``main``, what a script's ``__main__`` block calls to start
  cosmos-rl's workers, hands its arguments to the recipe that runs the script
  (:func:`capturing_launch`); called elsewhere it raises.
- ``cosmos_rl.dispatcher.data.packer``: ``DataPacker``, ``BaseDataPacker`` and the model packers
  (``Qwen2_5_VLM_DataPacker``, ``Qwen3_VL_DataPacker``, ...), inert, so that a script may subclass
  and make them; the recipes pack samples with the model's processor.
- ``toml``: ``load`` / ``loads`` / ``dump`` / ``dumps`` / ``TomlDecodeError`` (cosmos-rl installs
  ``toml``; its scripts import it), with ``tomllib`` and the config writer.

Any other ``cosmos_rl`` module raises ``ModuleNotFoundError`` saying which and what to do.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

STAND_IN = "__cosmos_primitives_stand_in__"
"""Attribute set on every stand-in module (``True``)."""

_RUN_THE_RECIPE = ("this library has no cosmos-rl launcher: run your dataset class through a recipe, e.g. "
                   "python examples/sft.py --config FILE --dataset path/to/script.py:YourDataset")


def basename_from_modelpath(path: str) -> str:
    """cosmos-rl's short name of a model or dataset path: its last two ``/``-separated parts."""
    parts = path.strip().strip("/").split("/")
    return "/".join(parts[-2:]) if len(parts) > 2 else "/".join(parts)


_handed: dict[str, Any] | None = None  # what launch_worker records while capturing_launch is active


def launch_worker(dataset: Any = None, *args: Any, **kwargs: Any) -> None:
    """Stands in for ``cosmos_rl.launcher.worker_entry.main``: inside :func:`capturing_launch` it
    records what the script hands it (``dataset``, ``val_dataset``, ``reward_fns``, ...); elsewhere
    it raises."""
    if _handed is None:
        raise RuntimeError(f"cosmos_rl.launcher.worker_entry.main() was called: {_RUN_THE_RECIPE}")
    if args:
        raise TypeError("cosmos_rl.launcher.worker_entry.main() takes its arguments by keyword after dataset")
    _handed.update(kwargs, dataset=dataset)


@contextlib.contextmanager
def capturing_launch() -> Iterator[dict[str, Any]]:
    """While active, a script's call of ``cosmos_rl.launcher.worker_entry.main(dataset=..., ...)``
    (the last line of a cosmos-rl dataset script's ``__main__`` block) fills the yielded dict with
    its arguments instead of starting anything."""
    global _handed
    outer, _handed = _handed, {}
    try:
        yield _handed
    finally:
        _handed = outer


def prepare_cosmos_data(dataset: Any, *args: Any, **kwargs: Any) -> None:
    """Stands in for ``cosmos_rl.utils.util.prepare_cosmos_data`` (a script's download of a Hub
    dataset's clips): nothing to do when the clips are where cosmos-rl extracts them
    (``$COSMOS_CACHE/datasets/<owner>/<name>/<subset>/video_clips``, not empty); else raises saying where
    they must go (nothing is downloaded here)."""
    from cosmos_primitives.data.media import cosmos_cache_clip_dir

    clips = cosmos_cache_clip_dir(dataset.name, dataset.subset)
    if clips is None or not any(clips.iterdir()):
        raise RuntimeError(
            f"cosmos_rl.utils.util.prepare_cosmos_data(): the clips of {dataset.name!r} (subset "
            f"{dataset.subset!r}) are not in $COSMOS_CACHE/datasets/<owner>/<name>/<subset>/video_clips, and this "
            "library downloads nothing: download and extract them there (the dataset's <subset>/clips/*.tar.gz) "
            "as cosmos-rl would, or name the dataset class (script.py:ClassName) and point "
            "[train.train_policy.dataset] media_dir at your clips")


class DataPacker:
    """Stands in for cosmos-rl's data packers, so that a script can subclass one and make it for its
    launcher call; the recipes never use it (they pack with the model's processor) and say so."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def setup(self, *args: Any, **kwargs: Any) -> None:
        pass


def _toml_load(source: Any) -> dict[str, Any]:
    """``toml.load``: a path or an open file (text or binary)."""
    if hasattr(source, "read"):
        text = source.read()
        return tomllib.loads(text.decode() if isinstance(text, bytes) else text)
    with open(source, "rb") as f:
        return tomllib.load(f)


def _toml_loads(text: str) -> dict[str, Any]:
    return tomllib.loads(text)


def _toml_dumps(data: dict[str, Any]) -> str:
    from cosmos_primitives.config.toml_io import dumps_toml

    return dumps_toml(data)


def _toml_dump(data: dict[str, Any], file: Any) -> str:
    """``toml.dump``: write to an open text file; returns the text."""
    text = _toml_dumps(data)
    file.write(text)
    return text


class _Lazy:
    """A module attribute computed when the module is made (keeps heavy imports out of this one)."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make


def _config_class() -> type:
    from cosmos_primitives.config.loader import config_from_dict
    from cosmos_primitives.config.root import Config as RootConfig

    class Config(RootConfig):
        """This library's config class, with cosmos-rl's ``Config.from_dict`` (what a script's
        ``__main__`` block builds its config with)."""

        @classmethod
        def from_dict(cls, tree: dict[str, Any]) -> RootConfig:
            return config_from_dict(tree, source="the dataset script's config")

    return Config


_PACKERS = {name: DataPacker for name in ("DataPacker", "BaseDataPacker")} | {
    name: type(name, (DataPacker,), {"__doc__": f"Stands in for cosmos-rl's {name} (see DataPacker)."})
    for name in ("Qwen2_5_VLM_DataPacker", "Qwen3_VL_DataPacker", "DecoderOnlyLLMDataPacker", "HFVLMDataPacker")}


# module name -> (is a package, its attributes)
_MODULES: dict[str, tuple[bool, dict[str, Any]]] = {
    "cosmos_rl": (True, {}),
    "cosmos_rl.policy": (True, {}),
    "cosmos_rl.policy.config": (False, {"Config": _Lazy(_config_class)}),
    "cosmos_rl.utils": (True, {}),
    "cosmos_rl.utils.util": (False, {"basename_from_modelpath": basename_from_modelpath,
                                     "prepare_cosmos_data": prepare_cosmos_data}),
    "cosmos_rl.utils.logging": (False, {"logger": logging.getLogger("cosmos")}),
    "cosmos_rl.launcher": (True, {}),
    "cosmos_rl.launcher.worker_entry": (False, {"main": launch_worker}),
    "cosmos_rl.dispatcher": (True, {}),
    "cosmos_rl.dispatcher.data": (True, {}),
    "cosmos_rl.dispatcher.data.packer": (True, _PACKERS),
    "cosmos_rl.dispatcher.data.packer.base": (False, {"DataPacker": DataPacker, "BaseDataPacker": DataPacker}),
    "toml": (False, {"load": _toml_load, "loads": _toml_loads, "dump": _toml_dump, "dumps": _toml_dumps,
                     "TomlDecodeError": tomllib.TOMLDecodeError}),
}


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves :data:`_MODULES` when the finders before it found nothing."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        root = fullname.partition(".")[0]
        if root not in ("cosmos_rl", "toml"):
            return None
        parent = sys.modules.get(root)
        if "." in fullname and not getattr(parent, STAND_IN, False):
            return None  # a real cosmos_rl is loaded: its own finders answer for its modules
        if fullname not in _MODULES:
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: cosmos-rl is not installed here (it cannot share an environment "
                f"with cosmos_primitives), and its stand-ins (cosmos_primitives.data.cosmos_rl_shim) cover only "
                f"{sorted(m for m in _MODULES if m.startswith('cosmos_rl'))}. Import what your dataset class "
                "needs at module level only; for rewards pass --reward (cosmos-rl's single_choice / format are "
                "the built-in 'single_choice' / 'format')", name=fullname)
        is_package, _ = _MODULES[fullname]
        return importlib.machinery.ModuleSpec(fullname, self, is_package=is_package)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None  # the default module object

    def exec_module(self, module: types.ModuleType) -> None:
        _, attributes = _MODULES[module.__name__]
        for name, value in attributes.items():
            setattr(module, name, value.make() if isinstance(value, _Lazy) else value)
        setattr(module, STAND_IN, True)


_FINDER = _StandInFinder()


def install() -> None:
    """Put the stand-ins' import hook last in ``sys.meta_path`` (once; later calls do nothing)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)


def is_stand_in(module: types.ModuleType) -> bool:
    """Whether ``module`` is one of these stand-ins (not the real cosmos-rl / toml)."""
    return bool(getattr(module, STAND_IN, False))


def real_cosmos_rl_installed() -> bool:
    """Whether ``import cosmos_rl`` gives cosmos-rl itself rather than these stand-ins."""
    module = sys.modules.get("cosmos_rl")
    if module is not None:
        return not is_stand_in(module)
    spec = importlib.util.find_spec("cosmos_rl")
    return spec is not None and spec.loader is not _FINDER
