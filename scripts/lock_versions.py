"""Write the dependency lock from a virtual environment, or compare an environment with it.

    python scripts/lock_versions.py write VENV_PYTHON LOCK     # freeze VENV into LOCK
    python scripts/lock_versions.py diff LOCK VENV_PYTHON      # packages whose versions differ
    python scripts/lock_versions.py verify LOCK VENV_PYTHON    # exit 1 if VENV strays from LOCK
    python scripts/lock_versions.py check LOCK                 # exit 1 if LOCK is malformed

The lock is a pip constraints file (``name==version`` lines) for x86_64 Python 3.11. torch,
torchvision and the CUDA runtime wheels torch pulls in are left out: ``scripts/setup.sh`` picks
them per machine. The editable ``cosmos_primitives`` itself is left out too.

Only the standard library is used, so any Python 3.10+ runs it.
"""

from __future__ import annotations

import datetime
import platform
import re
import subprocess
import sys
from pathlib import Path

SETUP_CHOOSES = re.compile(r"^(torch|torchvision|torchaudio|triton|nvidia-.*|cuda-.*|cosmos[-_]primitives)$")
"""Distributions the lock never pins: setup.sh installs torch / torchvision per machine."""

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;#]+)\s*$")


def normalise(name: str) -> str:
    """PEP 503 name: ``Foo_Bar.baz`` -> ``foo-bar-baz``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path) -> dict[str, str]:
    """``{normalised name: version}`` of a lock file.

    Raises:
        SystemExit: a line that is neither a comment nor ``name==version`` (names the line).
    """
    pins: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        match = PIN.match(text)
        if match is None:
            sys.exit(f"{path}:{number}: expected 'name==version', got {text!r}")
        pins[normalise(match.group(1))] = match.group(3)
    return pins


def installed(python: str) -> dict[str, str]:
    """``{normalised name: version}`` of what ``python``'s environment holds (``pip freeze``)."""
    out = subprocess.run([python, "-m", "pip", "freeze", "--exclude-editable", "--disable-pip-version-check"],
                         check=True, capture_output=True, text=True).stdout
    versions = {}
    for line in out.splitlines():
        match = PIN.match(line.strip())
        if match is not None:
            versions[normalise(match.group(1))] = match.group(3)
    return versions


def write(python: str, lock: Path) -> None:
    versions = {name: v for name, v in installed(python).items() if not SETUP_CHOOSES.match(name)}
    python_version = subprocess.run([python, "-c", "import platform; print(platform.python_version())"],
                                    check=True, capture_output=True, text=True).stdout.strip()
    header = [
        "# The versions the test suite last passed with: a pip constraints file used by scripts/setup.sh.",
        f"# Written by scripts/lock_versions.py on {datetime.date.today()} for {platform.machine()} "
        f"Python {python_version}.",
        "# Refresh with: make lock   (newest allowed versions, fast tests, then this file).",
        "# torch / torchvision are not pinned here: setup.sh chooses them per machine.",
    ]
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text("\n".join(header + [f"{name}=={versions[name]}" for name in sorted(versions)]) + "\n")
    print(f"wrote {len(versions)} pins to {lock}")


def diff(lock: Path, python: str) -> None:
    """Print ``name locked -> now`` per differing package, one a line (``-`` where absent)."""
    pinned, now = read_lock(lock), installed(python)
    for name in sorted(set(pinned) | set(now)):
        if SETUP_CHOOSES.match(name) or pinned.get(name) == now.get(name):
            continue
        print(f"{name} {pinned.get(name, '-')} {now.get(name, '-')}")


def verify(lock: Path, python: str) -> None:
    """Exit 1, naming them, if installed packages that the lock pins have other versions."""
    pinned, now = read_lock(lock), installed(python)
    strays = [f"{name} {now[name]} (locked {pinned[name]})" for name in sorted(pinned)
              if name in now and now[name] != pinned[name]]
    if strays:
        sys.exit(f"{python}: not the versions of {lock}: " + ", ".join(strays)
                 + "; remove the venv and rerun scripts/setup.sh")
    print(f"{lock}: the venv holds the locked versions")


def main(argv: list[str]) -> None:
    if len(argv) == 3 and argv[0] == "write":
        write(argv[1], Path(argv[2]))
    elif len(argv) == 3 and argv[0] == "diff":
        diff(Path(argv[1]), argv[2])
    elif len(argv) == 3 and argv[0] == "verify":
        verify(Path(argv[1]), argv[2])
    elif len(argv) == 2 and argv[0] == "check":
        print(f"{argv[1]}: {len(read_lock(Path(argv[1])))} pins")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
