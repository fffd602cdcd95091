"""``python -m cosmos_primitives.migrate CONFIG.toml [--json]``: how a cosmos-rl config is read here.

Prints how the file is read and why (cosmos-rl's meanings and defaults, or this library's), what
maps (and onto which key), what is ignored and why, what is refused and what to do instead, the
cosmos-rl defaults given to keys the file leaves unset (where ours differ), the meanings translated
(batch sizes), whether the file loads and whether the recipes start on it
(``cp.config.check_runnable``: refused settings, missing local paths, prompt columns without a
dataset plug-in), and what one optimizer step trains. cosmos-rl's world-model files
(``configs/cosmos-predict2-5/``) are reported by ``config/compat/cosmos_rl_wfm_report.py``: what maps,
what is ignored or refused, and what one step trains (``cosmos_rl_wfm.effective_values``).
``--json`` prints the same as one JSON object whose ``effective`` member holds the training's
sizes, for both kinds of file (at least ``samples_per_step_per_rank``, ``samples_per_step``, ``lr``,
``warmup_steps``, ``algorithm``; :func:`llm_vlm_effective` for an SFT / GRPO file). ``--table``
prints the whole key table of ``docs/from_cosmos_rl.md``. Exit status: 0 when the recipes start on
the file, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cosmos_primitives.config import Config, ConfigError, check_runnable, load_config
from cosmos_primitives.config.compat.cosmos_rl import render_table, rule_for
from cosmos_primitives.config.compat.cosmos_rl_wfm import WorldModelReading
from cosmos_primitives.config.compat.cosmos_rl_wfm_report import world_model_json, world_model_report
from cosmos_primitives.config.loader import read_cosmos_rl_file


def llm_vlm_effective(config: Config) -> dict[str, Any]:
    """What one optimizer step of an SFT / GRPO config trains, as the recipes run it.

    Keys: ``algorithm`` (``"sft"``, or the GRPO ``variant``: ``"grpo"`` / ``"gspo"`` / ``"dapo"``),
    ``samples_per_step_per_rank`` (SFT samples, or GRPO rollouts, of one optimizer step on one
    data-parallel rank), ``data_parallel_size`` (``dp_shard_size x dp_replicate_size``; None when
    ``dp_shard_size = -1`` takes the ranks the job is started with), ``samples_per_step`` (all
    ranks; None with it), ``lr`` (peak), ``warmup_steps`` (a float up to 1 is that fraction of the
    run's steps: ``warmup_is_fraction``), ``decay_type``, ``min_lr_factor``, ``epochs``,
    ``max_steps``, ``seed`` (None: drawn at start-up), ``mini_batch``, ``sequence_packing``; GRPO
    adds ``rollout_batch_size`` (prompts per generation and rank), ``num_samples_per_prompt`` and
    ``steps_per_generation`` (the ``[grpo]`` keys' names).
    """
    train, grpo = config.train, config.grpo
    shard, replicate = config.policy.parallelism.dp_shard_size, config.policy.parallelism.dp_replicate_size
    dp = shard * replicate if shard > 0 else None
    sft = train.train_policy.type == "sft"
    generation = grpo.rollout_batch_size * grpo.num_samples_per_prompt
    per_rank = train.train_batch_per_replica if sft else grpo.rollouts_per_step or generation
    warmup = train.optm_warmup_steps
    out: dict[str, Any] = {
        "algorithm": "sft" if sft else grpo.variant,
        "samples_per_step_per_rank": per_rank,
        "data_parallel_size": dp,
        "samples_per_step": per_rank * dp if dp is not None else None,
        "lr": train.optm_lr,
        "warmup_steps": warmup,
        "warmup_is_fraction": isinstance(warmup, float) and warmup <= 1.0,
        "decay_type": train.optm_decay_type,
        "min_lr_factor": train.optm_min_lr_factor,
        "epochs": train.epoch,
        "max_steps": train.max_steps,
        "seed": train.seed,
        "mini_batch": train.train_policy.mini_batch,
        "sequence_packing": train.train_policy.sequence_packing,
    }
    if not sft:
        out.update(rollout_batch_size=grpo.rollout_batch_size, num_samples_per_prompt=grpo.num_samples_per_prompt,
                   steps_per_generation=generation // per_rank)
    return out


@dataclass
class Inspection:
    """Everything the report says about one file (text and ``--json`` alike)."""

    path: str
    read_as: str = ""
    why: str = ""
    mapped: list[tuple[str, str, Any]] = field(default_factory=list)
    ignored: list[tuple[str, str]] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)
    translated: list[str] = field(default_factory=list)
    loads: bool = False
    runs: bool = False
    problems: list[str] = field(default_factory=list)
    effective: dict[str, Any] | None = None
    # a cosmos-rl world-model file: loads, runs and effective are config/compat/cosmos_rl_wfm_report.py's
    world_model: WorldModelReading | None = None

    def as_json(self) -> dict[str, Any]:
        return {"file": self.path, "read_as": self.read_as, "why": self.why, "loads": self.loads, "runs": self.runs,
                "problems": self.problems, "effective": self.effective,
                "mapped": [{"key": k, "ours": o, "value": v} for k, o, v in self.mapped],
                "ignored": [{"key": k, "why": w} for k, w in self.ignored], "refused": self.refused,
                "defaults": self.defaults, "translated": self.translated}


def inspect(path: str) -> Inspection:
    """Read ``path`` as the loader does and as a recipe would start on it."""
    found = Inspection(path)
    try:
        found.mapped, reading, found.why = read_cosmos_rl_file(path)
    except ConfigError as exc:
        found.problems = list(exc.problems)
        return found
    found.read_as = "cosmos-rl" if reading is not None else "cosmos_primitives"
    if reading is not None:
        found.ignored, found.refused = reading.ignored, reading.refused
        found.defaults, found.translated = reading.defaults, reading.translated
    if isinstance(reading, WorldModelReading):
        found.world_model = reading
        return found
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            config = load_config(path)
        except ConfigError as exc:
            found.problems = list(exc.problems)
            return found
    found.loads = True
    found.effective = llm_vlm_effective(config)
    try:
        check_runnable(config, path)
        found.runs = True
    except ConfigError as exc:
        found.problems = list(exc.problems)
    return found


def report(path: str) -> tuple[str, bool]:
    """``(the report's text, whether the file runs as it is)``."""
    found = inspect(path)
    if not found.read_as:
        return "\n".join(found.problems) + "\n", False
    if found.world_model is not None:
        return world_model_report(path, found.world_model)
    what = "a cosmos-rl config" if found.read_as == "cosmos-rl" else "read as this library's own config"
    lines = [f"{path}: {what} ({found.why})", "", "maps:"]
    for key, ours, value in found.mapped:
        rule = rule_for(key)
        target = f" -> {ours}" if ours != key else ""
        why = f"  {rule.note[2:]}" if rule is not None and rule.note.startswith("= (") else ""
        lines.append(f"  {key} = {value!r}{target}{why}")
    lines += ["", "ignored (no effect here):"] + [f"  {key}: {why}" for key, why in found.ignored]
    lines += ["", "refused (the recipes stop on these):"] + [f"  {key} {what}" for key, what in found.refused.items()]
    lines += ["", "defaults that differ (unset in the file: cosmos-rl's value is used):"]
    lines += [f"  {key} = {value!r}" for key, value in found.defaults.items()]
    lines += ["", "meanings translated:"] + [f"  {line}" for line in found.translated]
    if found.effective is not None:
        lines += ["", "one optimizer step:"] + [f"  {key} = {value!r}" for key, value in found.effective.items()]
    if not found.loads:
        lines += ["", "does NOT load:"] + [f"  {p}" for p in found.problems]
    elif not found.runs:
        lines += ["", "loads with cp.load_config; the recipes stop at start-up on:"]
        lines += [f"  {p}" for p in found.problems]
    else:
        lines += ["", "loads with cp.load_config; the recipes start on it"]
    return "\n".join(lines) + "\n", found.runs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cosmos_primitives.migrate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", help="a cosmos-rl TOML config")
    parser.add_argument("--json", action="store_true", help="print one JSON object (its 'effective' member: "
                        "samples per step, lr, warmup, algorithm)")
    parser.add_argument("--table", action="store_true", help="print the table of every cosmos-rl key")
    args = parser.parse_args(argv)
    if args.table:
        sys.stdout.write(render_table())
        return 0
    if not args.config:
        parser.error("give a config file (or --table)")
    if args.json:
        found = inspect(args.config)
        out, runs = found.as_json(), found.runs
        if found.world_model is not None:
            out, runs = world_model_json(args.config, found.world_model)
        sys.stdout.write(json.dumps(out, indent=1, default=str) + "\n")
        return 0 if runs else 1
    text, runs = report(args.config)
    sys.stdout.write(text)
    return 0 if runs else 1


if __name__ == "__main__":
    sys.exit(main())
