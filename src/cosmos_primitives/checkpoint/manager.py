"""Resume checkpoints with torch.distributed.checkpoint (DCP): sharded save / load of the model, its
optimizer and LR scheduler, and the loop's state, with atomic completion, rotation, async saves,
safetensors exports and uploads.

A training loop makes these calls (every rank makes every call; rank 0 alone touches the
filesystem outside DCP and uploads)::

    ckpt = CheckpointManager(cfg.train.ckpt, run_dir, model=model, optimizer=opt, scheduler=sched,
                             sampler=sampler, processor=processor)
    state = ckpt.resume(cfg.train.resume)            # TrainState or None; restores everything in place
    start = state.step if state else 0
    for step in range(start + 1, total_steps + 1):
        ...one optimizer step...
        ckpt.maybe_save(step, epoch=epoch, force=step == total_steps)
    ckpt.export_final()                              # <run_dir>/safetensors/final
    ckpt.close()                                     # waits for the last save and the uploads

What is saved lets a resumed run continue bitwise as if never stopped (same world size): weights,
optimizer moments, scheduler, step / epoch / weight version, each rank's python / numpy / torch
(and CUDA) RNG states, its sampler position, its ``per_rank`` objects (e.g. bad-sample counts) and
its optimizer's own per-rank state (``rank_state_dict``, e.g. ``BFloat16AdamW``'s rounding-noise
generators), captured at the moment ``save`` is called.

Every rank records the size and SHA-256 of the files it wrote (``MANIFEST_rank<r>.json``) before the
completion marker exists; resume verifies them and falls back to the newest checkpoint that
verifies. "Newest" and rotation follow the run's save history, so after a rollback the new saves
are kept and the abandoned newer checkpoints are moved to ``checkpoints/abandoned/`` (which keeps the
``max_keep`` highest steps).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import errno
import os
import shutil
import time
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from cosmos_primitives.checkpoint import layout
from cosmos_primitives.checkpoint.interrupt import register_manager
from cosmos_primitives.checkpoint.manifest import missing_manifests, verify_checkpoint, write_rank_manifest
from cosmos_primitives.checkpoint.safetensors_export import export_safetensors, quiet_exports
from cosmos_primitives.checkpoint.train_state import TrainState, decode, encode
from cosmos_primitives.checkpoint.uploader import Uploader, UploadFailure, UploadTarget
from cosmos_primitives.config.checkpoint import CheckpointConfig
from cosmos_primitives.logging.console import get_logger
from cosmos_primitives.parallel.distributed import broadcast_object
from cosmos_primitives.utils.seeding import capture_rng_state, restore_rng_state

PAUSE_ENV = "COSMOS_TEST_CKPT_PAUSE_STEP"
"""Test hook: when set to N, committing ``step_N`` pauses 600 s after the data is written and before
the completion marker, so that a test can kill the process mid-save. Never set it in real runs."""


class SupportsStateDict(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


class CheckpointManager:
    """Saves and restores everything a training loop needs to continue exactly.

    Construct it on every rank (it may create a gloo process group for async saves, a collective).

    Args:
        config: ``[train.ckpt]``.
        run_dir: ``<output_dir>/<timestamp>``; checkpoints go to ``run_dir/checkpoints/step_N``,
            exports to ``run_dir/safetensors/{step_N,final}``.
        model: the module to save, plain or FSDP2 / TP sharded (``fully_shard`` applied in place).
        optimizer: its optimizer (state saved sharded like the parameters), optional.
        scheduler: an LR scheduler (anything with ``state_dict`` / ``load_state_dict``), optional.
        sampler: the data sampler, saved per rank (``state_dict`` / ``load_state_dict``), optional.
        per_rank: more objects each rank saves for itself beside the sampler, by name (``state_dict`` /
            ``load_state_dict``), e.g. ``{"bad_samples": tracker}``. A checkpoint written without one
            of the names (an older one) leaves that object as it is.
        processor, tokenizer: written into safetensors exports.
        s3_client_factory: makes the boto3 S3 client (default: from the ``AWS_*`` variables).
        hf_api_factory: makes the ``HfApi``-like object for Hub uploads (default: ``HfApi`` with ``HF_TOKEN``).
        process_group: the ranks that save together (default: the whole job), e.g. the trainer ranks
            of a disaggregated job; its first rank writes the metadata. Construct the manager on
            those ranks only.
        exporter: writes the exports instead of :func:`export_safetensors`, called on every rank as
            ``exporter(model, out_dir, max_shard_size_gb=..., dtype=...)`` (e.g. a
            ``functools.partial`` of ``cp.checkpoint.export_diffusers`` with the VAE and scheduler).
        async_group: with ``process_group`` and ``save_mode = "async"``: a gloo group over the same
            ranks for the background saves, made by every rank of the job beforehand
            (``dist.new_group(ranks, backend="gloo")`` is collective over the job).
        frozen_params: ``False`` leaves parameters with ``requires_grad = False`` out of checkpoints
            (e.g. the base weights under LoRA adapters, which a resumed run rebuilds from the model's
            source); loading then restores the others and leaves those as built.

    An optimizer with ``rank_state_dict()`` / ``load_rank_state_dict(state)`` (per-rank state that its
    sharded ``state_dict`` does not carry, such as ``BFloat16AdamW``'s rounding-noise generators) has
    that saved per rank as well.
    """

    def __init__(
        self,
        config: CheckpointConfig,
        run_dir: str | Path,
        *,
        model: nn.Module,
        optimizer: Any = None,
        scheduler: SupportsStateDict | None = None,
        sampler: SupportsStateDict | None = None,
        per_rank: dict[str, SupportsStateDict] | None = None,
        processor: Any = None,
        tokenizer: Any = None,
        s3_client_factory: Any = None,
        hf_api_factory: Any = None,
        process_group: dist.ProcessGroup | None = None,
        async_group: dist.ProcessGroup | None = None,
        frozen_params: bool = True,
        exporter: Callable[..., Path] | None = None,
    ) -> None:
        if config.max_keep == 0 or config.max_keep < -1:
            raise ValueError(f"[train.ckpt] max_keep must be -1 (keep all) or >= 1, got {config.max_keep}")
        self.config = config
        self.run_dir = Path(run_dir)
        self.checkpoints_dir = self.run_dir / layout.CHECKPOINTS_DIR
        self.safetensors_dir = self.run_dir / layout.SAFETENSORS_DIR
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.sampler = sampler
        self.per_rank = dict(per_rank or {})
        self.processor = processor
        self.tokenizer = tokenizer
        self.exporter = exporter
        self._options = StateDictOptions(ignore_frozen_params=not frozen_params, strict=frozen_params)
        self._dist = dist.is_initialized()
        if not self._dist:
            # DCP warns on every call that it assumes one process; that is what we asked for
            warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        self._group = process_group
        self.rank = dist.get_rank(process_group) if self._dist else 0
        self.world_size = dist.get_world_size(process_group) if self._dist else 1
        # the global rank of the group's first member: the source of what it decides for all
        self._src = dist.get_global_rank(process_group, 0) if self._dist and process_group is not None else 0
        self._log = get_logger("cosmos.checkpoint")
        self._async = config.save_mode == "async"
        if self._async and self._dist and process_group is not None and async_group is None:
            raise ValueError("save_mode = \"async\" with a process_group needs async_group: a gloo group over the "
                             "same ranks, made by every rank of the job (dist.new_group(ranks, backend=\"gloo\"))")
        # Background saves run collectives from another thread: they need a group of their own.
        self._async_group = async_group if async_group is not None else (
            dist.new_group(backend="gloo") if self._async and self._dist else None)
        self._committer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="cosmos-ckpt")
        self._inflight: concurrent.futures.Future[None] | None = None
        self._parent: str | None = None  # the checkpoint the live state descends from (lineage record)
        self.last_saved_step: int | None = None  # the step of the latest save() (in flight or complete)
        self._closed = False
        self.uploader: Uploader | None = None
        self._s3: UploadTarget | None = None
        self._hub: UploadTarget | None = None
        self._upload_s3 = "all" if config.upload_s3 is True else (config.upload_s3 or None)
        if self._upload_s3 or config.upload_hf:
            self._make_upload_targets(s3_client_factory, hf_api_factory)
        atexit.register(_wait_at_exit, weakref.ref(self))
        register_manager(self)  # a Ctrl-C under cp.checkpoint.exit_on_interrupt settles its saves

    def _barrier(self) -> None:
        if self._dist and self.world_size > 1:
            dist.barrier(group=self._group)

    # ----------------------------------------------------------------------------------- saving
    def should_save(self, step: int) -> bool:
        """True when ``step`` is on the ``save_freq`` schedule and checkpointing is enabled."""
        freq = self.config.save_freq
        return self.config.enable_checkpoint and freq > 0 and step > 0 and step % freq == 0

    def maybe_save(self, step: int, *, epoch: int = 0, weight_version: int | None = None,
                   extra: dict[str, Any] | None = None, force: bool = False) -> Path | None:
        """Save when :meth:`should_save` says so, or when ``force`` (e.g. the last step) and checkpointing is on.

        A scheduled save is accompanied by a ``safetensors/step_N`` export when ``export_safetensors``
        and ``export_every_save`` are set (a forced save is not: :meth:`export_final` follows it).

        Returns:
            The checkpoint folder, or None when nothing was saved.
        """
        scheduled = self.should_save(step)
        if not (scheduled or (force and self.config.enable_checkpoint)):
            return None
        path = self.save(step, epoch=epoch, weight_version=weight_version, extra=extra)
        if scheduled and self.config.export_safetensors and self.config.export_every_save:
            self.export(step)
        return path

    def save(self, step: int, *, epoch: int = 0, weight_version: int | None = None,
             extra: dict[str, Any] | None = None) -> Path:
        """Write ``<run_dir>/checkpoints/step_<step>`` (collective).

        RNG states, sampler position and weights are captured now; in async mode the writing
        continues in the background and the folder appears (renamed from ``step_N.tmp``) when it
        is complete. A previous save still in flight is waited for first.

        Args:
            step: optimizer steps completed.
            epoch: the loop's epoch counter.
            weight_version: defaults to ``step``.
            extra: small values of the caller, the same on every rank (e.g. a best metric).

        Returns:
            The folder the checkpoint will have once complete.
        """
        self.wait()
        if self._closed:
            raise RuntimeError("CheckpointManager.save() after close()")
        tmp = self.checkpoints_dir / (layout.step_dir_name(step) + layout.TMP_SUFFIX)
        final = self.checkpoints_dir / layout.step_dir_name(step)
        record = TrainState(step=step, epoch=epoch, weight_version=step if weight_version is None else weight_version,
                            extra=dict(extra or {}), world_size=self.world_size).to_record()
        state = self._state_to_save(record)
        if self.rank == 0:
            layout.remove_tree(tmp)  # a leftover from a crashed attempt at the same step
            tmp.mkdir(parents=True)
        self._barrier()
        started = time.monotonic()
        parent, self._parent = self._parent, str(final)
        self.last_saved_step = step
        if self._async:
            future = dcp.async_save(state, checkpoint_id=str(tmp), process_group=self._async_group,
                                    no_dist=not self._dist)
            self._inflight = self._committer.submit(self._finish_async, future, step, tmp, final, started, parent)
            self._log.debug("Saving checkpoint step %d in the background to %s", step, final)
            return final
        try:
            dcp.save(state, checkpoint_id=str(tmp), process_group=self._group, no_dist=not self._dist)
        except (Exception, CheckpointException) as exc:  # CheckpointException is a BaseException
            # DCP reports a failure on every rank, so no rank still writes into tmp
            raise RuntimeError(self._failed_save(final, tmp, exc)) from exc
        self._write_manifest(tmp)
        self._barrier()  # every rank's manifest is on disk before rank 0 marks the folder complete
        error = None
        if self.rank == 0:
            try:
                self._commit(step, tmp, final, started, parent)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
        error = broadcast_object(error, src=self._src, group=self._group)
        if error is not None:
            raise RuntimeError(f"committing checkpoint {final} failed on rank 0: {error}")
        return final

    def wait(self) -> None:
        """Block until a background save has finished; re-raise its error (naming the checkpoint)."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            inflight.result()

    def _state_to_save(self, record: dict[str, Any]) -> dict[str, Any]:
        state: dict[str, Any] = {}
        if self.optimizer is not None:
            state["model"], state["optimizer"] = get_state_dict(self.model, self.optimizer, options=self._options)
        else:
            state["model"] = get_model_state_dict(self.model, options=self._options)
        if self.scheduler is not None:
            state["scheduler"] = encode(self.scheduler.state_dict())
        state["train_state"] = encode(record)
        private = {"rng": capture_rng_state(), "sampler": self.sampler.state_dict() if self.sampler else None,
                   "per_rank": {name: obj.state_dict() for name, obj in self.per_rank.items()}}
        if hasattr(self.optimizer, "rank_state_dict"):
            private["optimizer"] = self.optimizer.rank_state_dict()
        # a key per rank: DCP keeps one copy of equal keys, while RNG streams differ between ranks
        state["rank_state"] = {f"rank{self.rank}": encode(private)}
        return state

    def _write_manifest(self, tmp: Path) -> None:
        # a failure here must not skip the barrier that follows: rank 0 finds the manifest missing
        try:
            write_rank_manifest(tmp, self.rank)
        except Exception as exc:
            self._log.error("rank %d could not write its checksum manifest into %s: %s", self.rank, tmp, exc)

    def _finish_async(self, future: concurrent.futures.Future[Any], step: int, tmp: Path, final: Path,
                      started: float, parent: str | None) -> None:
        failure: BaseException | None = None
        try:
            future.result()  # DCP wrote and fsynced this rank's files (and the metadata)
        except (Exception, CheckpointException) as exc:
            failure = exc
        else:
            self._write_manifest(tmp)
        if self._dist and self.world_size > 1:
            # this thread owns the async group until the next save waits for it
            dist.barrier(group=self._async_group)
        if failure is not None:
            raise RuntimeError("background " + self._failed_save(final, tmp, failure)) from failure
        if self.rank == 0:
            self._commit(step, tmp, final, started, parent)

    def _failed_save(self, final: Path, tmp: Path, exc: BaseException) -> str:
        """Rank 0 deletes the partial folder (a full disk gets its space back); returns the error message."""
        if self.rank == 0:
            layout.remove_tree(tmp)
        return _save_failure(final, tmp, exc)

    def _commit(self, step: int, tmp: Path, final: Path, started: float, parent: str | None) -> None:
        """Rank 0, after every rank's data, manifest and DCP's metadata are on disk: mark complete, publish, rotate."""
        if os.environ.get(PAUSE_ENV) == str(step):
            self._log.warning("test hook %s=%d: pausing before committing %s", PAUSE_ENV, step, tmp)
            time.sleep(600)
        missing = missing_manifests(tmp, self.world_size)
        if missing:
            raise RuntimeError(f"{tmp} lacks the checksum manifests {missing} (see those ranks' errors above); "
                               f"the checkpoint is left incomplete and will be cleaned up")
        seq = layout.next_seq(self.checkpoints_dir)
        layout.write_marker(tmp, layout.marker_info(step, self.world_size, seq=seq, parent=parent))
        layout.publish(tmp, final)
        self._log.info("Saved checkpoint step %d to %s (%.1f s)", step, final, time.monotonic() - started)
        self._rotate()
        if self._upload_s3 == "all":
            self._upload(self._s3, final)

    def _rotate(self) -> None:
        protected = frozenset(self.uploader.pending()) if self.uploader else frozenset()
        # a torn marker sorts as the newest: counted, it would be the one kept and every new save deleted.
        # It is left alone (not counted, not deleted); resume reports it and sets it aside.
        history = [p for p in layout.list_checkpoints(self.checkpoints_dir) if layout.is_readable(p)]
        for path in layout.rotate(history, self.config.max_keep, protected):
            self._log.debug("Removed old checkpoint %s (max_keep = %d)", path, self.config.max_keep)
        exports = [p for p in sorted(self.safetensors_dir.glob("step_*"), key=lambda p: layout.step_of(p) or -1)
                   if p.is_dir() and layout.step_of(p) is not None]
        for path in layout.rotate(exports, self.config.max_keep, protected):
            self._log.debug("Removed old export %s (max_keep = %d)", path, self.config.max_keep)
        self._prune_abandoned()

    def _prune_abandoned(self) -> None:
        """Keep the ``max_keep`` highest steps in each ``abandoned/`` folder (checkpoints and exports)."""
        for parent in (self.checkpoints_dir, self.safetensors_dir):
            for path in layout.rotate(layout.list_abandoned(parent), self.config.max_keep):
                self._log.debug("Removed set-aside folder %s (max_keep = %d)", path, self.config.max_keep)

    # ---------------------------------------------------------------------------------- loading
    def resume(self, resume: bool | str | Path, *, output_dir: str | Path | None = None) -> TrainState | None:
        """Restore the checkpoint ``[train] resume`` names, if any (collective).

        ``resume = false``: nothing. ``true``: the newest (in save order) complete checkpoint of this
        run directory (with ``output_dir``, else of the newest run under it that has one: that run's
        checkpoint is then loaded into this run's folder, so recipes pick both with
        :func:`cosmos_primitives.checkpoint.start_run` and pass its ``resume_from`` instead); none
        found means a fresh start (logged). A path: that checkpoint, or the newest complete one inside
        that folder; none found raises ``FileNotFoundError``.
        Incomplete folders of this run (``*.tmp``, unmarked) are deleted first.

        Each candidate's files are checked against its manifests (:func:`verify_checkpoint`); one
        that fails is skipped with a warning naming the file, and the next older one is tried
        (a path naming one ``step_N`` folder has no fallback). None verifying raises ``RuntimeError``.
        After loading, checkpoints and exports of this run newer than the loaded one (a rollback's
        abandoned future, or the damaged ones skipped) move to ``abandoned/``.

        Returns:
            The restored :class:`TrainState`, or None when starting fresh.
        """
        if resume is False or resume is None or resume == "":
            return None
        self.wait()  # cleaning below must not race a save of this manager
        choice: tuple[str | None, str | None] = (None, None)
        if self.rank == 0:
            self.clean_incomplete()
            where = Path(self.run_dir if resume is True else resume)
            candidates = layout.find_checkpoints(where)
            if resume is True and not candidates and output_dir is not None:
                where = Path(output_dir)
                candidates = layout.find_checkpoints(where)
            choice = self._newest_verified(candidates, where)
        found, error = broadcast_object(choice, src=self._src, group=self._group)
        if error is not None:
            raise RuntimeError(error)
        if found is None:
            if resume is True:
                self._log.info("resume = true but no complete checkpoint under %s: starting from step 0",
                               output_dir or self.run_dir)
                return None
            raise FileNotFoundError(
                f"[train] resume = {str(resume)!r}: no complete checkpoint there. A complete checkpoint is "
                f"a step_N folder holding a {layout.MARKER} file; point resume at one, at its run "
                f"directory, or set resume = true"
            )
        train = self.load(found)
        if self.rank == 0:
            self._set_aside_newer_than(Path(found), train.step)
        return train

    def _newest_verified(self, candidates: list[Path], where: Path) -> tuple[str | None, str | None]:
        """``(checkpoint, None)``: the newest of ``candidates`` (oldest first) whose files verify;
        ``(None, error)`` when none does; ``(None, None)`` when there are none."""
        failures = []
        for path in reversed(candidates):
            check = verify_checkpoint(path)
            if check.ok:
                if not check.checked:
                    self._log.warning("%s predates checksum manifests: loading it unverified", path)
                return str(path), None
            self._log.warning("Checkpoint %s fails verification, skipping it: %s", path, "; ".join(check.problems))
            failures.append(f"{path}: {'; '.join(check.problems)}")
        if not failures:
            return None, None
        return None, (f"no checkpoint under {where} verifies ({' | '.join(failures)}). Restore the damaged files "
                      f"from a copy, or point [train] resume at an older checkpoint")

    def _set_aside_newer_than(self, loaded: Path, step: int) -> None:
        """Rank 0: move this run's checkpoints saved after ``loaded`` or past ``step``, and exports past
        ``step``, to ``abandoned/``: a later ``resume = true`` must continue the history just resumed."""
        history = layout.list_checkpoints(self.checkpoints_dir)
        resolved = [p.resolve() for p in history]
        here = resolved.index(loaded.resolve()) if loaded.resolve() in resolved else None
        doomed = [p for i, p in enumerate(history)
                  if (here is not None and i > here) or (i != here and (layout.step_of(p) or 0) > step)]
        if self.safetensors_dir.is_dir():
            doomed += [p for p in sorted(self.safetensors_dir.glob("step_*")) if (layout.step_of(p) or -1) > step]
        for path in doomed:
            moved = layout.set_aside(path)
            self._log.warning("Moved %s to %s: it is newer than the resumed %s and will not be resumed",
                              path, moved, loaded)
        if doomed:
            self._prune_abandoned()

    def load(self, path: str | Path) -> TrainState:
        """Load the checkpoint folder ``path`` into the model, optimizer, scheduler, sampler and RNGs (collective)."""
        self.wait()
        path = Path(path)
        if not layout.is_complete(path):
            raise FileNotFoundError(
                f"{path} is not a complete checkpoint (no {layout.MARKER} marker in a step_N folder)")
        try:
            keys = set(dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata)
            saved_world = int(layout.read_marker(path).get("world_size", self.world_size))
        except (OSError, ValueError, AttributeError, EOFError) as exc:
            raise RuntimeError(f"checkpoint {path} is unreadable ({type(exc).__name__}: {exc}); "
                               f"cp.checkpoint.verify_checkpoint({str(path)!r}) names the damaged files") from exc
        has_optimizer = any(k.startswith("optimizer.") for k in keys)
        state: dict[str, Any] = {}
        if self.optimizer is not None and has_optimizer:
            state["model"], state["optimizer"] = get_state_dict(self.model, self.optimizer, options=self._options)
        else:
            state["model"] = get_model_state_dict(self.model, options=self._options)
            if self.optimizer is not None:
                self._log.warning("%s holds no optimizer state: the optimizer starts fresh", path)
        if self.scheduler is not None and "scheduler" in keys:
            state["scheduler"] = None
        state["train_state"] = None
        own_key = f"rank{self.rank}"
        rank_key = own_key if f"rank_state.{own_key}" in keys else "rank0"
        state["rank_state"] = {rank_key: None}
        try:
            dcp.load(state, checkpoint_id=str(path), process_group=self._group, no_dist=not self._dist)
        except (Exception, CheckpointException) as exc:  # CheckpointException is a BaseException
            raise RuntimeError(f"loading checkpoint {path} failed (was it written for this model? "
                               f"verify_checkpoint names damaged files): {exc}") from exc
        if "optimizer" in state:
            set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optimizer"], options=self._options)
        else:
            set_model_state_dict(self.model, state["model"], options=self._options)
        if state.get("scheduler") is not None:
            self.scheduler.load_state_dict(decode(state["scheduler"]))
        private = decode(state["rank_state"][rank_key])
        if self.sampler is not None and private.get("sampler") is not None:
            self.sampler.load_state_dict(private["sampler"])
        if rank_key == own_key:
            restore_rng_state(private["rng"])
            self._load_per_rank(path, private)
        else:
            self._log.warning(
                "checkpoint %s was written by %d ranks, this is rank %d of %d: its RNG streams are not "
                "restored and the sampler takes rank 0's position, so the resume is not bitwise exact",
                path, saved_world, self.rank, self.world_size)
        train = TrainState.from_record(decode(state["train_state"]), path)
        self._parent = str(path)
        self._log.info("Resumed from %s (step %d, epoch %d)", path, train.step, train.epoch)
        return train

    def _load_per_rank(self, path: Path, private: dict[str, Any]) -> None:
        """This rank's ``per_rank`` objects and optimizer rank state; what an older checkpoint lacks stays as built."""
        saved = private.get("per_rank") or {}
        for name, obj in self.per_rank.items():
            if name in saved:
                obj.load_state_dict(saved[name])
            else:
                self._log.warning("checkpoint %s holds no %r state (written before it was saved): it starts "
                                  "from its initial state", path, name)
        if hasattr(self.optimizer, "load_rank_state_dict"):
            if "optimizer" in private:
                self.optimizer.load_rank_state_dict(private["optimizer"])
            else:
                self._log.warning("checkpoint %s holds no per-rank optimizer state (written before it was "
                                  "saved): %s starts it afresh, so the resume is not bitwise exact",
                                  path, type(self.optimizer).__name__)

    def clean_incomplete(self) -> list[Path]:
        """Delete folders of this run that a crash left half-written (rank 0 only; returns them)."""
        if self.rank != 0:
            return []
        leftovers = layout.list_incomplete(self.checkpoints_dir)
        if self.safetensors_dir.is_dir():
            leftovers += sorted(p for p in self.safetensors_dir.iterdir() if p.name.endswith(layout.TMP_SUFFIX))
        for path in leftovers:
            self._log.info("Removing incomplete %s", path)
            layout.remove_tree(path)
        return leftovers

    def checkpoints(self) -> list[Path]:
        """Complete checkpoints of this run, oldest first."""
        return layout.list_checkpoints(self.checkpoints_dir)

    # ------------------------------------------------------------------------- export / upload
    def export(self, step: int | None = None) -> Path:
        """Export a Hugging Face folder (or the ``exporter``'s): ``safetensors/step_<step>``, or
        ``safetensors/final`` when ``step`` is None.

        Collective. Queues the uploads the config asks for (S3 ``"all"``: every export; ``"final"``:
        the final one; the Hub: the final one).
        """
        final = step is None
        out = self.safetensors_dir / (layout.FINAL_DIR if final else layout.step_dir_name(step))
        # a periodic export is part of its save, which "Saved checkpoint step N" reports: one line per save
        with contextlib.nullcontext() if final else quiet_exports():
            if self.exporter is not None:
                self.exporter(self.model, out, max_shard_size_gb=self.config.max_shard_size_gb,
                              dtype=self.config.export_dtype)
            else:
                export_safetensors(self.model, out, processor=self.processor, tokenizer=self.tokenizer,
                                   max_shard_size_gb=self.config.max_shard_size_gb, dtype=self.config.export_dtype)
        if self.rank == 0:
            if not final:
                self._rotate()
            if self._upload_s3 == "all" or (final and self._upload_s3 == "final"):
                self._upload(self._s3, out)
            if final and self.config.upload_hf:
                self._upload(self._hub, out, dest="")
        return out

    def export_final(self) -> Path | None:
        """``safetensors/final`` when ``export_safetensors`` is set (collective); else None."""
        return self.export() if self.config.export_safetensors else None

    def _make_upload_targets(self, s3_client_factory: Any, hf_api_factory: Any) -> None:
        from cosmos_primitives.checkpoint.hub_upload import HubTarget
        from cosmos_primitives.checkpoint.s3_upload import S3Target

        # checked on every rank so that a wrong config fails before training, everywhere
        if self._upload_s3:
            self._s3 = S3Target(self.config.s3_bucket, self.config.s3_prefix, client_factory=s3_client_factory)
        if self.config.upload_hf:
            self._hub = HubTarget(self.config.hf_repo_name, self.config.hf_private, api_factory=hf_api_factory)
        if self.rank == 0:
            self.uploader = Uploader(self.config.upload_retries, self.config.upload_backoff_s)

    def _upload(self, target: UploadTarget | None, local: Path, dest: str | None = None) -> None:
        if target is None or self.uploader is None:
            return
        if dest is None:
            dest = f"{self.run_dir.name}/{local.relative_to(self.run_dir).as_posix()}"
        self.uploader.submit(target, local, dest)

    # -------------------------------------------------------------------------------- shutdown
    def settle_after_interrupt(self) -> Path | None:
        """After a Ctrl-C: let the background save in flight finish (starting none), delete this run's
        half-written folders (rank 0), close; return the newest complete checkpoint (None: none yet).

        A second Ctrl-C while waiting stops the wait and returns None; the save's ``.tmp`` folder is
        then removed by the next ``resume``."""
        if not self._closed:
            try:
                self.wait()
            except KeyboardInterrupt:
                return None
            except Exception as exc:  # the previous checkpoint stays the newest; say why
                self._log.warning("the checkpoint save in flight failed: %s", exc)
            self._closed = True
            self._committer.shutdown(wait=False)
        self.clean_incomplete()
        done = self.checkpoints()
        return done[-1] if done else None

    def close(self, upload_timeout_s: float | None = None) -> list[UploadFailure]:
        """Wait for the background save and the uploads; return upload failures (rank 0; ``[]`` elsewhere).

        Call it on every rank before destroying the process group.
        """
        if self._closed:
            return list(self.uploader.failures) if self.uploader else []
        try:
            self.wait()
        finally:
            self._closed = True
            self._committer.shutdown(wait=True)
        failures: list[UploadFailure] = []
        if self.uploader is not None:
            failures = self.uploader.close(upload_timeout_s)
            self._rotate()  # folders kept for their uploads may go now
        return failures


def _root_errors(exc: BaseException) -> list[BaseException]:
    """``exc``, the per-rank errors a ``CheckpointException`` gathered, and their causes."""
    found, todo = [], [exc]
    while todo:
        e = todo.pop()
        if e is None or any(e is f for f in found):
            continue
        found.append(e)
        if isinstance(e, CheckpointException):
            todo += [pair[0] for pair in e.failures.values()]
        todo += [e.__cause__, e.__context__]
    return found


def _save_failure(final: Path, tmp: Path, exc: BaseException) -> str:
    """The message for a failed save of ``final``: says so plainly when a rank's disk is full."""
    full = [e for e in _root_errors(exc) if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)]
    if full:
        free = shutil.disk_usage(tmp.parent).free if tmp.parent.exists() else 0
        return (f"save of checkpoint {final} failed: the disk under {tmp.parent} is full or over quota "
                f"({type(full[0]).__name__}: {full[0]}; {free / 2**30:.2f} GiB free after deleting the partial "
                f"{tmp.name}). Free space, lower checkpoint.max_keep or point output_dir at a larger disk")
    return f"save of checkpoint {final} failed: {exc}"


def _wait_at_exit(ref: weakref.ReferenceType[CheckpointManager]) -> None:
    manager = ref()
    if manager is not None and not manager._closed:
        manager.wait()
