"""Write tests/data/cosmos_rl_wfm_effective.json: how cosmos-rl itself reads its world-model configs.

Run with a Python that has cosmos-rl installed (its dependencies need not all be there: only its
pydantic config classes are imported), from the repository root::

    /work/venvs/cosmos-rl/bin/python scripts/fixtures_cosmos_rl_wfm.py

For every vendored ``tests/data/cosmos_rl_configs/cosmos-rl/configs/cosmos-predict2-5/*.toml`` it
parses the file as cosmos-rl's launcher does (``toml``), validates it with cosmos-rl's own class
(``CosmosVisionGenConfig.from_dict`` for a Cosmos-trainer file, ``Config.from_dict`` for a
diffusers one) and stores every effective value (defaults filled) as a dotted key, plus what one
training step is, in cosmos-rl's terms (``effective``: rollouts per data-parallel rank and in all,
prompts, group size, peak lr, warmup steps, algorithm, steps). ``tests/test_cosmos_rl_wfm.py``
compares this library's reading against it, so CI needs no cosmos-rl.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

import toml

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "data" / "cosmos_rl_configs" / "cosmos-rl" / "configs" / "cosmos-predict2-5"
OUT = ROOT / "tests" / "data" / "cosmos_rl_wfm_effective.json"
# run-dependent values cosmos-rl fills at load time
VOLATILE = ("job.timestamp", "train.timestamp", "train.output_dir")


def _config_classes() -> tuple[Any, Any]:
    """cosmos-rl's two config classes. ``cosmos_rl/__init__.py`` imports its whole runtime (datasets,
    vLLM, ...); the config modules need only pydantic, so the package is registered without running it."""
    spec = importlib.util.find_spec("cosmos_rl")
    if spec is None or spec.origin is None:
        raise SystemExit("cosmos-rl is not installed in this Python; run this with its venv")
    package = types.ModuleType("cosmos_rl")
    package.__path__ = [str(Path(spec.origin).parent)]
    sys.modules["cosmos_rl"] = package
    from cosmos_rl.policy.config import Config
    from cosmos_rl.policy.config.wfm import CosmosVisionGenConfig

    return Config, CosmosVisionGenConfig


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flat(value, path + "."))
        else:
            out[path] = value
    return out


def _cosmos_effective(c: Any) -> dict[str, Any]:
    """One iteration of cosmos-rl's Cosmos trainer: every data-parallel rank takes ``batch_size`` prompts
    and rolls out one sample of each; ``num_rollout`` consecutive ranks share their prompts (a group)."""
    loader = c.dataloader_train.video_dataloader
    batch = loader.batch_size if c.dataloader_train.type == "local" else loader.dataloader.batch_size
    dp = c.model.fsdp_shard_size * c.model.dp_replicate_size  # the layout the file describes
    return {"samples_per_step_per_rank": batch, "samples_per_step": dp * batch,
            "prompts_per_step": dp * batch // c.model.rl.num_rollout, "num_samples_per_prompt": c.model.rl.num_rollout,
            "lr": c.optimizer.lr * c.scheduler.f_max[0], "warmup_steps": c.scheduler.warm_up_steps[0],
            "algorithm": "ddrl" if c.model.rl.data_beta > 0 else "flow_grpo", "max_steps": c.trainer.max_iter,
            "data_ranks": dp}


def _diffusers_effective(c: Any) -> dict[str, Any]:
    """One step of cosmos-rl's diffusers trainer: ``train_batch_per_replica`` rollouts per replica, shared
    by its data-parallel ranks, ``n_generation`` per prompt."""
    par = c.policy.parallelism
    dp = par.dp_shard_size * par.dp_replicate_size
    batch, n = c.train.train_batch_per_replica, c.rollout.n_generation
    return {"samples_per_step_per_rank": batch // dp, "samples_per_step": batch, "prompts_per_step": batch // n,
            "num_samples_per_prompt": n, "lr": c.train.optm_lr, "warmup_steps": c.train.optm_warmup_steps,
            "algorithm": c.train.train_policy.trainer_type, "max_steps": c.train.max_num_steps, "data_ranks": dp}


def main() -> None:
    config_cls, cosmos_cls = _config_classes()
    out: dict[str, Any] = {}
    for path in sorted(CONFIGS.glob("*.toml")):
        tree = toml.load(path)
        if "policy" in tree:
            config, effective = config_cls.from_dict(tree), _diffusers_effective
        else:
            config, effective = cosmos_cls.from_dict(tree), _cosmos_effective
        values = {k: v for k, v in _flat(config.model_dump(mode="json")).items() if k not in VOLATILE}
        out[path.name] = {"values": values, "effective": effective(config)}
    OUT.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT} ({len(out)} files)")


if __name__ == "__main__":
    main()
