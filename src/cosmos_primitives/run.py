"""The start-up and the ending every recipe shares, so a recipe file holds only its own loop.

    cfg, config_path = cp.config.load_recipe_config(__doc__)
    run = cp.run.start(cfg, config_path, memory_plan="sft")
    cfg, info, run_dir = run.cfg, run.info, run.run_dir
    ...  # build, CheckpointManager(...).resume(run.resume_from), train
    run.finish(ckpt, tracker, preemption, step=step, total_steps=total_steps, plot=["loss"])

:func:`start` joins the process group, makes the demo assets of the tiny configs, checks that the
config can run, seeds, and picks the run folder and the checkpoint to resume from in one decision
(:func:`cosmos_primitives.checkpoint.start_run`). :meth:`RecipeRun.finish` exports, settles the
checkpoints and uploads, closes the metrics, draws the curves, leaves the process group, and exits
with the status that says how the run ended.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cosmos_primitives.checkpoint.preemption import Preemption
from cosmos_primitives.checkpoint.run_start import start_run
from cosmos_primitives.config import Config, check_runnable, dump_config
from cosmos_primitives.data.plugins import check_plugins_read
from cosmos_primitives.logging import get_logger
from cosmos_primitives.logging.plot import plot_run
from cosmos_primitives.parallel.distributed import DistInfo, barrier, destroy_distributed, init_distributed
from cosmos_primitives.plan.startup import Mode, log_memory_plan
from cosmos_primitives.utils.seeding import seed_everything


@dataclass
class RecipeRun:
    """A started recipe run.

    Attributes:
        cfg: the config as it runs (``demo:`` prefixes resolved, paths checked).
        config_path: the TOML file start-up errors name.
        info: this process's rank, world size and device.
        run_dir: ``<output_dir>/<YYYYmmddHHMMSS>``: the new run's folder, or the resumed run's.
        resume_from: what to pass to ``CheckpointManager.resume`` (None: a fresh start).
        prefix: the recipe's log prefix (e.g. ``"[SFT] "``).
    """

    cfg: Config
    config_path: str
    info: DistInfo
    run_dir: Path
    resume_from: Path | None
    prefix: str = ""

    def finish(self, ckpt: Any, tracker: Any = None, preemption: Preemption | None = None, *, step: int,
               total_steps: int, plot: Sequence[str] | None = None) -> None:
        """End the run on every rank: signals back to their old handlers; unless preempted, the final
        export (``safetensors/final`` with ``[train.ckpt] export_safetensors``); the checkpoint
        manager closed (background save and uploads settled); ``tracker`` finished; ``plot`` drawn
        into ``<run_dir>/curves.png`` by rank 0; the process group destroyed.

        Raises:
            SystemExit: an upload failed (naming them), or a signal stopped the run (exit status 75,
                ``PREEMPTED_EXIT_CODE``: resume with ``train.resume=true``).
        """
        if preemption is not None:
            preemption.restore()  # training is over: a signal from now on ends the process at once
        stopped = preemption is not None and preemption.stopped
        if not stopped:
            get_logger().info(f"{self.prefix}Training finished at step {step}/{total_steps}, saving final "
                              "checkpoint in huggingface safetensors...")
            ckpt.export_final()  # nothing unless [train.ckpt] export_safetensors
        failures = ckpt.close()
        if tracker is not None:
            tracker.finish()
        if plot and self.info.is_rank0:
            plot_run(self.run_dir, keys=list(plot))
        destroy_distributed()
        if failures:
            raise SystemExit(f"{len(failures)} upload(s) failed: {failures}")
        if preemption is not None:
            preemption.exit_if_stopped()  # exit status 75: preempted, resume with train.resume=true


def start(cfg: Config, config_path: str, *, memory_plan: Mode | None = None, prefix: str = "") -> RecipeRun:
    """Start a recipe run on every rank (collective under torchrun).

    In order: join the process group (:func:`init_distributed`); rank 0 writes the demo model / data
    of ``demo:<path>`` inputs (the tiny configs); :func:`check_runnable` (a missing path or refused key
    stops here, naming it) and :func:`check_plugins_read`; rank 0 logs the memory plan of mode
    ``memory_plan`` (None: none); ``[train] seed`` seeds every RNG; :func:`start_run` picks the run
    folder and the checkpoint to resume from together; rank 0 writes the resolved config to
    ``<run_dir>/config.toml`` (secrets redacted).

    Args:
        cfg: the loaded config (:func:`cosmos_primitives.config.load_recipe_config`).
        config_path: its file, for error messages.
        memory_plan: ``"sft"``, ``"colocated"``, ``"disaggregated"`` or ``"wfm"``.
        prefix: the recipe's log prefix, used by :meth:`RecipeRun.finish`.
    """
    info = init_distributed()
    if info.is_rank0:
        from cosmos_primitives.testing.demo_assets import ensure_demo_assets

        ensure_demo_assets(cfg)  # only acts on "demo:<path>" paths (the tiny configs)
    barrier()
    cfg = check_runnable(cfg, config_path)  # drops "demo:"
    check_plugins_read(cfg, config_path)  # a [validation.dataset] plugin with validation off stops here
    if memory_plan is not None:
        log_memory_plan(cfg, info.world_size, info.device, mode=memory_plan)  # bytes per GPU
    seed_everything(cfg.train.seed)
    chosen = start_run(cfg.train.output_dir, cfg.train.resume)
    if info.is_rank0:
        dump_config(cfg, chosen.run_dir / "config.toml")
    return RecipeRun(cfg, config_path, info, chosen.run_dir, chosen.resume_from, prefix)


__all__ = ["RecipeRun", "start"]
