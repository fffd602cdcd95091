"""One decision at start-up: the run folder a run writes into and the checkpoint it resumes from.

Both come from the same look at ``[train] output_dir``, so a resumed run always writes into the
folder of the run whose checkpoint it loaded, and two runs sharing an output folder never cross.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from cosmos_primitives.checkpoint import layout
from cosmos_primitives.parallel.distributed import broadcast_object


@dataclass(frozen=True)
class RunStart:
    """Where a run writes and what it resumes from.

    Attributes:
        run_dir: ``<output_dir>/<YYYYmmddHHMMSS>``, created: the new run's, or the resumed run's.
        resume_from: what :meth:`CheckpointManager.resume` loads: the resumed run's folder (its newest
            checkpoint that verifies) or the checkpoint path ``[train] resume`` named; None: a fresh start.
    """

    run_dir: Path
    resume_from: Path | None

    @property
    def resumed(self) -> bool:
        return self.resume_from is not None


def start_run(output_dir: str | Path, resume: bool | str | Path | None, *, timestamp: str | None = None) -> RunStart:
    """Choose the run folder and the checkpoint to resume from together (collective under torchrun).

    ``resume`` false: a new folder ``<output_dir>/<timestamp>``. ``true``: the newest run under
    ``output_dir`` that holds a complete checkpoint, continued in its own folder (a later run that
    never saved is passed over); none: a new folder, from step 0. A path (a ``step_N`` checkpoint, a
    run folder or an output folder): its newest complete checkpoint, continued in the folder of the
    run that saved it (``<run>/checkpoints/step_N``); a checkpoint outside such a layout starts a new
    folder under ``output_dir``. Rank 0 decides (and creates the folder); every rank gets its answer.

    Args:
        output_dir: ``[train] output_dir``.
        resume: ``[train] resume``.
        timestamp: the new folder's name (default: now, as rank 0 reads the clock).

    Raises:
        FileNotFoundError: ``resume`` is a path with no complete checkpoint in it.
    """
    answer: tuple[str, str | None] | str = ""
    try:
        answer = _choose(Path(output_dir), resume, timestamp) if _is_rank0() else answer
    except FileNotFoundError as error:
        answer = str(error)
    answer = broadcast_object(answer)
    if isinstance(answer, str):
        raise FileNotFoundError(answer)
    run_dir, resume_from = answer
    return RunStart(Path(run_dir), None if resume_from is None else Path(resume_from))


def _is_rank0() -> bool:
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == 0


def _choose(output_dir: Path, resume: bool | str | Path | None, timestamp: str | None) -> tuple[str, str | None]:
    if resume is True:
        latest = layout.find_latest_checkpoint(output_dir)
        if latest is not None and _run_of(latest) is not None:
            run = _run_of(latest)
            return str(run), str(run)  # the manager falls back to older checkpoints of this run only
    elif resume not in (False, None, ""):
        latest = layout.find_latest_checkpoint(resume)
        if latest is None:
            raise FileNotFoundError(
                f"[train] resume = {str(resume)!r}: no complete checkpoint there. A complete checkpoint is a step_N "
                f"folder holding a {layout.MARKER} file; point resume at one, at its run folder, or set resume = true")
        run = _run_of(latest)
        if run is not None:
            return str(run), str(resume)
    new = output_dir / (timestamp or time.strftime("%Y%m%d%H%M%S"))
    new.mkdir(parents=True, exist_ok=True)
    return str(new), None if resume in (True, False, None, "") else str(resume)


def _run_of(checkpoint: Path) -> Path | None:
    """The run folder of a ``<run>/checkpoints/step_N`` checkpoint, else None."""
    return checkpoint.parent.parent if checkpoint.parent.name == layout.CHECKPOINTS_DIR else None
