"""``cp.testing.forked_script``: a script forked from the fork server behaves as ``python script.py``
would (arguments, working directory, environment, output, exit status, signals, shutdown), and starts
with the server's modules already imported."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cosmos_primitives.testing.fork_server import FORKSERVER_PRELOAD
from cosmos_primitives.testing.forked_script import run_script, start_script

REPO = Path(__file__).resolve().parents[1]

SCRIPT = """
import atexit, json, os, sys, threading, time
loaded_at_start = sorted(m for m in ("torch", "transformers", "cosmos_primitives.policy") if m in sys.modules)
import helper  # a module beside the script, found as `python script.py` finds it
def late():
    time.sleep(0.3)
    print("thread done", flush=True)
threading.Thread(target=late).start()
atexit.register(lambda: print("atexit ran"))
print(json.dumps({"argv": sys.argv, "orig_argv": sys.orig_argv,
                  "cwd": os.getcwd(), "var": os.environ.get("FORKED_VAR"), "helper": helper.X,
                  "name": __name__, "loaded": loaded_at_start, "pgid_is_pid": os.getpgid(0) == os.getpid(),
                  "stdin": sys.stdin.read()}))
code = sys.argv[1]
if code == "raise":
    raise ValueError("boom")
if code == "interrupt":
    raise KeyboardInterrupt
if code == "wait":
    print("waiting", flush=True)
    time.sleep(60)
sys.exit(int(code))
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    folder = tmp_path / "scripts"
    folder.mkdir()
    (folder / "helper.py").write_text("X = 7\n")
    path = folder / "probe.py"
    path.write_text(SCRIPT)
    return path


def _first_json(text: str) -> dict:
    return json.loads(next(line for line in text.splitlines() if line.startswith("{")))


def test_a_forked_script_runs_as_python_would_with_the_server_s_modules_loaded(script: Path, tmp_path: Path) -> None:
    env = {**os.environ, "FORKED_VAR": "from the caller"}
    done = run_script([script, "0", "--flag"], tmp_path / "run.log", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout
    seen = _first_json(done.stdout)
    assert seen["argv"] == [str(script), "0", "--flag"]
    assert seen["orig_argv"] == [sys.executable, str(script), "0", "--flag"]  # what a resume command quotes
    assert seen["cwd"] == str(tmp_path) and seen["var"] == "from the caller" and seen["helper"] == 7
    assert seen["name"] == "__main__" and seen["stdin"] == ""
    assert seen["loaded"] == ["cosmos_primitives.policy", "torch", "transformers"]
    assert not seen["pgid_is_pid"]
    # the interpreter's shutdown: the non-daemon thread finished before the atexit handler ran
    assert done.stdout.index("thread done") < done.stdout.index("atexit ran")


@pytest.mark.parametrize(("arg", "code"), [("3", 3), ("raise", 1), ("interrupt", -signal.SIGINT)])
def test_the_exit_status_is_the_interpreter_s(script: Path, tmp_path: Path, arg: str, code: int) -> None:
    done = run_script([script, arg], tmp_path / "run.log", cwd=tmp_path)
    assert done.returncode == code, done.stdout
    if arg == "raise":
        assert "ValueError: boom" in done.stdout
    # and the same as a fresh interpreter's
    fresh = subprocess.run([sys.executable, str(script), arg], cwd=tmp_path, capture_output=True, timeout=120)
    assert fresh.returncode == code


def test_a_script_in_its_own_session_is_signalled_and_killed_whole(script: Path, tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    proc = start_script([script, "wait"], log, cwd=tmp_path, new_session=True)
    deadline = time.monotonic() + 120
    while "waiting" not in (log.read_text() if log.exists() else ""):
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    assert _first_json(log.read_text())["pgid_is_pid"]
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.1)
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM
    proc.kill()  # a no-op once it has ended, as for a Popen


def test_the_preload_holds_every_library_module_the_recipes_import() -> None:
    """The fork server preloads what the recipes' ``import`` lines name, so a forked recipe imports none of it."""
    import ast

    named = set()
    for path in (REPO / "examples").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                named.add(node.module)
            elif isinstance(node, ast.Import):
                named.update(alias.name for alias in node.names)
    library = {name for name in named if name.startswith("cosmos_primitives")}
    assert library - set(FORKSERVER_PRELOAD) == set()


SIGNALS_AND_PATH = """
import json, signal, sys
import on_the_path
print(json.dumps({"ignored": signal.getsignal(signal.SIGINT) is signal.SIG_IGN,
                  "blocked": signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, ()), "found": on_the_path.Y}))
"""


@pytest.mark.parametrize("caller_ignores", [True, False])
def test_the_script_keeps_what_an_exec_d_child_keeps_and_finds_the_callers_pythonpath(
        tmp_path: Path, caller_ignores: bool) -> None:
    """SIGINT ignored by the caller stays ignored (a suite run as ``make test &``), a handler of the caller's
    does not carry over (the script gets Python's own), and the mask is the caller's; ``PYTHONPATH`` as
    the interpreter reads it."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "on_the_path.py").write_text("Y = 'yes'\n")
    script = tmp_path / "probe.py"
    script.write_text(SIGNALS_AND_PATH)
    env = {**os.environ, "PYTHONPATH": "lib"}
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN if caller_ignores else lambda *_: None)
    try:
        done = run_script([script], tmp_path / "run.log", cwd=tmp_path, env=env)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert done.returncode == 0, done.stdout
    assert _first_json(done.stdout) == {"ignored": caller_ignores, "blocked": False, "found": "yes"}


def test_a_script_forked_here_starts_with_this_process_s_modules(tmp_path: Path) -> None:
    """``here=True`` forks the caller (the GPU pack's dry-run parts, which have imported diffusers):
    the script sees a module only this process has loaded, which the fork server's children do not."""
    import types

    sys.modules["_forked_here_marker"] = types.ModuleType("_forked_here_marker")
    try:
        script = tmp_path / "probe.py"
        script.write_text("import sys\nprint('loaded' if '_forked_here_marker' in sys.modules else 'absent')\n"
                          "sys.exit(3)\n")
        for here, expected in ((True, "loaded"), (False, "absent")):
            log = tmp_path / f"here_{here}.log"
            proc = start_script([script], log, cwd=tmp_path, here=here)
            assert proc.wait(timeout=60) == 3
            assert log.read_text().split() == [expected]
    finally:
        del sys.modules["_forked_here_marker"]
