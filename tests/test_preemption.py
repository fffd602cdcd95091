"""cp.checkpoint.Preemption: a real signal to the process becomes a checkpoint at the step boundary and a
stop with exit status 75; ranks agree; ``[train] save_ckpt_at_exit`` / ``signal_to_handle`` (cosmos-rl's
keys) choose what is handled. The recipes' SIGTERM-and-resume runs are in test_sft_example.py,
test_grpo_colocated_example.py and test_wfm_resume.py."""

from __future__ import annotations

import os
import signal
import typing
from pathlib import Path

import pytest
import torch
from torch import nn

import cosmos_primitives as cp
from cosmos_primitives.checkpoint import PREEMPTED_EXIT_CODE, CheckpointManager, Preemption
from cosmos_primitives.checkpoint.layout import is_complete
from cosmos_primitives.checkpoint.preemption import CATCHABLE
from cosmos_primitives.config import CheckpointConfig, TrainConfig


def manager(run_dir: Path, **overrides) -> CheckpointManager:
    config = CheckpointConfig(**{"enable_checkpoint": True, "save_mode": "sync", "export_safetensors": False,
                                 **overrides})
    model = nn.Linear(3, 2)
    return CheckpointManager(config, run_dir, model=model, optimizer=torch.optim.AdamW(model.parameters()))


def test_a_signal_saves_at_the_step_boundary_and_exits_75(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGUSR1)
    ckpt = manager(tmp_path / "run")
    preemption = Preemption.from_config(TrainConfig())  # cosmos-rl's keys, ours by default: SIGUSR1, SIGTERM
    try:
        assert not preemption.stop_here(ckpt, 1)  # no signal: go on
        os.kill(os.getpid(), signal.SIGUSR1)  # handled: this process does not die
        os.kill(os.getpid(), signal.SIGTERM)  # a second one changes nothing
        assert preemption.received == "SIGUSR1"
        assert preemption.stop_here(ckpt, 3, epoch=1, extra=lambda: {"made": "at the stop"})
    finally:
        preemption.restore()
    assert signal.getsignal(signal.SIGUSR1) is before  # handlers put back
    saved = tmp_path / "run" / "checkpoints" / "step_3"
    assert is_complete(saved) and preemption.stopped_at == 3 and preemption.checkpoint == str(saved)
    state = manager(tmp_path / "run").resume(True)
    assert (state.step, state.epoch, state.extra) == (3, 1, {"made": "at the stop"})
    with pytest.raises(SystemExit) as exit_info:
        preemption.exit_if_stopped()
    assert exit_info.value.code == PREEMPTED_EXIT_CODE == 75
    ckpt.close()


def test_a_step_just_saved_is_not_saved_twice_and_without_checkpoints_it_only_stops(tmp_path: Path) -> None:
    ckpt = manager(tmp_path / "run", save_freq=2)
    preemption = Preemption(["SIGUSR2"])
    try:
        ckpt.maybe_save(2)
        os.kill(os.getpid(), signal.SIGUSR2)
        assert preemption.stop_here(ckpt, 2)
        assert [p.name for p in ckpt.checkpoints()] == ["step_2"]
        off = manager(tmp_path / "off", enable_checkpoint=False)
        assert preemption.stop_here(off, 5) and preemption.checkpoint is None
        assert not (tmp_path / "off" / "checkpoints").exists()
    finally:
        preemption.restore()
    ckpt.close()


def test_save_ckpt_at_exit_false_leaves_the_signals_alone(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    cfg = cp.load_config(None, ["train.save_ckpt_at_exit=false"])
    preemption = Preemption.from_config(cfg.train)
    assert not preemption.installed and signal.getsignal(signal.SIGTERM) is before
    assert not preemption.stop_here(manager(tmp_path / "run"), 1)
    preemption.exit_if_stopped()  # not stopped: returns


def test_signal_names_are_checked() -> None:
    with pytest.raises(ValueError, match=r"\['SIGKILL'\] cannot be handled"):
        Preemption(["SIGKILL"])
    field = typing.get_type_hints(TrainConfig)["signal_to_handle"]
    assert typing.get_args(typing.get_args(field)[0]) == CATCHABLE  # the config accepts exactly these
    assert cp.load_config(None, ['train.signal_to_handle=["SIGUSR1"]']).train.signal_to_handle == ["SIGUSR1"]
    with pytest.raises(cp.config.ConfigError, match="signal_to_handle"):
        cp.load_config(None, ['train.signal_to_handle=["SIGKILL"]'])


def _one_rank_signalled(run_dir: str) -> tuple[bool, bool, int | None]:
    """Rank 1 alone receives SIGUSR1 before the boundary of step 2: both ranks stop and save there."""
    import torch.distributed as dist

    ckpt = manager(Path(run_dir))
    preemption = Preemption(["SIGUSR1"])
    first = preemption.stop_here(ckpt, 1)
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGUSR1)
    stopped = preemption.stop_here(ckpt, 2)
    preemption.restore()
    ckpt.close()
    return first, stopped, preemption.stopped_at


def test_ranks_agree_when_the_signal_reaches_one_of_them(tmp_path: Path) -> None:
    results = cp.testing.run_distributed(_one_rank_signalled, 2, args=(str(tmp_path / "run"),))
    assert results == [(False, True, 2), (False, True, 2)]
    assert is_complete(tmp_path / "run" / "checkpoints" / "step_2")
