"""CheckpointManager in one process: exact round trip, rotation, async saves, incomplete folders,
resume selection, and a process killed (SIGKILL) in the middle of a save."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from cosmos_primitives.checkpoint import PAUSE_ENV, CheckpointManager, find_latest_checkpoint, list_checkpoints
from cosmos_primitives.checkpoint.layout import MARKER, rotate
from cosmos_primitives.config import CheckpointConfig


class CountingSampler:
    """A sampler-like object: a shuffled order per epoch and a position inside it."""

    def __init__(self, n: int = 32, seed: int = 0) -> None:
        self.n, self.seed, self.epoch, self.pos = n, seed, 0, 0

    def next_index(self) -> int:
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        index = int(order[self.pos])
        self.pos += 1
        if self.pos == self.n:
            self.epoch, self.pos = self.epoch + 1, 0
        return index

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]


class Setup:
    """Model with dropout, AdamW, warmup scheduler and sampler; every step draws from all three RNGs."""

    def __init__(self, seed: int) -> None:
        torch.manual_seed(seed)
        self.model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: min(1.0, (s + 1) / 4))
        self.sampler = CountingSampler()
        self.data = torch.linspace(-1, 1, 32 * 8).reshape(32, 8)

    def manager(self, run_dir: Path, **overrides) -> CheckpointManager:
        cfg = CheckpointConfig(**{"enable_checkpoint": True, "save_mode": "sync", "save_freq": 1,
                                  "export_safetensors": False, **overrides})
        return CheckpointManager(cfg, run_dir, model=self.model, optimizer=self.optimizer,
                                 scheduler=self.scheduler, sampler=self.sampler)

    def step(self) -> float:
        x = self.data[self.sampler.next_index()] + 0.1 * torch.randn(8)
        x = x * (1.0 + random.random()) + float(np.random.normal())
        loss = self.model(x).pow(2).mean()
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad()
        return loss.item()


def _params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_round_trip_continues_bitwise(tmp_path: Path) -> None:
    run = tmp_path / "20260101000000"
    a = Setup(seed=0)
    ckpt = a.manager(run)
    for _ in range(3):
        a.step()
    path = ckpt.save(3, epoch=1, weight_version=7, extra={"best": 0.5, "note": "x"})
    ckpt.close()
    after = [a.step() for _ in range(4)]

    b = Setup(seed=123)  # different weights; every RNG is in another state too
    random.seed(99)
    np.random.seed(99)
    state = b.manager(run).resume(True)
    assert state is not None and state.path == path
    assert (state.step, state.epoch, state.weight_version, state.extra) == (3, 1, 7, {"best": 0.5, "note": "x"})
    assert b.sampler.state_dict() == {"epoch": 0, "pos": 3}
    assert b.scheduler.last_epoch == 3
    resumed = [b.step() for _ in range(4)]
    assert resumed == after  # bitwise: same weights, moments, lr, sampler, dropout masks, numpy/python draws
    for k, v in _params(a.model).items():
        assert torch.equal(v, _params(b.model)[k]), k


def test_per_rank_objects_such_as_bad_sample_counts_survive_a_resume(tmp_path: Path) -> None:
    from cosmos_primitives.data import BadSampleError, BadSampleTracker

    a = Setup(seed=0)
    bad = BadSampleTracker(10)
    bad.record(BadSampleError("clips/a.mp4", "no video stream"))
    bad.record(BadSampleError("clips/a.mp4", "no video stream"))
    bad.record(BadSampleError("clips/b.mp4", "truncated"))
    cfg = CheckpointConfig(enable_checkpoint=True, save_mode="sync", export_safetensors=False)
    a.step()
    CheckpointManager(cfg, tmp_path / "run", model=a.model, optimizer=a.optimizer, sampler=a.sampler,
                      per_rank={"bad_samples": bad}).save(1)
    bad.record(BadSampleError("clips/c.mp4", "after the save"))  # not in the checkpoint

    b = Setup(seed=0)
    resumed = BadSampleTracker(10)
    CheckpointManager(cfg, tmp_path / "run", model=b.model, optimizer=b.optimizer, sampler=b.sampler,
                      per_rank={"bad_samples": resumed}).resume(True)
    assert resumed.count == 3
    assert resumed.worst() == [("clips/a.mp4", 2, "no video stream"), ("clips/b.mp4", 1, "truncated")]

    # a checkpoint written before per-rank objects were saved still loads; the object keeps its state
    CheckpointManager(cfg, tmp_path / "old", model=a.model, optimizer=a.optimizer, sampler=a.sampler).save(1)
    fresh = BadSampleTracker(10)
    CheckpointManager(cfg, tmp_path / "old", model=b.model, optimizer=b.optimizer, sampler=b.sampler,
                      per_rank={"bad_samples": fresh}).resume(True)
    assert fresh.count == 0 and b.sampler.state_dict() == a.sampler.state_dict()


def test_frozen_params_can_stay_out_of_checkpoints(tmp_path: Path) -> None:
    a = Setup(seed=0)
    a.model[0].requires_grad_(False)  # a frozen base, rebuilt by the resuming run
    a.optimizer = torch.optim.AdamW([p for p in a.model.parameters() if p.requires_grad], lr=1e-2)
    a.scheduler = torch.optim.lr_scheduler.LambdaLR(a.optimizer, lambda s: 1.0)
    cfg = CheckpointConfig(enable_checkpoint=True, save_mode="sync", export_safetensors=False)
    ckpt = CheckpointManager(cfg, tmp_path, model=a.model, optimizer=a.optimizer, sampler=a.sampler,
                             frozen_params=False)
    a.step()
    path = ckpt.save(1)
    ckpt.close()
    after = [a.step() for _ in range(3)]
    import torch.distributed.checkpoint as dcp

    saved = set(dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata)
    assert "model.3.weight" in saved and not any(k.startswith("model.0.") for k in saved)

    b = Setup(seed=0)  # the same frozen layer as built; the trained one differs until loaded
    b.model[0].requires_grad_(False)
    b.model[3].weight.data.add_(1.0)
    b.optimizer = torch.optim.AdamW([p for p in b.model.parameters() if p.requires_grad], lr=1e-2)
    b.scheduler = torch.optim.lr_scheduler.LambdaLR(b.optimizer, lambda s: 1.0)
    CheckpointManager(cfg, tmp_path, model=b.model, optimizer=b.optimizer, sampler=b.sampler,
                      frozen_params=False).resume(True)
    assert [b.step() for _ in range(3)] == after
    with pytest.raises(RuntimeError, match="was it written for this model"):  # the default wants every weight
        CheckpointManager(cfg, tmp_path, model=Setup(seed=0).model).load(path)


def test_rotation_keeps_newest(tmp_path: Path) -> None:
    s = Setup(seed=0)
    ckpt = s.manager(tmp_path, max_keep=2)
    for step in range(1, 5):
        s.step()
        ckpt.maybe_save(step)
    ckpt.close()
    assert [p.name for p in list_checkpoints(tmp_path / "checkpoints")] == ["step_3", "step_4"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_3", "step_4"]

    keep_all = Setup(seed=0).manager(tmp_path / "all", max_keep=-1, save_freq=2)
    for step in range(1, 7):
        keep_all.maybe_save(step)
    keep_all.close()
    assert [p.name for p in keep_all.checkpoints()] == ["step_2", "step_4", "step_6"]


def test_rotate_spares_protected_and_newest(tmp_path: Path) -> None:
    folders = []
    for i in range(4):
        (tmp_path / f"step_{i}").mkdir()
        folders.append(tmp_path / f"step_{i}")
    deleted = rotate(folders, max_keep=1, protected={folders[1]})
    assert deleted == [folders[0], folders[2]]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1", "step_3"]
    assert rotate(folders[1:2] + folders[3:], max_keep=-1) == []


def test_async_save_snapshots_at_call_time(tmp_path: Path) -> None:
    s = Setup(seed=0)
    ckpt = s.manager(tmp_path, save_mode="async", max_keep=-1)
    s.step()
    before = _params(s.model)
    ckpt.save(1)
    with torch.no_grad():  # the loop keeps changing weights while the save runs
        for p in s.model.parameters():
            p.add_(1.0)
    ckpt.save(2)  # waits for step 1 first: never two in flight
    after = _params(s.model)
    ckpt.close()
    assert [p.name for p in ckpt.checkpoints()] == ["step_1", "step_2"]

    fresh = Setup(seed=5)
    fresh.manager(tmp_path).load(tmp_path / "checkpoints" / "step_1")
    assert all(torch.equal(before[k], v) for k, v in _params(fresh.model).items())
    fresh.manager(tmp_path).load(tmp_path / "checkpoints" / "step_2")
    assert all(torch.equal(after[k], v) for k, v in _params(fresh.model).items())


def test_incomplete_folders_are_ignored_and_cleaned(tmp_path: Path) -> None:
    s = Setup(seed=0)
    ckpt = s.manager(tmp_path, max_keep=-1)
    ckpt.save(2)
    ckpt.close()
    root = tmp_path / "checkpoints"
    (root / "step_5.tmp").mkdir()
    (root / "step_5.tmp" / "__0_0.distcp").write_bytes(b"half written")
    (root / "step_6").mkdir()  # a step folder without the completion marker
    (root / "step_6" / ".metadata").write_bytes(b"garbage")
    (tmp_path / "safetensors" / "final.tmp").mkdir(parents=True)
    assert find_latest_checkpoint(tmp_path).name == "step_2"

    state = Setup(seed=1).manager(tmp_path).resume(True)
    assert state.step == 2
    assert sorted(p.name for p in root.iterdir()) == ["step_2"]
    assert not (tmp_path / "safetensors" / "final.tmp").exists()


def test_resume_selection(tmp_path: Path) -> None:
    out = tmp_path / "outputs"
    older, newer = out / "20260101000000", out / "20260102000000"
    s = Setup(seed=0)
    first = s.manager(older, max_keep=-1)
    first.save(4)
    first.save(8)
    first.close()
    newer.mkdir(parents=True)  # a later run that crashed before its first checkpoint

    # resume = true looks in its own run directory only, unless told where else to look
    assert Setup(seed=1).manager(newer).resume(True) is None
    assert Setup(seed=1).manager(newer).resume(True, output_dir=out).step == 8
    assert Setup(seed=1).manager(newer).resume(str(older / "checkpoints" / "step_4")).step == 4
    assert Setup(seed=1).manager(newer).resume(False) is None
    assert Setup(seed=1).manager(tmp_path / "elsewhere").resume(True, output_dir=tmp_path / "empty") is None
    with pytest.raises(FileNotFoundError, match="no complete checkpoint there"):
        Setup(seed=1).manager(newer).resume(str(newer))


def test_bad_max_keep_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_keep must be -1"):
        Setup(seed=0).manager(tmp_path, max_keep=0)


def test_should_save_schedule(tmp_path: Path) -> None:
    ckpt = Setup(seed=0).manager(tmp_path, save_freq=3)
    assert [s for s in range(0, 10) if ckpt.should_save(s)] == [3, 6, 9]
    off = Setup(seed=0).manager(tmp_path, enable_checkpoint=False)
    assert not off.should_save(100) and off.maybe_save(100, force=True) is None


_CRASH_SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    from cosmos_primitives.checkpoint import CheckpointManager
    from cosmos_primitives.config import CheckpointConfig

    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.AdamW(model.parameters())
    cfg = CheckpointConfig(enable_checkpoint=True, save_mode=sys.argv[2], save_freq=1, max_keep=1,
                           export_safetensors=False)
    ckpt = CheckpointManager(cfg, sys.argv[1], model=model, optimizer=opt)
    for step in (1, 2):
        model(torch.randn(4, 64)).sum().backward()
        opt.step()
        opt.zero_grad()
        ckpt.maybe_save(step)
        print(f"saved {step}", flush=True)
    ckpt.close()
    """
)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_kill_during_save_leaves_previous_checkpoint(tmp_path: Path, mode: str) -> None:
    run = tmp_path / "20260101000000"
    script = tmp_path / "train.py"
    script.write_text(_CRASH_SCRIPT)
    env = {**os.environ, PAUSE_ENV: "2", "COSMOS_LOG_LEVEL": "INFO"}
    proc = subprocess.Popen([sys.executable, str(script), str(run), mode], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        for line in proc.stderr:  # the hook logs once step 2's data is written, before its marker
            if "test hook" in line or time.monotonic() > deadline:
                break
        assert proc.poll() is None, proc.stderr.read()
        tmp = run / "checkpoints" / "step_2.tmp"
        assert (tmp / ".metadata").exists() and not (tmp / MARKER).exists()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL

    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["step_1"]  # max_keep=1 kept it
    torch.manual_seed(1)
    model = nn.Linear(64, 64)
    opt = torch.optim.AdamW(model.parameters())
    cfg = CheckpointConfig(enable_checkpoint=True, save_mode="sync", export_safetensors=False)
    state = CheckpointManager(cfg, run, model=model, optimizer=opt).resume(True)
    assert state.step == 1 and state.path.name == "step_1"
    assert not (run / "checkpoints" / "step_2.tmp").exists()
    assert int(opt.state_dict()["state"][0]["step"]) == 1
