"""``load_config``: TOML file + dotted overrides -> typed :class:`Config`, with clear errors."""

from __future__ import annotations

import difflib
import functools
import math
import os
import re
import types
import typing
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from cosmos_primitives.config.aliases import ALIASES, DEPRECATED, DEPRECATED_DEFAULTS, WFM_POLICY_DEPRECATED
from cosmos_primitives.config.compat import cosmos_rl, cosmos_rl_wfm, pre_pass
from cosmos_primitives.config.errors import ConfigError
from cosmos_primitives.config.eval_yaml import SECTIONS as EVAL_SECTIONS
from cosmos_primitives.config.eval_yaml import eval_tree, is_eval_yaml, read_yaml
from cosmos_primitives.config.grpo import reward_function_as_dict
from cosmos_primitives.config.root import Config
from cosmos_primitives.config.secrets import redact_secrets
from cosmos_primitives.config.toml_io import dumps_toml, parse_toml_value, read_toml

_MSGSPEC_ERROR = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)


def _lora_unless_disabled(value: Any) -> Any:
    """``[policy.lora] enabled = false`` is the same as no ``[policy.lora]``."""
    if isinstance(value, dict) and value.get("enabled") is False:
        return None
    return value


def _splits_as_one(value: Any) -> Any:
    """cosmos-rl's list of splits is their concatenation, which ``datasets`` spells ``"a+b"``."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "+".join(v for v in value if v)
    return value


def _no_decay_as_constant(value: Any) -> Any:
    """cosmos-rl spells a schedule without decay ``"none"``."""
    return "constant" if value == "none" else value


# canonical dotted path -> normaliser applied to whatever value the user wrote there
VALUE_NORMALISERS = {
    "train.optm_decay_type": _no_decay_as_constant,
    "train.train_policy.dataset.split": _splits_as_one,
    "validation.dataset.split": _splits_as_one,
    "grpo.reward_function": reward_function_as_dict,
    "validation.reward_function": reward_function_as_dict,
    "policy.lora": _lora_unless_disabled,
}


def _get(tree: dict[str, Any], path: str) -> Any:
    node: Any = tree
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(path)
        node = node[part]
    return node


def _set(tree: dict[str, Any], path: str, value: Any, source: str) -> None:
    parts = path.split(".")
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            where = ".".join(parts[: i + 1])
            raise ConfigError(f"{source}: '{where}' is a value, not a table, so '{path}' cannot be set")
        node = child
    node[parts[-1]] = value


def _pop(tree: dict[str, Any], path: str) -> Any:
    parts = path.split(".")
    node = _get(tree, ".".join(parts[:-1])) if len(parts) > 1 else tree
    value = node.pop(parts[-1])
    # drop tables the alias left empty, e.g. a [train.train_policy] holding only GRPO knobs
    for depth in range(len(parts) - 1, 0, -1):
        parent = _get(tree, ".".join(parts[: depth - 1])) if depth > 1 else tree
        if parent.get(parts[depth - 1]) == {}:
            del parent[parts[depth - 1]]
        else:
            break
    return value


def _alias_prefix(path: str) -> str | None:
    """The alias ``path`` is, or the aliased table it lies in (``wfm.lora`` for ``wfm.lora.r``), or None."""
    parts = path.split(".")
    return next((p for p in (".".join(parts[:i]) for i in range(len(parts), 0, -1)) if p in ALIASES), None)


def canonical_key(path: str) -> str:
    """The canonical dotted path of ``path`` (itself when it is no alias); a key inside an aliased
    table maps into the canonical table (``wfm.lora.r`` -> ``policy.lora.r``)."""
    alias = _alias_prefix(path)
    return path if alias is None else ALIASES[alias][0] + path[len(alias):]


def _warn_deprecated(alias: str, source: str, stacklevel: int) -> None:
    warnings.warn(f"{source}: '{alias}' is deprecated; write '{DEPRECATED[alias][0]}' instead (read as it for now)",
                  FutureWarning, stacklevel=stacklevel + 1)


def _apply_deprecated(tree: dict[str, Any], source: str) -> None:
    """Warn about each :data:`DEPRECATED` key in ``tree``; when one of the old ``[wfm]`` policy keys
    is there, give the canonical keys the file sets in neither spelling their old defaults
    (:data:`DEPRECATED_DEFAULTS`)."""
    present = [alias for alias in DEPRECATED if _has(tree, alias)]
    for alias in present:
        _warn_deprecated(alias, source, stacklevel=4)  # the caller of load_config / config_from_dict
    present = [alias for alias in present if alias in WFM_POLICY_DEPRECATED]
    if not present:
        return
    spelled_old = {DEPRECATED[alias][0] for alias in present}
    filled = {k: v for k, v in DEPRECATED_DEFAULTS.items() if k not in spelled_old and not _has(tree, k)}
    for key, value in filled.items():
        _set(tree, key, _deepcopy(value), source)
    if filled:
        warnings.warn(f"{source} uses deprecated spellings ({', '.join(present)}), so the keys it sets in neither "
                      f"spelling keep their old defaults: {', '.join(f'{k} = {v!r}' for k, v in filled.items())}",
                      FutureWarning, stacklevel=4)


def _has(tree: dict[str, Any], path: str) -> bool:
    try:
        _get(tree, path)
    except KeyError:
        return False
    return True


def _apply_aliases(tree: dict[str, Any], source: str) -> list[str]:
    """Move every alias onto its canonical key; returns the conflicts (alias and canonical key given
    different values), one line each."""
    problems = []
    for alias, (canonical, transform) in ALIASES.items():
        try:
            value = _get(tree, alias)
        except KeyError:
            continue
        _pop(tree, alias)
        if transform is not None:
            value = transform(value)
        try:
            existing = _get(tree, canonical)
        except KeyError:
            _set(tree, canonical, value, source)
            continue
        if existing != value:
            problems.append(f"{source}: '{alias}' = {value!r} and '{canonical}' = {existing!r} are the same "
                            f"setting with different values; keep only '{canonical}'")
    return problems


def _apply_normalisers(tree: dict[str, Any]) -> None:
    for path, fn in VALUE_NORMALISERS.items():
        try:
            value = _get(tree, path)
        except KeyError:
            continue
        _set(tree, path, fn(value), "")


def _is_struct(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, msgspec.Struct)


def _struct_of(tp: Any) -> type[msgspec.Struct] | None:
    """The Struct type of a field typed ``X`` or ``X | None``, or None."""
    if _is_struct(tp):
        return tp
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return next((arg for arg in typing.get_args(tp) if _is_struct(arg)), None)
    return None


def _struct_values_of(tp: Any) -> type[msgspec.Struct] | None:
    """The Struct type ``X`` of a field typed ``dict[str, X]`` (a table of tables), or None."""
    if typing.get_origin(tp) is dict:
        args = typing.get_args(tp)
        if len(args) == 2 and _is_struct(args[1]):
            return args[1]
    return None


def _known_keys(struct: type[msgspec.Struct], prefix: str) -> Iterable[str]:
    hints = _type_hints(struct)
    for field in _struct_fields(struct):
        path = f"{prefix}{field.encode_name}"
        yield path
        sub = _struct_of(hints[field.name])
        if sub is not None:
            yield from _known_keys(sub, path + ".")


def _suggestion(path: str, prefix: str, fields: Iterable[str]) -> str:
    """`` did you mean ...`` for an unknown key: a sibling (or an alias of one) whose name is close,
    else any key or alias close to the whole path, else the valid keys of the table."""
    siblings = [f"{prefix}{name}" for name in fields]
    aliases_here = [a for a in (*ALIASES, *cosmos_rl.RULES) if a.startswith(prefix) and "." not in a[len(prefix):]]
    close = difflib.get_close_matches(path, siblings + aliases_here, n=1, cutoff=0.75)
    if not close:
        everything = sorted(_own_keys()[0]) + list(ALIASES)
        close = difflib.get_close_matches(path, everything, n=1, cutoff=0.8)
    if close and close[0] not in ALIASES and close[0] not in siblings:  # a cosmos-rl key read otherwise here
        rule = cosmos_rl.RULES[close[0]]
        return f"; did you mean '{close[0]}' (cosmos-rl's key, {rule.how} here: {rule.note})?"
    if close:
        target = canonical_key(close[0])
        return f"; did you mean '{close[0]}'" + (f" (= '{target}')" if target != close[0] else "") + "?"
    return f"; valid keys here: {', '.join(siblings)}"


def _mentions_float(tp: Any) -> bool:
    """True when a value of type ``tp`` (or of a struct field inside it) may be a float."""
    if tp is float:
        return True
    if _is_struct(tp):
        return any(_mentions_float(t) for t in _type_hints(tp).values())
    return any(_mentions_float(a) for a in typing.get_args(tp) if not isinstance(a, msgspec.Meta))


def _non_finite(value: Any, path: str) -> list[tuple[str, float]]:
    """``(key, number)`` for each NaN / inf in ``value`` (a number, or lists / tables of them)."""
    if isinstance(value, float) and not math.isfinite(value):
        return [(path, value)]
    if isinstance(value, (list, tuple)):
        return [found for i, v in enumerate(value) for found in _non_finite(v, f"{path}.{i}")]
    if isinstance(value, dict):
        return [found for k, v in value.items() for found in _non_finite(v, f"{path}.{k}")]
    return []


# a one-sided clip is written with inf (NaN never)
_INFINITY_ALLOWED = re.compile(r"^remote_reward\.rewards\.\d+\.clip\.[01]$")


def _field_problems(value: Any, tp: Any, path: str, source: str) -> list[str]:
    """The type / range error of one value (``[]`` when it converts to ``tp``)."""
    if _mentions_float(tp):
        bad = [(key, v) for key, v in _non_finite(value, path)
               if math.isnan(v) or not _INFINITY_ALLOWED.match(canonical_key(key))]
        if bad:
            return [f"{source}: key '{key}' must be a finite number (got {v}); NaN and inf are never valid here"
                    for key, v in bad]
    try:
        msgspec.convert(value, tp)
    except msgspec.ValidationError as exc:
        match = _MSGSPEC_ERROR.match(str(exc))
        inner = re.sub(r"\[(\d+)\]", r".\1", (match.group("path") or "") if match else "")
        key = f"{path}{inner}" if inner.startswith(".") or not inner else f"{path}.{inner}"
        sub_tp = _field_type(key) if inner else tp
        if sub_tp is not None:
            return [f"{source}: key '{key}' expects {_describe_type(sub_tp)} (got {_value_at(value, inner)!r})"]
        what = match.group("what") if match else str(exc)
        return [f"{source}: key '{key}': {what}"]
    return []


def _value_at(value: Any, inner: str) -> Any:
    try:
        return _get(value, inner.lstrip(".")) if inner else value
    except (KeyError, TypeError):
        return value


def _problems(tree: dict[str, Any], struct: type[msgspec.Struct], prefix: str, source: str) -> list[str]:
    """Every unknown key, wrong type and out-of-range value of ``tree`` read as ``struct``, one line each."""
    hints = _type_hints(struct)
    fields = {f.encode_name: f for f in _struct_fields(struct)}
    found: list[str] = []
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if key not in fields:
            found.append(f"{source}: unknown key '{path}'{_suggestion(path, prefix, fields)}")
            continue
        field_type = hints[fields[key].name]
        sub = _struct_of(field_type)
        item = _struct_values_of(field_type)
        if sub is not None and isinstance(value, dict):
            found += _problems(value, sub, path + ".", source)
        elif item is not None and isinstance(value, dict):
            for name, entry in value.items():
                if isinstance(entry, dict):
                    found += _problems(entry, item, f"{path}.{name}.", source)
                else:
                    found += _field_problems(entry, item, f"{path}.{name}", source)
        else:
            found += _field_problems(value, field_type, path, source)
    return found


def _raise_problems(problems: list[str], source: str) -> None:
    if len(problems) == 1:
        raise ConfigError(problems[0], problems)
    if problems:
        raise ConfigError(f"{len(problems)} problems in {source}:\n" + "\n".join(f"  - {p}" for p in problems),
                          problems)


def _check_unknown(tree: dict[str, Any], struct: type[msgspec.Struct], prefix: str, source: str) -> None:
    """Raise a :class:`ConfigError` listing every problem :func:`_problems` finds."""
    _raise_problems(_problems(tree, struct, prefix, source), source)


@functools.cache
def _struct_fields(struct: type[msgspec.Struct]) -> tuple[msgspec.structs.FieldInfo, ...]:
    """``msgspec.structs.fields(struct)``, once per struct (it evaluates the annotations each call)."""
    return msgspec.structs.fields(struct)


@functools.cache
def _type_hints(struct: type) -> dict[str, Any]:
    """``typing.get_type_hints(struct, include_extras=True)``, evaluated once per struct: the
    annotations are strings (``from __future__ import annotations``) and evaluating them for each of
    the ~360 keys, with the fields below, cost 0.3 CPU-s per process that loads a config."""
    return typing.get_type_hints(struct, include_extras=True)


def _field_type(path: str) -> Any:
    """Annotated type of the config field at dotted ``path`` (None when not a struct field)."""
    tp: Any = Config
    for part in path.split("."):
        item = _struct_values_of(tp)
        if item is not None:  # ``part`` names an entry of a table of tables
            tp = item
            continue
        if part.isdigit() and typing.get_origin(tp) is list:  # an item of a list
            tp = typing.get_args(tp)[0]
            continue
        struct = _struct_of(tp)
        if struct is None:
            return None
        hints = _type_hints(struct)
        names = {f.encode_name: f.name for f in _struct_fields(struct)}
        if part not in names:
            return None
        tp = hints[names[part]]
    return tp


def _describe_type(tp: Any) -> str:
    if typing.get_origin(tp) is typing.Annotated:
        base, *metas = typing.get_args(tp)
        bounds = [f"{op} {getattr(m, name)}" for m in metas if isinstance(m, msgspec.Meta)
                  for name, op in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))
                  if getattr(m, name) is not None]
        return _describe_type(base) + (" " + " and ".join(bounds) if bounds else "")
    if typing.get_origin(tp) is typing.Literal:
        return "one of " + ", ".join(repr(v) for v in typing.get_args(tp))
    args = typing.get_args(tp)
    if args and typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_describe_type(a) for a in args)
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _explain_validation_error(exc: msgspec.ValidationError, tree: dict[str, Any], source: str) -> ConfigError:
    match = _MSGSPEC_ERROR.match(str(exc))
    what, raw_path = (match.group("what"), match.group("path") or "") if match else (str(exc), "")
    if not re.match(r"(Expected|Object|Invalid)\b", what):  # a section's own check (__post_init__) names its keys
        return ConfigError(f"{source}: {what}")
    key = re.sub(r"\[(\d+)\]", r".\1", raw_path).lstrip(".")
    try:
        got = f" (got {_get(tree, key)!r})"
    except (KeyError, TypeError):
        got = ""
    tp = _field_type(key)
    if tp is not None:
        return ConfigError(f"{source}: key '{key}' expects {_describe_type(tp)}{got}")
    expected = re.search(r"Expected `([^`]*)`", what)
    if expected:
        return ConfigError(f"{source}: key '{key}' expects {expected.group(1)}{got}")
    return ConfigError(f"{source}: key '{key}': {what}{got}")


@functools.cache
def _own_keys() -> tuple[frozenset[str], frozenset[str]]:
    """(every dotted key of :class:`Config`, those that are tables of fixed keys)."""
    keys = frozenset(_known_keys(Config, ""))
    return keys, frozenset(k for k in keys if _struct_of(_field_type(k)) is not None)


def _is_own_key(path: str) -> bool:
    """Whether ``path`` is a key of this library's config (not an alias) or lies in a free-form table."""
    keys, tables = _own_keys()
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in keys:
            return i == len(parts) or prefix not in tables
    return False


def _unknown_key_hint(path: str) -> str:
    prefix = path.rpartition(".")[0]
    table = _struct_of(_field_type(prefix)) if prefix else Config
    fields = [f.encode_name for f in _struct_fields(table)] if table is not None else []
    hint = _suggestion(path, f"{prefix}." if prefix else "", fields)
    return hint if hint.startswith("; did you mean") else ""


_OUR_KEYS = pre_pass.OurKeys(_is_own_key, lambda path: _alias_prefix(path) is not None, _unknown_key_hint)


def _read_cosmos_rl(tree: dict[str, Any], marker: cosmos_rl.Style | None = None) -> tuple[pre_pass.Reading | None, str]:
    """The pre-pass's first stage (:func:`~cosmos_primitives.config.compat.pre_pass.read`) with this
    library's keys: ``(reading or None, why)``."""
    return pre_pass.read(tree, marker, _OUR_KEYS)


def _finish_cosmos_rl(tree: dict[str, Any], reading: pre_pass.Reading | None, explicit: set[str], source: str) -> None:
    """The pre-pass's second stage (cosmos-rl meanings and defaults, refused keys into ``[unsupported]``)
    and the reading's one warning."""
    pre_pass.finish(tree, reading, explicit)
    if reading is not None:
        warnings.warn(reading.warning(source), UserWarning, stacklevel=5)


def _read_file(path: Path, source: str) -> dict[str, Any]:
    """A TOML config, or a YAML one (the Cosmos-Reason1 evaluation layout, ``config/eval_yaml.py``)."""
    if path.suffix.lower() not in (".yaml", ".yml"):
        return read_toml(path)
    tree = read_yaml(path)
    if not is_eval_yaml(tree):
        raise ConfigError(f"{source}: a YAML config is read in the Cosmos-Reason1 evaluation layout (top-level "
                          f"keys {', '.join(EVAL_SECTIONS)}), got keys {sorted(tree)}; write other configs in TOML")
    tree, ignored = eval_tree(tree, source)
    if ignored:
        warnings.warn(f"{source}: ignored (no effect here): " + "; ".join(f"{k} ({why})" for k, why in ignored),
                      UserWarning, stacklevel=4)
    return tree


def read_cosmos_rl_file(path: str | os.PathLike[str]
                        ) -> tuple[list[tuple[str, str, Any]],
                                   pre_pass.Reading | None, str]:
    """How a file is read, without building the config (``python -m cosmos_primitives.migrate``).

    Returns:
        ``(mapped, reading, why)``: ``mapped`` lists ``(key in the file, our key, value)`` for every
        key read as one of ours (after aliases); ``reading`` the ignored / refused keys, the cosmos-rl
        defaults given and the meanings translated, None for a file read as this library's own, a
        :class:`cosmos_rl_wfm.WorldModelReading` for a cosmos-rl world-model file (its ``mapped``
        is the one returned); ``why`` the reason it is read so (:func:`cosmos_rl.file_style`, or
        ``WorldModelReading.style_reason``).
    """
    tree = read_toml(path)
    marker = pre_pass.pop_style(tree, str(path))
    reading, why = _read_cosmos_rl(tree, marker)
    if isinstance(reading, cosmos_rl_wfm.WorldModelReading):
        reading.finish(tree, set())
        return reading.mapped, reading, why
    mapped = [(key, canonical_key(key), value) for key, value in cosmos_rl.leaves(tree)]
    _apply_aliases(tree, str(path))
    if reading is not None:
        cosmos_rl.apply_cosmos_rl_meanings(tree, reading, set())
    return mapped, reading, why


def config_from_dict(tree: dict[str, Any], source: str = "<dict>") -> Config:
    """Validate a nested dict (aliases allowed) into a :class:`Config`, read as a file is
    (:func:`load_config`): cosmos-rl's meanings and defaults when it is a cosmos-rl tree.

    Raises:
        ConfigError: listing every problem at once (unknown keys, wrong types, values out of range,
            conflicting spellings), one line each naming the key and ``source``.
    """
    return _read(tree, source, ())


def _read(tree: dict[str, Any], source: str, overrides: Sequence[str]) -> Config:
    """The one pass from a parsed file to a :class:`Config`: style marker and deprecated spellings,
    the cosmos-rl pre-pass (keys taken out, aliases onto our keys), the overrides, cosmos-rl's
    meanings and defaults for keys neither sets, value normalisers, then one validation."""
    tree = _deepcopy(tree)
    marker = pre_pass.pop_style(tree, source)
    _apply_deprecated(tree, source)
    reading, _ = _read_cosmos_rl(tree, marker)
    problems = _apply_aliases(tree, source)
    explicit = _apply_overrides(tree, overrides, problems)
    _finish_cosmos_rl(tree, reading, explicit, source)
    _apply_normalisers(tree)
    return _validated(tree, problems, source, source if not overrides else f"{source} with overrides {list(overrides)}")


def _apply_overrides(tree: dict[str, Any], overrides: Sequence[str], problems: list[str]) -> set[str]:
    """Set each ``key=value`` override (aliases allowed) on its canonical key; an override whose value
    is invalid is not set and its problem, naming the override, goes to ``problems``. Returns the
    canonical keys set (taken as they are: no cosmos-rl default or meaning replaces them)."""
    explicit: set[str] = set()
    for text in overrides:
        key, value = parse_override(text)
        alias = _alias_prefix(key)
        if alias in DEPRECATED:
            _warn_deprecated(alias, f"override {text!r}", stacklevel=4)  # the caller of load_config
        if alias == key and ALIASES[alias][1] is not None:
            value = ALIASES[alias][1](value)
        canonical = canonical_key(key)
        single: dict[str, Any] = {}
        _set(single, canonical, value, f"override {text!r}")
        normaliser = VALUE_NORMALISERS.get(canonical)
        if normaliser is not None:
            _set(single, canonical, normaliser(value), "")
        found = _problems(single, Config, "", f"override {text!r}")
        if found:
            problems += found
        else:
            _set(tree, canonical, value, f"override {text!r}")
            explicit.add(canonical)
    return explicit


def _validated(tree: dict[str, Any], problems: list[str], source: str, label: str | None = None) -> Config:
    """The :class:`Config` of a tree already read (aliases, cosmos-rl meanings, normalisers applied):
    every problem at once, else the section checks (``__post_init__``) named by ``label``."""
    _raise_problems(problems + _problems(tree, Config, "", source), source)
    try:
        return msgspec.convert(tree, Config)
    except msgspec.ValidationError as exc:
        raise _explain_validation_error(exc, tree, label or source) from None


def _deepcopy(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _deepcopy(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_deepcopy(v) for v in tree]
    return tree


def parse_override(text: str) -> tuple[str, Any]:
    """``"train.epoch=2"`` -> ``("train.epoch", 2)``; the value is parsed as TOML when it can be."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"override {text!r} is not of the form key.path=value")
    return key, parse_toml_value(value.strip())


def load_config(path: str | os.PathLike[str] | None = None, overrides: Sequence[str] = ()) -> Config:
    """Load a TOML config file and apply dotted overrides.

    How the file is read is decided once, from the file alone: a cosmos-rl world-model file
    (``configs/cosmos-predict2-5/``, :mod:`~cosmos_primitives.config.compat.cosmos_rl_wfm`) is translated
    onto our keys whole unless marked ``config_style = "cosmos_primitives"``; any other file as
    :func:`cosmos_rl.file_style` decides (its ``config_style`` marker, else its keys as a whole). A
    cosmos-rl file gets cosmos-rl's meanings and its defaults for the keys it leaves unset, and one
    warning saying so. Overrides are taken as they are, in this library's meaning. Nothing depends on
    the machine: ``rollout.backend = "auto"`` (its default) is resolved where the engine is built.

    Args:
        path: TOML file, or None for all defaults.
        overrides: ``["train.epoch=2", "grpo.kl_beta=0.01", ...]``; aliases allowed; values are TOML.

    Raises:
        ConfigError: unknown key (with the closest valid key), wrong type (with the expected type),
            an alias and its canonical key given different values, or a malformed override.
    """
    source = str(path) if path is not None else "<defaults>"
    tree = _read_file(Path(path), source) if path is not None else {}
    return _read(tree, source, overrides)


def config_to_dict(config: Config) -> dict[str, Any]:
    """Plain nested dict of a config (the resolved values, canonical keys)."""
    return msgspec.to_builtins(config)


def dump_config(config: Config, path: str | os.PathLike[str]) -> Path:
    """Write the resolved config as TOML, secrets redacted (:func:`~cosmos_primitives.config.secrets.redact_secrets`),
    marked ``config_style = "cosmos_primitives"`` (every value is this library's meaning, whatever
    file it came from); :func:`load_config` on it gives back an equal config up to those ``***``
    values and keys left unset (``train.seed`` of a cosmos-rl file: None is not written, the recipes
    dump the seed they drew)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tree = {cosmos_rl.STYLE_KEY: "cosmos_primitives", **redact_secrets(config_to_dict(config))}
    tmp.write_text(dumps_toml(tree))
    os.replace(tmp, path)
    return path
