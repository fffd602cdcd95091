"""``python -m cosmos_primitives.migrate CONFIG.toml``: how a cosmos-rl config is read here.

Prints what maps (and onto which key), what is ignored and why, what is refused and what to do
instead, the cosmos-rl defaults given to keys the file leaves unset (where ours differ), the
meanings translated (batch sizes), whether the file loads and whether the recipes start on it
(``cp.config.check_runnable``: refused settings, missing local paths, prompt columns without a
dataset plug-in). cosmos-rl's world-model files (``configs/cosmos-predict2-5/``) are reported by
``config/cosmos_rl_wfm_report.py``. ``--json`` prints one JSON object instead (for a world-model
file with ``effective``: samples per step per rank and in all, lr, warmup steps, algorithm).
``--table`` prints the whole key table of ``docs/from_cosmos_rl.md``. Exit status: 0 when the
recipes start on the file, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Sequence

from cosmos_primitives.config import ConfigError, check_runnable, load_config
from cosmos_primitives.config.cosmos_rl import render_table, rule_for
from cosmos_primitives.config.cosmos_rl_wfm import WorldModelReading
from cosmos_primitives.config.cosmos_rl_wfm_report import world_model_json, world_model_report
from cosmos_primitives.config.loader import read_cosmos_rl_file


def report(path: str) -> tuple[str, bool]:
    """``(the report's text, whether the file runs as it is)``."""
    try:
        mapped, reading = read_cosmos_rl_file(path)
    except ConfigError as exc:
        return f"{exc}\n", False
    if isinstance(reading, WorldModelReading):
        return world_model_report(path, reading)
    lines = [f"{path}: " + ("a cosmos-rl config" if reading.ignored or reading.refused or reading.defaults
                            else "read as this library's own config"), "", "maps:"]
    for key, ours, value in mapped:
        rule = rule_for(key)
        target = f" -> {ours}" if ours != key else ""
        why = f"  {rule.note[2:]}" if rule is not None and rule.note.startswith("= (") else ""
        lines.append(f"  {key} = {value!r}{target}{why}")
    lines += ["", "ignored (no effect here):"] + [f"  {key}: {why}" for key, why in reading.ignored]
    lines += ["", "refused (the recipes stop on these):"] + [f"  {key} {what}" for key, what in reading.refused.items()]
    lines += ["", "defaults that differ (unset in the file: cosmos-rl's value is used):"]
    lines += [f"  {key} = {value!r}" for key, value in reading.defaults.items()]
    lines += ["", "meanings translated:"] + [f"  {line}" for line in reading.translated]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            config = load_config(path)
        except ConfigError as exc:
            loads = "does NOT load:\n" + "\n".join(f"  {p}" for p in exc.problems)
            return "\n".join([*lines, "", loads]) + "\n", False
    try:
        check_runnable(config, path)
        verdict = "loads with cp.load_config; the recipes start on it"
    except ConfigError as exc:
        verdict = ("loads with cp.load_config; the recipes stop at start-up on:\n"
                   + "\n".join(f"  {p}" for p in exc.problems))
        return "\n".join([*lines, "", verdict]) + "\n", False
    return "\n".join([*lines, "", verdict]) + "\n", True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cosmos_primitives.migrate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", help="a cosmos-rl TOML config")
    parser.add_argument("--table", action="store_true", help="print the table of every cosmos-rl key")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    args = parser.parse_args(argv)
    if args.table:
        sys.stdout.write(render_table())
        return 0
    if not args.config:
        parser.error("give a config file (or --table)")
    if args.json:
        _, reading = read_cosmos_rl_file(args.config)
        if isinstance(reading, WorldModelReading):
            out, runs = world_model_json(args.config, reading)
            sys.stdout.write(json.dumps(out, indent=1, default=str) + "\n")
            return 0 if runs else 1
    text, runs = report(args.config)
    sys.stdout.write(text)
    return 0 if runs else 1


if __name__ == "__main__":
    sys.exit(main())
