"""``make`` keeps Python's bytecode cache on: setup installs without byte-compiling (pip
``--no-compile``), so a shell's ``PYTHONDONTWRITEBYTECODE=1`` would make every process of the suite compile
what it imports again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_make_runs_python_with_the_bytecode_cache_on_whatever_the_shell_says() -> None:
    probe = f"probe:\n\t@{sys.executable} -c 'import sys; print(sys.dont_write_bytecode)'\n"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run(["make", "-s", "--no-print-directory", "-f", str(REPO / "Makefile"), "-f", "-", "probe"],
                         input=probe, env=env, cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out
    # and the probe is one that sees the variable when make passes it on
    direct = subprocess.run([sys.executable, "-c", "import sys; print(sys.dont_write_bytecode)"], env=env,
                            capture_output=True, text=True, check=True)
    assert direct.stdout.strip() == "True"
