"""Write ``tests/data/cosmos_rl_effective_config.json``: the effective value of every key this
library maps (``config/compat/cosmos_rl.py``, rule ``mapped``) of every vendored cosmos-rl LLM / VLM config
(``tests/data/cosmos_rl_configs``) under cosmos-rl's own ``Config`` class, the reference
``tests/test_cosmos_rl_effective_config.py`` compares this library's reading with.

Run it with the interpreter of an environment holding cosmos-rl (its own pins, transformers < 5,
plus msgspec to read this library's key table), never this library's::

    /work/venvs/cosmos-rl/bin/python scripts/fixtures_cosmos_rl_config.py

Each file is read as cosmos-rl's launcher reads it (``toml.load``, then ``Config.from_dict``).
``from_dict`` names the run folder ``<output_dir>/<timestamp>`` at load time: the fixture keeps the
``output_dir`` the file wrote (the folder the timestamped run folders go in). World-model files
(``[model]`` / ``[trainer]`` / ``[job]`` layout, or ``policy.is_diffusers``) are left out: they are
another config class.

Beside the configs, the same JSON holds two behaviours those keys drive, taken from cosmos-rl's own
code: the learning rate of every step under its scheduler (``build_lr_schedulers``) for a grid of
warmup / decay settings, and its rule-based rewards (``format``, ``single_choice``) of a list of
completions (``tests/test_policy_optim.py``, ``tests/test_rewards_rule_based.py``).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import cosmos_rl
import toml
import torch
from cosmos_rl.dispatcher.algo.reward import format_reward_fn, single_choice_reward_fn
from cosmos_rl.policy.config import Config


def _optm_module():
    """cosmos-rl's ``policy/trainer/optm`` loaded alone: its package ``__init__`` imports the trainers,
    which need the exact torch cosmos-rl pins."""
    path = Path(cosmos_rl.__file__).parent / "policy" / "trainer" / "optm" / "__init__.py"
    spec = importlib.util.spec_from_file_location("cosmos_rl_optm", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_lr_schedulers = _optm_module().build_lr_schedulers

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
from cosmos_primitives.config.compat.cosmos_rl import RULES  # noqa: E402  (this checkout's table)

CONFIGS = REPO / "tests" / "data" / "cosmos_rl_configs"
OUT = REPO / "tests" / "data" / "cosmos_rl_effective_config.json"
# sections of other kinds of training, and cosmos-rl's internal fields
SKIPPED = ("profiler", "distillation", "vla", "policy.diffusers", "controller_execution_id")
MAPPED = {key for key, rule in RULES.items() if rule.how == "mapped"}


def is_llm_vlm(tree: dict[str, Any]) -> bool:
    """A cosmos-rl LLM / VLM SFT or GRPO file (not a world-model or diffusers one)."""
    if any(section in tree for section in ("model", "trainer", "job", "model_parallel")):
        return False
    return not tree.get("policy", {}).get("is_diffusers", False)


def leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> value of a ``model_dump()``; ``custom`` and dict-valued settings stay whole."""
    out: dict[str, Any] = {}
    for key, item in value.items():
        path = f"{prefix}{key}"
        if path.startswith(SKIPPED):
            continue
        if isinstance(item, dict) and path not in ("custom",) and not path.endswith("reward_function"):
            out.update(leaves(item, path + "."))
        else:
            out[path] = list(item) if isinstance(item, tuple) else item
    return out


def effective(path: Path) -> dict[str, Any]:
    written = toml.load(path)
    config = Config.from_dict(toml.load(path))
    values = leaves(config.model_dump())
    values["train.output_dir"] = written.get("train", {}).get("output_dir", "./outputs")
    return {key: value for key, value in values.items() if key in MAPPED}


# (optm_warmup_steps, total steps, optm_decay_type, optm_min_lr_factor)
SCHEDULES = [
    (0, 6, None, 0.0), (1, 6, "linear", 0.0), (4, 14, "cosine", 0.1), (20, 8, None, 0.0), (20, 8, "cosine", 0.0),
    (5, 5, "linear", 0.0), (3, 10, "linear", 0.2), (3, 10, "sqrt", 0.0), (0.3, 10, "cosine", 0.0),
    (0.03, 200, "linear", 0.0), (2, 3, "none", 0.0), (0, 1, "cosine", 0.0),
]
COMPLETIONS = [
    "<think>\nthe ball falls\n</think>\n\n<answer>\nA\n</answer>",
    "<think>\nthe ball falls\n</think>\n\n<answer>\nA\n</answer>\n",
    "<think>\nthe ball falls\n</think>\n\n<answer>\nA\n</answer>\n\n",
    "<think>x</think>\n\n<answer>A</answer> ",
    " <think>x</think>\n\n<answer>A</answer>",
    "<think>x</think>\n<answer>A</answer>",
    "<think>a <think> b</think>\n\n<answer>A</answer>",
    "<think>a < b</think>\n\n<answer>A</answer>",
    "<think>x</think>\n\n<answer>A</answer><answer>B</answer>",
    "<answer>A</answer>",
    "A",
    "a",
    " (A) ",
    "<answer>(A)</answer>",
    "<answer> b </answer> and <answer>A</answer>",
    "The answer is A.",
    "<answer>Stra\u00dfe</answer>",
    "",
]
REFERENCES = ["A", "<answer>A</answer>", "(A)", "  a ", "STRASSE", "", None]


def lr_schedules() -> list[dict[str, Any]]:
    """The learning-rate factor of every step under cosmos-rl's scheduler, per setting of :data:`SCHEDULES`."""
    out = []
    for warmup, total, decay, floor in SCHEDULES:
        config = Config.from_dict({"train": {"optm_warmup_steps": warmup, "optm_decay_type": decay,
                                             "optm_min_lr_factor": floor, "timestamp": "fixture"}})
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        container = type("Optimizers", (), {"model_parts": [None], "optimizers": [[optimizer]],
                                            "__len__": lambda self: 1})()
        schedulers = build_lr_schedulers(container, config, total)
        factors = []
        for _ in range(total):
            factors.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            schedulers.step()
        out.append({"warmup_steps": warmup, "total_steps": total, "decay_type": decay, "min_lr_factor": floor,
                    "factors": factors})
    return out


def rewards() -> list[dict[str, Any]]:
    """cosmos-rl's ``format`` and ``single_choice`` of each completion against each reference."""
    return [{"completion": c, "reference": r, "format": format_reward_fn(c, r),
             "single_choice": single_choice_reward_fn(c, r)} for c in COMPLETIONS for r in REFERENCES]


def main() -> int:
    files = sorted(p for p in CONFIGS.rglob("*.toml") if is_llm_vlm(toml.load(p)))
    fixture = {
        "cosmos_rl_version": version("cosmos-rl"),
        "configs": {str(p.relative_to(CONFIGS)): effective(p) for p in files},
        "lr_schedules": lr_schedules(),
        "rewards": rewards(),
    }
    OUT.write_text(json.dumps(fixture, indent=1, sort_keys=True) + "\n")
    print(f"{len(files)} configs -> {OUT.relative_to(REPO)} ({OUT.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
