"""The one typed cosmos-rl rule list (``config/compat/rules.py``) is the only source of the aliases,
the defaults a cosmos-rl file gets, the world-model reader's rules and the docs tables."""

from __future__ import annotations

from pathlib import Path

from cosmos_primitives.config.aliases import ALIASES
from cosmos_primitives.config.compat import cosmos_rl_wfm, docs_table, rules
from cosmos_primitives.config.compat.rules import RULE_LIST, Rule, mapped

DOC = Path(__file__).resolve().parents[1] / "docs" / "from_cosmos_rl.md"


def test_every_rule_is_typed_and_mapped_rules_name_their_target() -> None:
    assert len(RULE_LIST) > 240 and all(isinstance(rule, Rule) for rule in RULE_LIST)
    for rule in RULE_LIST:
        assert (rule.target is not None) == (rule.how == "mapped"), rule.key
        assert not rule.fill or rule.how == "mapped", rule.key
        assert rule.family in ("llm", "cosmos", "diffusers"), rule.key
    families = {f: sum(r.family == f for r in RULE_LIST) for f in ("llm", "cosmos", "diffusers")}
    assert families["llm"] > 240 and families["cosmos"] > 70 and families["diffusers"] > 40, families


def test_the_world_model_reader_reads_the_world_model_rules_of_the_list() -> None:
    for family, read in (("cosmos", cosmos_rl_wfm.COSMOS_RULES), ("diffusers", cosmos_rl_wfm.DIFFUSERS_RULES)):
        listed = [r for r in RULE_LIST if r.family == family]
        assert list(read.values()) == listed and all(rules.rules_of(family)[r.key] is r for r in listed)
    # a mapped world-model rule names its targets as a typed field, not inside prose
    rule = cosmos_rl_wfm.COSMOS_RULES["model.rl.num_rollout"]
    assert rule.target == "wfm.num_samples_per_prompt, wfm.group_ranks"
    assert cosmos_rl_wfm.targets(rule) == (rule.target, rule.reason[1:-1])
    assert cosmos_rl_wfm.rule_for("model.rl.num_rollout") is rule
    # a diffusers file's key without a world-model rule falls back on the LLM / VLM rule
    assert cosmos_rl_wfm.rule_for("train.epsilon", "diffusers") is rules.RULES["train.epsilon"]
    # the world-model rules add no alias or default to LLM / VLM files
    assert "model.rl.num_rollout" not in ALIASES and "model.precision" not in rules.RULES


def test_cosmos_rl_aliases_are_exactly_the_renaming_rules() -> None:
    renaming = {r.key: (r.target, r.transform) for r in RULE_LIST
                if r.family == "llm" and r.how == "mapped" and r.target != r.key}
    assert {k: v for k, v in ALIASES.items() if k in rules.RULES} == renaming
    # no alias gives a cosmos-rl key a meaning the rule list does not state
    assert all(ALIASES[key] == value for key, value in renaming.items())


def test_cosmos_rl_defaults_are_the_fill_rules() -> None:
    fill = [r for r in RULE_LIST if r.fill]
    assert all(r.family == "llm" for r in fill)
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
    wfm_start, wfm_end = docs_table.table_in(text, start_marker=docs_table.WFM_START, end_marker=docs_table.WFM_END)
    assert text[wfm_start:wfm_end] == cosmos_rl_wfm.render_tables()
    # every rule of the whole list, world-model ones included, is one row of the generated tables
    rows = [line for part in (text[start:end], text[wfm_start:wfm_end]) for line in part.splitlines()
            if line.startswith("| `")]
    assert len(rows) == len(RULE_LIST)
    assert [row.split("`")[1] for row in rows] == [r.key for r in RULE_LIST if r.family == "llm"] + \
        [r.key for r in RULE_LIST if r.family == "cosmos"] + [r.key for r in RULE_LIST if r.family == "diffusers"]
    assert docs_table.main(["--doc", str(DOC)]) == 0
    # a stale row, in the LLM / VLM table or a world-model one, is caught and rewritten
    for old, new in (("| `train.epsilon` | `1e-06` |", "| `train.epsilon` | `1e-05` |"),
                     ("| `model.rl.kl_beta` | `0.01` |", "| `model.rl.kl_beta` | `0.02` |"),
                     ("| `rollout.n_generation` | `16` | mapped | wfm.",
                      "| `rollout.n_generation` | `8` | mapped | wfm.")):
        assert text.count(old) == 1, old
        stale = tmp_path / "from_cosmos_rl.md"
        stale.write_text(text.replace(old, new))
        assert docs_table.main(["--doc", str(stale)]) == 1
        assert docs_table.main(["--doc", str(stale), "--write"]) == 0 and stale.read_text() == text
