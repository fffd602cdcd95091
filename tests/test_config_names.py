"""One name per quantity (issue 33 item 5): each older name of a renamed config key still loads, with a
``FutureWarning`` naming the key to write, and means what the canonical key means; the example
configs and ``docs/api.md`` spell only the canonical names (``docs/api.md`` lists the old ones once,
in its table of older names)."""

from __future__ import annotations

import re
from functools import reduce
from pathlib import Path
from typing import Any

import pytest
import tomllib

from cosmos_primitives.config import ConfigError, config_from_dict, load_config
from cosmos_primitives.config.aliases import RENAMED

ROOT = Path(__file__).parents[1]
API = ROOT / "docs" / "api.md"

# a value of each old key that differs from the canonical key's default, so that the test sees it arrive
OLD_KEY_VALUES: dict[str, Any] = {
    "wfm.data.prompts_per_step": 3,
}


def nested(path: str, value: Any) -> dict[str, Any]:
    return reduce(lambda inner, part: {part: inner}, reversed(path.split(".")), value)


def attribute(config: Any, path: str) -> Any:
    return reduce(getattr, path.split("."), config)


def test_every_renamed_key_has_a_test_value() -> None:
    assert set(OLD_KEY_VALUES) == set(RENAMED)


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_old_key_loads_warns_and_means_the_canonical_one(old: str) -> None:
    new, value = RENAMED[old][0], OLD_KEY_VALUES[old]
    assert attribute(config_from_dict({}), new) != value
    with pytest.warns(FutureWarning, match=rf"'{re.escape(old)}' is deprecated; write '{re.escape(new)}'"):
        from_old = config_from_dict(nested(old, value), "old.toml")
    assert attribute(from_old, new) == value
    assert from_old == config_from_dict(nested(new, value))
    with pytest.warns(FutureWarning, match=rf"'{re.escape(old)}' is deprecated; write '{re.escape(new)}'"):
        overridden = load_config(None, [f"{old}={value}"])
    assert attribute(overridden, new) == value


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_old_key_beside_the_canonical_one_with_another_value_is_refused(old: str) -> None:
    new, value = RENAMED[old][0], OLD_KEY_VALUES[old]
    both = _merge(nested(old, value), nested(new, value + 1))
    with pytest.warns(FutureWarning), pytest.raises(ConfigError, match=rf"keep only '{re.escape(new)}'"):
        config_from_dict(both)


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for key, value in b.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _keys(tree: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, value in tree.items():
        path = f"{prefix}{key}"
        out += _keys(value, path + ".") if isinstance(value, dict) else [path]
    return out


@pytest.mark.parametrize("path", sorted((ROOT / "examples" / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_example_configs_spell_only_canonical_names(path: Path) -> None:
    keys = _keys(tomllib.loads(path.read_text()))
    old = [k for k in keys if any(k == o or k.startswith(o + ".") for o in RENAMED)]
    assert not old, f"{path.name} spells renamed keys {old}; write {[RENAMED[k][0] for k in old]}"


def _older_names_section(text: str) -> tuple[str, str]:
    """``(the "Older names" section of docs/api.md, the rest)``."""
    match = re.search(r"^### Older names\n(.*?)(?=^#)", text, re.S | re.M)
    assert match, "docs/api.md has no '### Older names' section"
    return match.group(1), text[:match.start()] + text[match.end():]


def test_api_doc_names_old_keys_only_in_its_older_names_table() -> None:
    section, rest = _older_names_section(API.read_text())
    for old, (new, _) in RENAMED.items():
        assert f"`{old}`" in section and f"`{new}`" in section, f"docs/api.md's older names lack {old} -> {new}"
        leaf = old.rsplit(".", 1)[1]
        stray = [line for line in rest.splitlines() if re.search(rf"\b{re.escape(leaf)}\b", line)]
        assert not stray, f"docs/api.md names the old key {old} outside its older-names table: {stray[:2]}"
