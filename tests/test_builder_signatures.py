"""Builders take their own typed section or explicit keyword arguments, never the root config.

torchtitan's rule (ARCHITECTURE.md, issue 33 item 3): a function or class exported by ``policy``,
``data``, ``algo``, ``rollout`` or ``sync`` must not take the root :class:`cosmos_primitives.Config`
(annotated so), nor a parameter named ``config`` / ``cfg`` typed ``Any`` (or untyped), which hides
which sections it reads. The exceptions below are deliberate, each with its reason; an exception
that no longer applies fails too, so the list only shrinks.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator

import cosmos_primitives as cp

PACKAGES = ("policy", "data", "algo", "rollout", "sync")

_SETUP = ("the run's config, handed unchanged to a cosmos-rl dataset's setup(config) (cosmos-rl's contract: "
          "the whole config); nothing here reads a section from it")
_HF = "a Hugging Face model config (transformers' PretrainedConfig), not this library's config"
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("policy.GRPOUpdateSettings.from_config", "cfg"): "the one place that maps a run's config onto grpo_update's "
                                                      "settings; grpo_update itself takes the settings",
    ("policy.is_vision_language", "config"): _HF,
    ("data.MRopeSpec.from_config", "config"): _HF,
    ("data.prompt_dataset", "setup_config"): _SETUP,
    ("data.build_sft_dataset", "setup_config"): _SETUP,
    ("data.build_sft_loader", "setup_config"): _SETUP,
    ("data.sft_plugin_dataset", "config"): _SETUP,
    ("data.load_plugin", "config"): _SETUP,
    ("data.make_plugin", "config"): _SETUP,
    ("data.call_setup", "config"): _SETUP,
    ("data.CosmosRLPromptDataset.__init__", "config"): _SETUP,
    ("data.CosmosRLConversationDataset.__init__", "config"): _SETUP,
    ("data.build_grpo_datasets", "setup_config"): _SETUP,
    ("data.build_sft_datasets", "setup_config"): _SETUP,
    ("data.check_plugins_read", "config"): "a config check across sections: which plug-in keys are set against "
                                           "which the recipe reads",
}


def _callables(package: str) -> Iterator[tuple[str, Callable]]:
    module = importlib.import_module(f"cosmos_primitives.{package}")
    # every name the package gives (its lazy exports too), not only the __all__ of the public surface
    for name in sorted(n for n in dir(module) if not n.startswith("_")):
        obj = getattr(module, name)
        if inspect.isfunction(obj):
            yield f"{package}.{name}", obj
        elif inspect.isclass(obj) and obj.__module__.startswith("cosmos_primitives."):
            if obj.__init__ is not object.__init__:
                yield f"{package}.{name}.__init__", obj.__init__
            for attr in dir(obj):
                value = inspect.getattr_static(obj, attr)
                if isinstance(value, (classmethod, staticmethod)):
                    value = value.__func__
                if not attr.startswith("_") and inspect.isfunction(value) and value.__module__.startswith(
                        "cosmos_primitives."):
                    yield f"{package}.{name}.{attr}", value


def _takes_root_config(annotation: object) -> bool:
    if annotation is cp.Config:
        return True
    if not isinstance(annotation, str):
        return False
    parts = {part.strip() for part in annotation.replace("Optional[", "").replace("]", "").split("|")}
    return bool(parts & {"Config", "cp.Config", "cosmos_primitives.Config", "cosmos_primitives.config.Config",
                         "cosmos_primitives.config.root.Config"})


def _hides_its_sections(name: str, annotation: object) -> bool:
    if name not in ("config", "cfg"):
        return False
    if annotation is inspect.Parameter.empty:
        return True
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", repr(annotation))
    return "Any" in {part.strip() for part in text.split("|")}


def offenders() -> dict[tuple[str, str], str]:
    found = {}
    for package in PACKAGES:
        for qualname, fn in _callables(package):
            for parameter in inspect.signature(fn).parameters.values():
                annotation = parameter.annotation
                if _takes_root_config(annotation) or _hides_its_sections(parameter.name, annotation):
                    found[(qualname, parameter.name)] = str(annotation)
    return found


def test_the_check_sees_a_root_config_and_an_untyped_config() -> None:
    def builder(cfg: cp.Config, config, other: int = 0) -> None: ...

    def fine(cfg: cp.config.GRPOConfig, model_config=None) -> None: ...

    found = [p.name for p in inspect.signature(builder).parameters.values()
             if _takes_root_config(p.annotation) or _hides_its_sections(p.name, p.annotation)]
    assert found == ["cfg", "config"]
    assert not any(_takes_root_config(p.annotation) or _hides_its_sections(p.name, p.annotation)
                   for p in inspect.signature(fine).parameters.values())
    assert _takes_root_config("Config | None") and not _takes_root_config("GRPOConfig | None")
    assert _hides_its_sections("config", "Any") and not _hides_its_sections("cfg", "DatasetConfig")


def test_no_exported_builder_takes_the_root_config_or_an_untyped_config() -> None:
    found = offenders()
    unexplained = {key: annotation for key, annotation in found.items() if key not in EXCEPTIONS}
    assert not unexplained, (
        "these exported functions take the root Config, or a config / cfg typed Any: take the sections they "
        f"read (or explicit keyword arguments) instead, or list the parameter in EXCEPTIONS with a reason: "
        f"{sorted(unexplained)}")
    stale = sorted(key for key in EXCEPTIONS if key not in found)
    assert not stale, f"these EXCEPTIONS no longer apply (the parameter is gone or typed): remove them: {stale}"
