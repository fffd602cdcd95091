"""The one typed cosmos-rl rule list (``config/compat/rules.py``) is the only source of the aliases,
the defaults a cosmos-rl file gets and the docs table."""

from __future__ import annotations

from pathlib import Path

from cosmos_primitives.config.aliases import ALIASES
from cosmos_primitives.config.compat import docs_table, rules
from cosmos_primitives.config.compat.rules import RULE_LIST, Rule, mapped

DOC = Path(__file__).resolve().parents[1] / "docs" / "from_cosmos_rl.md"


def test_every_rule_is_typed_and_mapped_rules_name_their_target() -> None:
    assert len(RULE_LIST) > 240 and all(isinstance(rule, Rule) for rule in RULE_LIST)
    for rule in RULE_LIST:
        assert (rule.target is not None) == (rule.how == "mapped"), rule.key
        assert not rule.fill or rule.how == "mapped", rule.key


def test_cosmos_rl_aliases_are_exactly_the_renaming_rules() -> None:
    renaming = {r.key: (r.target, r.transform) for r in RULE_LIST if r.how == "mapped" and r.target != r.key}
    assert {k: v for k, v in ALIASES.items() if k in rules.RULES} == renaming
    # no alias gives a cosmos-rl key a meaning the rule list does not state
    assert all(ALIASES[key] == value for key, value in renaming.items())


def test_cosmos_rl_defaults_are_the_fill_rules() -> None:
    fill = [r for r in RULE_LIST if r.fill]
    expected = {r.target: r.cosmos_rl_value() for r in fill if not r.target.startswith("policy.lora.")}
    assert expected == rules.COSMOS_RL_DEFAULTS and len(expected) >= 20
    assert rules.COSMOS_RL_LORA_DEFAULTS == {"r": 8, "lora_alpha": 8.0}
    assert rules.COSMOS_RL_DEFAULTS["grpo.reward_function"] == {"single_choice": 1.0}  # transform(default)
    assert rules.COSMOS_RL_DEFAULTS["grpo.old_logprobs"] == "recompute"  # use_rollout_logprobs_for_loss = false


def test_a_rule_renders_its_target_and_reason() -> None:
    assert mapped("a.b", 1).note == "="
    assert mapped("a.b", 1, "(why)").note == "= (why)"
    assert mapped("a.b", 1, "(why)", to="c.d").note == "c.d (why)"
    assert rules.RULES["train.epsilon"].note == "train.optm_eps (ours defaults to 1e-8)"


def test_the_docs_table_is_generated_from_the_rule_list(tmp_path: Path) -> None:
    text = DOC.read_text()
    start, end = docs_table.table_in(text)
    assert text[start:end] == rules.render_table()
    assert text[start:end].count("\n| `") == len(RULE_LIST)
    assert docs_table.main(["--doc", str(DOC)]) == 0
    # a stale table is caught and rewritten
    stale = tmp_path / "from_cosmos_rl.md"
    stale.write_text(text.replace("| `train.epsilon` | `1e-06` |", "| `train.epsilon` | `1e-05` |"))
    assert stale.read_text() != text
    assert docs_table.main(["--doc", str(stale)]) == 1
    assert docs_table.main(["--doc", str(stale), "--write"]) == 0 and stale.read_text() == text
