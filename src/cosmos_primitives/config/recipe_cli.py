"""The command line the recipes share: ``--config FILE``, dotted overrides, and the plug-in flags
``--dataset`` (SFT and GRPO) / ``--reward`` (GRPO)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from cosmos_primitives.config.loader import load_config
from cosmos_primitives.config.paths import with_plugins
from cosmos_primitives.config.redis import run_stream
from cosmos_primitives.config.root import Config


def load_recipe_config(description: str | None, *, plugins: bool = False, dataset_plugin: bool = False,
                       jobs: bool = False, argv: Sequence[str] | None = None) -> tuple[Config, str]:
    """Parse the recipe's command line and load its config.

    Args:
        description: the recipe's ``__doc__`` (``--help`` prints it).
        plugins: accept ``--dataset my_pkg.data:MyDataset`` and ``--reward my_pkg.rewards:score``
            (repeatable; see :func:`cosmos_primitives.config.with_plugins`).
        dataset_plugin: accept ``--dataset`` alone (the SFT recipe: no rewards).
        jobs: the independent-job recipes: ``--run NAME`` (required; the run's Redis keys live under the
            stream ``cosmos:NAME``, see :func:`run_stream`) and ``--redis URL`` (``[redis] url``).
        argv: the arguments (default ``sys.argv[1:]``).

    Returns:
        ``(config, config_path)``; the path is what start-up errors name.
    """
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="TOML config")
    if plugins or dataset_plugin:
        parser.add_argument("--dataset", help="your dataset class by import path, e.g. my_pkg.data:MyDataset, or "
                            "a script, e.g. tools/dataset/cosmos_sft.py[:CosmosSFTDataset] (cosmos-rl dataset "
                            "classes run unchanged; [train.train_policy.dataset] plugin)")
    if plugins:
        parser.add_argument("--reward", action="append", default=[],
                            metavar="MODULE:FUNCTION[=WEIGHT]",
                            help="a reward function by import path, e.g. my_pkg.rewards:score or "
                            "my_pkg.rewards:score=0.5 "
                            "(the module must be importable: installed or on PYTHONPATH; repeat for more; they "
                            "replace [grpo] reward_function, weight 1 unless given; cosmos-rl's signature is accepted)")
    if jobs:
        # --run-name under torchrun, whose own parser refuses --run as an ambiguous prefix of its --run-path
        parser.add_argument("--run", "--run-name", dest="run", required=True,
                            help="the run's name: the trainer job and every rollout job of one run give the same "
                            "name (and Redis); the run's keys live under the stream cosmos:NAME. Spell it "
                            "--run-name after torchrun, which takes --run for its own --run-path")
        parser.add_argument("--redis", default=None, help="Redis URL shared by the run's jobs (default: [redis] url, "
                            "else $COSMOS_REDIS_URL)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.epoch=2 grpo.kl_beta=0.01")
    args = parser.parse_args(argv)
    overrides = list(args.overrides)
    if jobs:
        overrides.append(f"redis.stream={run_stream(args.run)}")
        if args.redis:
            overrides.append(f"redis.url={args.redis}")
    cfg = load_config(args.config, overrides)
    if plugins or dataset_plugin:
        cfg = with_plugins(cfg, args.dataset, getattr(args, "reward", ()))
    return cfg, args.config
