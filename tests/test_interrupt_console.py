"""Ctrl-C and the console, as a user meets them: SIGINT stops a recipe with the resume command and
exit status 130 (no traceback, no half-written checkpoint), a resumed run's ``metrics.jsonl`` holds
each step once, and log lines print above the progress bar instead of being glued into it."""

from __future__ import annotations

import contextlib
import io
import json
import os
import pty
import re
import signal
import struct
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tqdm import tqdm

import cosmos_primitives as cp
from cosmos_primitives.checkpoint.interrupt import INTERRUPTED_EXIT_CODE, resume_command
from cosmos_primitives.config.logging import LoggingConfig
from cosmos_primitives.logging import MetricsTracker, read_metrics
from cosmos_primitives.testing.demo_assets import ensure_demo_assets
from cosmos_primitives.testing.recipe_runs import finish, kill_when, launch_recipe, only_run_dir

REPO = Path(__file__).resolve().parents[1]
SFT_CONFIG = REPO / "examples" / "configs" / "sft_tiny.toml"


def segments(text: str) -> list[str]:
    """What a terminal shows as separate line starts: ``text`` cut at carriage returns and newlines."""
    return [s for s in re.split(r"[\r\n]", text) if s.strip()]


def glued_log_lines(text: str) -> list[str]:
    """Segments where a ``[cosmos]`` log record does not start its own line (printed into a bar)."""
    return [s for s in segments(text) if "[cosmos]" in s and not s.startswith("[rank")]


# ----------------------------------------------------------------------------------- fast, in process
def test_log_records_print_above_an_active_bar(capfd: pytest.CaptureFixture[str]) -> None:
    bar = tqdm(total=10, desc="[SFT]", file=sys.stderr, ncols=100)
    bar.update(3)
    cp.logging.get_logger().info("Saved checkpoint step 3 to somewhere")
    bar.update(1)
    bar.close()
    err = capfd.readouterr().err
    assert "Saved checkpoint step 3" in err
    assert not glued_log_lines(err), segments(err)


def test_resumed_tracker_drops_replayed_rows_and_its_bar_starts_at_the_resumed_step(tmp_path: Path) -> None:
    with MetricsTracker(tmp_path, LoggingConfig(logger=[]), rank=0, total_steps=6) as first:
        for step in range(1, 6):  # the interrupted run got to step 5; its last checkpoint is step 3
            first.log_metrics({"loss": 1.0 / step, "run": 1}, step)
        first.log_metrics({"val/avg_loss": 0.5}, 3)
    terminal = io.StringIO()
    with MetricsTracker(tmp_path, LoggingConfig(), rank=0, total_steps=6, terminal=terminal,
                        resumed_step=3) as second:
        assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 3]  # rewritten before any new row
        for step in range(4, 7):
            second.log_metrics({"loss": 2.0 / step, "run": 2}, step)
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4, 5, 6]  # each step once
    assert [r["run"] for r in records if "loss" in r] == [1, 1, 1, 2, 2, 2]  # the resumed run's values
    assert not list(tmp_path.glob("*.tmp"))
    frames = segments(terminal.getvalue())
    assert "3/6" in frames[0], frames  # the bar starts where the run resumed, not at 0/6
    assert "6/6" in frames[-1]


def test_resume_command_sets_train_resume_true() -> None:
    assert resume_command(["python", "examples/sft.py", "--config", "a b.toml", "train.resume=false",
                           "train.max_steps=4"]) == (
        "python examples/sft.py --config 'a b.toml' train.max_steps=4 train.resume=true")


# ------------------------------------------------------------------------- slow, the recipe end to end
@pytest.fixture(scope="module")
def sft_assets(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root = tmp_path_factory.mktemp("sft_assets")
    paths = [f"policy.model_name_or_path={root / 'model'}", f"train.train_policy.dataset.name={root / 'video_qa'}"]
    ensure_demo_assets(cp.load_config(SFT_CONFIG, [p.replace("=", "=demo:", 1) for p in paths]
                                      + ["custom.demo_items=16"]))
    return paths


def leftovers(run_dir: Path) -> list[Path]:
    return sorted(run_dir.glob("*/*.tmp"))


@contextlib.contextmanager
def sigint_as_in_a_terminal() -> Iterator[None]:
    """Start children with SIGINT deliverable and at its default action, as a terminal gives a command.

    Two things a test runner can pass on that a child keeps across ``exec`` (POSIX): SIGINT ignored (a
    suite started as a background job of a non-interactive shell, ``make test &``) and SIGINT blocked
    in the signal mask (some CI runners). Either way the recipe would never see the Ctrl-C. ``Popen``
    forks from this thread, so this thread's mask is the child's.
    """
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    was_blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        if was_blocked:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, previous)


def sigint_state(pid: int) -> str:
    """The signal-mask lines of ``/proc/<pid>/status`` (blocked, ignored, caught), for a failure message."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return " ".join(line.replace("\t", " ") for line in lines if line.startswith(("SigBlk", "SigIgn", "SigCgt")))


def sigint_state_between_thread_starts(pid: int, tries: int = 100) -> str:
    """``sigint_state``, read again (every 10 ms, ``tries`` times) while it shows SIGINT not caught: glibc's
    ``pthread_create`` blocks every signal in the creating thread for the moment it starts a thread (the
    recipe starts checkpoint and loader threads), which a single read can land in. A SIGINT sent then
    waits, pending, and is delivered when the mask is restored."""
    state = sigint_state(pid)
    for _ in range(tries):
        if catches_sigint(state):
            break
        time.sleep(0.01)
        state = sigint_state(pid)
    return state


def catches_sigint(state: str) -> bool:
    """Whether a ``sigint_state`` shows SIGINT (signal 2) caught and neither blocked nor ignored."""
    masks = dict(part.split(":") for part in state.replace(": ", ":").split())
    bit = 1 << (signal.SIGINT - 1)
    return bool(int(masks["SigCgt"], 16) & bit) and not int(masks["SigBlk"], 16) & bit \
        and not int(masks["SigIgn"], 16) & bit


@pytest.mark.slow
def test_sigint_stops_with_the_resume_command_and_the_resumed_metrics_hold_each_step_once(
        sft_assets: list[str], tmp_path: Path) -> None:
    # 20 steps: the signal, sent once step 3 is logged, lands with seconds of the run left even on a
    # loaded machine (with 6 steps the run once finished before the signal arrived)
    overrides = [*sft_assets, f"train.output_dir={tmp_path / 'runs'}", "train.max_steps=20", "train.ckpt.save_freq=2",
                 "train.ckpt.export_safetensors=true"]
    log = tmp_path / "run.log"
    with sigint_as_in_a_terminal():
        proc = launch_recipe("examples/sft.py", SFT_CONFIG, overrides, log, cwd=REPO)
    rows = lambda: sum(len(p.read_text().splitlines()) for p in (tmp_path / "runs").glob("*/metrics.jsonl"))  # noqa: E731
    seen: list[str] = []  # the recipe's signal state when the signal is sent

    def step_3_logged() -> bool:
        if rows() < 3:
            return False
        seen.append(sigint_state_between_thread_starts(proc.pid))
        return True

    kill_when(proc, step_3_logged, log, "step 3 was logged", sig=signal.SIGINT)
    text = log.read_text(errors="replace")
    assert catches_sigint(seen[-1]), f"the recipe could not receive SIGINT: {seen[-1]}"
    assert proc.returncode == INTERRUPTED_EXIT_CODE, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    match = re.search(r"stopped at step (\d+); resume with: (.*)$", text, re.M)
    assert match, text[-3000:]
    assert match.group(2).endswith("train.resume=true") and "examples/sft.py" in match.group(2)
    run_dir = only_run_dir(tmp_path / "runs")
    assert not leftovers(run_dir)  # no step_N.tmp for the next run to trip over
    stopped = int(match.group(1))
    assert stopped >= 3 and stopped == max(r["step"] for r in read_metrics(run_dir))

    resumed_at = time.time()
    resume_log = tmp_path / "resume.log"
    text = finish(launch_recipe("examples/sft.py", SFT_CONFIG, [*overrides, "train.resume=true"], resume_log,
                                cwd=REPO), resume_log)
    resumed = int(re.search(r"Resumed from \S+ \(step (\d+),", text).group(1))
    assert 2 <= resumed <= stopped
    records = [r for r in read_metrics(run_dir) if "loss" in r]
    assert [r["step"] for r in records] == list(range(1, 21))
    assert all(r["time"] >= resumed_at for r in records if r["step"] > resumed)  # the resumed run's rows
    assert all(r["time"] < resumed_at for r in records if r["step"] <= resumed)


def run_in_pty(argv: list[str], cwd: Path, timeout_s: float = 300.0) -> tuple[int, str]:
    """Run ``argv`` with a pseudo-terminal (160 columns) as its stdin / stdout / stderr, progress bars on;
    (exit code, output)."""
    import fcntl
    import termios

    pid, fd = pty.fork()
    if pid == 0:  # the child: a terminal is all it sees
        os.chdir(cwd)
        # conftest turns bars off for the tests' own processes; a user's terminal has them
        os.execve(argv[0], argv, {k: v for k, v in os.environ.items() if k != "COSMOS_NO_PROGRESS"})
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    out = bytearray()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            data = os.read(fd, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        out += data
    else:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


@pytest.mark.slow
def test_sft_in_a_terminal_keeps_log_lines_off_the_bar_and_one_line_per_save(sft_assets: list[str],
                                                                             tmp_path: Path) -> None:
    overrides = [*sft_assets, f"train.output_dir={tmp_path / 'runs'}", "train.max_steps=4", "train.ckpt.save_freq=2",
                 "train.ckpt.max_keep=1", "train.ckpt.export_safetensors=true"]
    rc, text = run_in_pty([sys.executable, "examples/sft.py", "--config", str(SFT_CONFIG), *overrides], REPO)
    assert rc == 0, text[-3000:]
    assert re.search(r"\[SFT\]: +100%\|.*\| 4/4 \[", text), "no progress bar was drawn"
    assert not glued_log_lines(text), "\n".join(glued_log_lines(text))
    assert "Writing model shards" not in text  # no nested bars per export
    lines = [s for s in segments(text) if "[cosmos]" in s]
    # the save of step 2 (a checkpoint and its safetensors export): one line
    assert len([s for s in lines if "step_2" in s or "step 2 " in s]) == 1, "\n".join(lines)
    assert not any("rollout.backend" in s for s in lines)  # SFT has no rollout engine
    assert json.loads((only_run_dir(tmp_path / "runs") / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 4


def test_the_builder_not_the_loader_says_the_backend_choice(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sft, grpo = tmp_path / "sft.toml", tmp_path / "grpo.toml"
    sft.write_text('config_style = "cosmos_primitives"\n[train.train_policy]\ntype = "sft"\n')
    grpo.write_text('config_style = "cosmos_primitives"\n[train.train_policy]\ntype = "grpo"\n')
    with caplog.at_level("INFO", logger="cosmos"):
        cp.load_config(sft)
        cp.load_config(grpo)
    assert "rollout.backend" not in caplog.text  # the loader decides nothing about the machine
    with caplog.at_level("INFO", logger="cosmos"):
        cp.utils.resolve_backend(cp.load_config(grpo).rollout.backend)  # where a GRPO recipe builds its engine
    assert "rollout.backend = 'auto': using" in caplog.text  # the choice is said there, with its reason


def test_ctrl_c_inside_a_checkpoint_save_leaves_no_tmp_and_exits_130(tmp_path: Path,
                                                                     capfd: pytest.CaptureFixture[str]) -> None:
    """DCP wraps a KeyboardInterrupt raised while it writes in its CheckpointException: still a Ctrl-C."""
    import torch
    from torch.distributed.checkpoint.api import CheckpointException

    from cosmos_primitives.checkpoint import CheckpointManager, exit_on_interrupt
    from cosmos_primitives.config.checkpoint import CheckpointConfig

    ckpt = CheckpointManager(CheckpointConfig(save_mode="sync"), tmp_path, model=torch.nn.Linear(2, 2))
    ckpt.save(2)
    half = tmp_path / "checkpoints" / "step_4.tmp"
    with pytest.raises(SystemExit) as stop, exit_on_interrupt():
        half.mkdir()  # what a save cut short leaves
        raise CheckpointException("save failed", {0: (KeyboardInterrupt(), None)})
    assert stop.value.code == INTERRUPTED_EXIT_CODE
    assert not half.exists() and ckpt.checkpoints() == [tmp_path / "checkpoints" / "step_2"]
    err = capfd.readouterr().err
    assert "stopped at step 0; resume with: " in err
    assert f"goes on from the newest complete checkpoint, {tmp_path / 'checkpoints' / 'step_2'}" in err
    with pytest.raises(ValueError, match="not an interrupt"), exit_on_interrupt():
        raise ValueError("not an interrupt")


class _InterruptedFinalizer:
    """A ``__del__`` that a Ctrl-C lands in (as in decord's ``VideoReader.__del__`` during a recipe's run)."""

    def __del__(self) -> None:
        raise KeyboardInterrupt


def test_ctrl_c_landing_in_a_finalizer_still_stops_the_run(capfd: pytest.CaptureFixture[str]) -> None:
    """Python only prints an exception raised in a ``__del__`` ("Exception ignored in") and goes on."""
    from cosmos_primitives.checkpoint import exit_on_interrupt

    hook = sys.unraisablehook
    went_on = False
    # SIGINT handled by Python, as in a recipe started from a terminal (a pytest-xdist worker ignores it)
    with sigint_as_in_a_terminal(), pytest.raises(SystemExit) as stop, exit_on_interrupt():
        _InterruptedFinalizer()  # dropped at once: its finalizer runs here
        for _ in range(1000):  # the code that runs next
            time.sleep(0.001)
        went_on = True
    assert stop.value.code == INTERRUPTED_EXIT_CODE and not went_on
    err = capfd.readouterr().err
    assert "stopped at step" in err and "Exception ignored" not in err and "KeyboardInterrupt" not in err
    assert sys.unraisablehook is hook  # put back at the block's end
    with exit_on_interrupt():
        pass
    assert sys.unraisablehook is hook


def test_wfm_curves_leave_out_kl_without_a_kl_term() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("wfm_rl_example", REPO / "examples" / "wfm_rl.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    config = cp.load_config(REPO / "examples" / "configs" / "wfm_flowgrpo_tiny.toml")
    assert config.wfm.kl_beta == 0 and "kl" not in example.curve_keys(config.wfm)
    with_kl = cp.load_config(REPO / "examples" / "configs" / "wfm_flowgrpo_tiny.toml", ["wfm.kl_beta=0.01"])
    assert "kl" in example.curve_keys(with_kl.wfm) and "policy_loss" in example.curve_keys(with_kl.wfm)
