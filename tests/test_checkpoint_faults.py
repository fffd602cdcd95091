"""Checkpoints under faults: a rollback to an older checkpoint (rotation and "latest" follow the
run's save history), damaged files in the newest checkpoint (checksums, fallback, clear errors), and
the non-finite loss / gradient guard."""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from cosmos_primitives.checkpoint import CheckpointManager, list_checkpoints, verify_checkpoint
from cosmos_primitives.checkpoint.layout import MARKER
from cosmos_primitives.config import CheckpointConfig
from cosmos_primitives.policy import NonFiniteError, check_finite
from cosmos_primitives.testing import run_distributed
from test_checkpoint import Setup


@pytest.fixture
def ckpt_logs(caplog: pytest.LogCaptureFixture):
    logger = logging.getLogger("cosmos")  # it does not propagate to the root logger
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="cosmos")
    yield caplog
    logger.removeHandler(caplog.handler)


def _weights_sum(model: torch.nn.Module) -> str:
    return repr(sum(float(p.detach().sum()) for p in model.parameters()))


def _exporting(setup: Setup, run: Path, **overrides) -> CheckpointManager:
    """``setup``'s manager with an export after every save (a file naming the weights' sum, so an
    export can be told apart by the run that wrote it)."""
    def exporter(model, out: Path, **_) -> Path:
        out.mkdir(parents=True)
        (out / "weights.txt").write_text(_weights_sum(model))
        return out

    cfg = CheckpointConfig(**{"enable_checkpoint": True, "save_mode": "sync", "export_safetensors": True,
                              "export_every_save": True, **overrides})
    return CheckpointManager(cfg, run, model=setup.model, optimizer=setup.optimizer, scheduler=setup.scheduler,
                             sampler=setup.sampler, exporter=exporter)


def test_rollback_keeps_the_new_history_and_sets_the_abandoned_future_aside(tmp_path: Path) -> None:
    run = tmp_path / "20260101000000"
    first = Setup(seed=0)
    ckpt = _exporting(first, run, max_keep=-1, save_freq=2)
    for step in range(1, 7):  # checkpoints and exports step_2, step_4, step_6
        first.step()
        ckpt.maybe_save(step)
    ckpt.close()
    abandoned_exports = {n: (run / "safetensors" / n / "weights.txt").read_text() for n in ("step_4", "step_6")}

    # roll back to step_2 in the same run directory (resume = <run>/checkpoints/step_2), max_keep = 1
    again = Setup(seed=1)
    rolled = _exporting(again, run, max_keep=1, save_freq=1)
    assert rolled.resume(str(run / "checkpoints" / "step_2")).step == 2
    again.step()
    rolled.maybe_save(3)
    rolled.close()

    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["step_3"]
    aside = run / "checkpoints" / "abandoned"
    # moved, not deleted; then abandoned/ is pruned with the same max_keep (1): the newest stays
    assert sorted(p.name for p in aside.iterdir()) == ["step_6"]
    # the exports follow the checkpoints: rotation by step would otherwise keep step_6 and drop the new step_3
    exports = run / "safetensors"
    assert sorted(p.name for p in exports.iterdir()) == ["abandoned", "step_3"]
    assert {p.name: (p / "weights.txt").read_text() for p in (exports / "abandoned").iterdir()} == {
        "step_6": abandoned_exports["step_6"]}
    assert (exports / "step_3" / "weights.txt").read_text() == _weights_sum(again.model)
    later = Setup(seed=2).manager(run).resume(True)
    assert later.step == 3 and later.path.name == "step_3"


def _shard(path: Path) -> Path:
    return path / "__0_0.distcp"


def _truncate(path: Path) -> None:
    data = _shard(path).read_bytes()
    _shard(path).write_bytes(data[: len(data) // 2])


def _zero_bytes(path: Path) -> None:
    _shard(path).write_bytes(b"")


def _no_metadata(path: Path) -> None:
    (path / ".metadata").unlink()


def _torn_marker(path: Path) -> None:
    text = (path / MARKER).read_text()
    (path / MARKER).write_text(text[: len(text) // 2])


def _flipped_bytes(path: Path) -> None:
    data = bytearray(_shard(path).read_bytes())
    middle = len(data) // 2
    data[middle : middle + 8] = b"\x7f\xff\xff\xff\x7f\xff\xff\xff"  # same size, other bytes
    _shard(path).write_bytes(bytes(data))


DAMAGES: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated": (_truncate, "__0_0.distcp"),
    "zero_bytes": (_zero_bytes, "__0_0.distcp"),
    "no_metadata": (_no_metadata, ".metadata"),
    "torn_marker": (_torn_marker, MARKER),
    "flipped_bytes": (_flipped_bytes, "__0_0.distcp"),
}


# every damage with sync saves; the async path writes the same files, so two kinds cover it
CASES = [(damage, "sync") for damage in sorted(DAMAGES)] + [("truncated", "async"), ("flipped_bytes", "async")]


@pytest.mark.parametrize(("damage", "mode"), CASES)
def test_damaged_newest_checkpoint_falls_back_exactly(tmp_path: Path, damage: str, mode: str, ckpt_logs) -> None:
    run = tmp_path / "20260101000000"
    a = Setup(seed=0)
    ckpt = a.manager(run, max_keep=-1, save_freq=2, save_mode=mode)
    for step in range(1, 5):  # checkpoints step_2 and step_4
        a.step()
        ckpt.maybe_save(step)
    ckpt.close()
    reference = Setup(seed=7)
    reference.manager(run).load(run / "checkpoints" / "step_2")
    expected = [reference.step() for _ in range(3)]

    damage_fn, culprit = DAMAGES[damage]
    damage_fn(run / "checkpoints" / "step_4")
    assert not verify_checkpoint(run / "checkpoints" / "step_4").ok

    b = Setup(seed=3)
    state = b.manager(run, max_keep=1).resume(True)
    assert state.step == 2 and state.path.name == "step_2"
    assert [b.step() for _ in range(3)] == expected  # bitwise, as if resumed from step_2 directly
    skipped = [r.getMessage() for r in ckpt_logs.records if "step_4" in r.getMessage() and "skip" in r.getMessage()]
    assert skipped and culprit in skipped[0], [r.getMessage() for r in ckpt_logs.records]
    # the damaged one is set aside: neither resumed later nor a reason for rotation to drop step_2
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["step_2"]


def test_no_checkpoint_verifies_stops_with_a_clear_error(tmp_path: Path) -> None:
    run = tmp_path / "20260101000000"
    ckpt = Setup(seed=0).manager(run, max_keep=-1)
    ckpt.save(1)
    ckpt.save(2)
    ckpt.close()
    _zero_bytes(run / "checkpoints" / "step_1")
    _no_metadata(run / "checkpoints" / "step_2")
    with pytest.raises(RuntimeError, match=r"no checkpoint under .* verifies.*step_2.*\.metadata.*step_1"):
        Setup(seed=1).manager(run).resume(True)
    with pytest.raises(RuntimeError, match=r"step_1.*__0_0\.distcp.*size"):
        Setup(seed=1).manager(run).resume(str(run / "checkpoints" / "step_1"))


def test_manifest_lists_every_file_with_size_and_hash(tmp_path: Path) -> None:
    ckpt = Setup(seed=0).manager(tmp_path)
    path = ckpt.save(1)
    ckpt.close()
    manifest = json.loads((path / "MANIFEST_rank0.json").read_text())
    written = {p.name for p in path.iterdir()} - {MARKER, "MANIFEST_rank0.json"}
    assert set(manifest["files"]) == written and ".metadata" in written
    for name, entry in manifest["files"].items():
        data = (path / name).read_bytes()
        assert (entry["size"], entry["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
    assert verify_checkpoint(path).ok


@pytest.mark.parametrize("loss, grad_norm", [(float("nan"), 1.0), (1.0, float("inf")), (torch.tensor(-math.inf), None)])
def test_nonfinite_loss_or_gradient_stops_or_skips(loss, grad_norm) -> None:
    with pytest.raises(NonFiniteError, match=r"step 12.*\[train\] nonfinite"):
        check_finite(loss, grad_norm, step=12, mode="stop")
    assert check_finite(loss, grad_norm, step=12, mode="skip") is False
    assert check_finite(torch.tensor(0.5), torch.tensor(2.0), step=12, mode="stop") is True
    with pytest.raises(ValueError, match=r"\[train\] nonfinite"):
        check_finite(1.0, 1.0, step=1, mode="ignore")


def test_the_nonfinite_error_does_not_promise_the_checkpoints_are_clean() -> None:
    # weights made non-finite by a huge learning rate are saved before the next loss is NaN
    with pytest.raises(NonFiniteError) as info:
        check_finite(float("nan"), None, step=3, mode="stop")
    assert "no checkpoint holds" not in str(info.value)
    assert "weights already are" in str(info.value) and "learning rate" in str(info.value)


def _one_rank_sees_a_nan() -> dict[str, list[str]]:
    rank = torch.distributed.get_rank()
    outcomes: dict[str, list[str]] = {"skip": [], "stop": []}
    for mode, seen in outcomes.items():
        for step, loss in ((1, 0.5), (2, float("nan") if rank == 1 else 0.5), (3, 0.25)):
            try:
                seen.append(str(check_finite(torch.tensor(loss), torch.tensor(1.0), step=step, mode=mode)))
            except NonFiniteError as exc:
                seen.append(f"stop: {exc}")
    return outcomes


def test_every_rank_gets_the_same_answer_when_one_rank_sees_a_nan() -> None:
    skip, stop = zip(*((r["skip"], r["stop"]) for r in run_distributed(_one_rank_sees_a_nan, 2, timeout_s=120)))
    assert list(skip) == [["True", "False", "True"]] * 2
    assert [(r[0], r[2]) for r in stop] == [("True", "True")] * 2
    assert all(r[1].startswith("stop: step 2: non-finite loss") for r in stop)
    assert "loss nan" in stop[1][1] and "loss 0.5" in stop[0][1]  # each rank reports its own values


def test_an_unreadable_marker_does_not_make_rotation_drop_every_new_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "20260101000000"
    old = Setup(seed=0).manager(run, max_keep=-1)
    old.save(1)
    old.close()
    _torn_marker(run / "checkpoints" / "step_1")  # sorts as the newest in save order

    ckpt = Setup(seed=1).manager(run, max_keep=1)
    ckpt.save(2)
    ckpt.save(3)
    ckpt.close()
    # the new history keeps its newest checkpoint; the torn one is left for resume to report and set aside
    assert (run / "checkpoints" / "step_3" / MARKER).is_file()
    assert not (run / "checkpoints" / "step_2").exists()
    assert (run / "checkpoints" / "step_1").is_dir()


def test_abandoned_checkpoints_and_exports_are_pruned_with_max_keep(tmp_path: Path) -> None:
    run = tmp_path / "20260101000000"
    setup = Setup(seed=0)
    ckpt = _exporting(setup, run, max_keep=-1, save_freq=1)
    for step in range(1, 5):
        setup.step()
        ckpt.maybe_save(step)
    ckpt.close()
    # two rollbacks, each setting newer checkpoints aside: step_2..4, then step_2 of the second history
    for target in ("step_1", "step_1"):
        again = Setup(seed=1)
        rolled = _exporting(again, run, max_keep=2, save_freq=1)
        assert rolled.resume(str(run / "checkpoints" / target)).step == 1
        again.step()
        rolled.maybe_save(2)
        rolled.close()
    for aside in (run / "checkpoints" / "abandoned", run / "safetensors" / "abandoned"):
        kept = sorted(p.name for p in aside.iterdir())
        assert len(kept) == 2, (aside, kept)  # max_keep = 2 of the four set aside, newest kept
        assert "step_4" in kept, kept


def test_a_full_disk_during_a_sync_save_is_a_clear_exception(tmp_path: Path, monkeypatch) -> None:
    import errno

    import torch.distributed.checkpoint.filesystem as dcp_fs

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    ckpt = Setup(seed=0).manager(tmp_path / "20260101000000")
    monkeypatch.setattr(dcp_fs, "_write_item", no_space)
    with pytest.raises(Exception, match=r"step_1 failed: the disk under .* is full.*No space left"):
        ckpt.save(1)  # an Exception (``except Exception`` catches it), not DCP's bare BaseException
    monkeypatch.undo()
    assert ckpt.checkpoints() == [] and not (ckpt.checkpoints_dir / "step_1.tmp").exists()  # space given back
    ckpt.save(2)  # the manager still works once there is space again
    ckpt.close()
    assert [p.name for p in ckpt.checkpoints()] == ["step_2"]
