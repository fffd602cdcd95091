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
    "eval.max_tokens": 77,
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


def _section_lines(text: str, section: str) -> list[str]:
    """The lines of docs/api.md about ``[section]``: its table row(s) and what stands under a heading naming it."""
    out, under = [], False
    for line in text.splitlines():
        if line.startswith("#"):
            under = f"`[{section}]`" in line
        elif under or line.startswith(f"| `[{section}]`"):
            out.append(line)
    return out


def test_api_doc_names_old_keys_only_in_its_older_names_table() -> None:
    section, rest = _older_names_section(API.read_text())
    for old, (new, _) in RENAMED.items():
        assert f"`{old}`" in section and f"`{new}`" in section, f"docs/api.md's older names lack {old} -> {new}"
        table, leaf = old.rsplit(".", 1)
        spelled = rf"\b{re.escape(old)}\b|\[{re.escape(table)}\] `?{re.escape(leaf)}\b"
        stray = [line[:160] for line in rest.splitlines() if re.search(spelled, line)]
        stray += [line[:160] for line in _section_lines(rest, table) if f"`{leaf}`" in line]
        assert not stray, f"docs/api.md names the old key {old} outside its older-names table: {stray[:2]}"


# Python keywords / attributes renamed to the one name of their quantity: (callable, old keyword, new keyword)
def _sampling(**kwargs: Any) -> Any:
    from cosmos_primitives.data import SamplingParams

    return SamplingParams(temperature=0.5, **kwargs)


def _from_config(**kwargs: Any) -> Any:
    from cosmos_primitives.data import SamplingParams

    return SamplingParams.from_config(load_config(None, ["rollout.max_response_length=7"]).rollout, seed=1, **kwargs)


def _byte_limit(**kwargs: Any) -> Any:
    from cosmos_primitives.queue.record import record_byte_limit

    return record_byte_limit(64, **kwargs)


OLD_KEYWORDS = [
    (_sampling, "n", "num_samples_per_prompt", 3),
    (_sampling, "max_new_tokens", "max_response_length", 9),
    (_from_config, "n", "num_samples_per_prompt", 3),
    (_byte_limit, "num_completions", "num_samples_per_prompt", 3),
]


@pytest.mark.parametrize(("build", "old", "new", "value"), OLD_KEYWORDS,
                         ids=[f"{b.__name__}-{o}" for b, o, _, _ in OLD_KEYWORDS])
def test_old_keyword_warns_and_means_the_new_one(build: Any, old: str, new: str, value: int) -> None:
    with pytest.warns(FutureWarning, match=rf"\({old}=\.\.\.\) is now {new}=\.\.\."):
        from_old = build(**{old: value})
    assert from_old == build(**{new: value})
    with pytest.raises(TypeError, match=rf"{new}={value + 1} and {old}={value} differ"):
        build(**{old: value, new: value + 1})


def test_sampling_params_has_the_canonical_fields_and_warned_old_attributes() -> None:
    import attrs

    from cosmos_primitives.data import SamplingParams

    params = SamplingParams(num_samples_per_prompt=4, max_response_length=6)
    fields = [f.name for f in attrs.fields(SamplingParams)]
    assert "num_samples_per_prompt" in fields and "max_response_length" in fields
    assert "n" not in fields and "max_new_tokens" not in fields
    with pytest.warns(FutureWarning, match=r"SamplingParams\.n is now SamplingParams\.num_samples_per_prompt"):
        assert params.n == 4
    with pytest.warns(FutureWarning, match=r"SamplingParams\.max_new_tokens is now .*\.max_response_length"):
        assert params.max_new_tokens == 6
    assert attrs.evolve(params, num_samples_per_prompt=1).num_samples_per_prompt == 1


def test_sampling_params_from_config_takes_the_rollout_response_length() -> None:
    from cosmos_primitives.data import SamplingParams

    cfg = load_config(None, ["rollout.max_response_length=7", "grpo.num_samples_per_prompt=5"])
    params = SamplingParams.from_config(cfg.rollout, cfg.grpo.num_samples_per_prompt)
    assert (params.num_samples_per_prompt, params.max_response_length) == (5, 7)


def test_run_checks_old_keyword_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    from cosmos_primitives.rollout import check

    seen = {}

    def first_check(*args: Any, max_response_length: int, **kwargs: Any) -> list[Any]:
        seen["max_response_length"] = max_response_length
        raise StopIteration  # the keyword arrived; no engine needed beyond this

    monkeypatch.setattr(check, "check_logprobs", first_check)
    with pytest.warns(FutureWarning, match=r"run_checks\(max_new_tokens=\.\.\.\)"), pytest.raises(StopIteration):
        check.run_checks(None, None, None, max_new_tokens=5)
    assert seen == {"max_response_length": 5}


def test_api_doc_names_old_keywords_only_in_its_older_names_table() -> None:
    section, rest = _older_names_section(API.read_text())
    for pattern in (r"\bmax_new_tokens\b", r"SamplingParams\(n=", r"\bnum_completions=", r"\bn=\.\.\."):
        assert re.search(pattern, section), f"docs/api.md's older names lack {pattern}"
        stray = [line[:120] for line in rest.splitlines() if re.search(pattern, line)]
        assert not stray, f"docs/api.md spells the old keyword {pattern} outside its older-names table: {stray[:2]}"


def test_cosmos_rl_files_load_without_a_renamed_key_warning() -> None:
    """cosmos-rl's own keys (``rollout.n_generation``, ``rollout.max_response_length``, its world-model batch
    sizes) are read by its rule list, never as one of this library's older names."""
    import warnings

    paths = sorted((ROOT / "tests" / "data" / "cosmos_rl_configs").rglob("*.toml"))
    assert len(paths) > 20
    for path in paths:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            load_config(path)
        renamed = [str(w.message) for w in caught
                   if issubclass(w.category, FutureWarning) and "deprecated" in str(w.message)]
        assert not renamed, f"{path.name}: {renamed}"
