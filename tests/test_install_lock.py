"""requirements/lock.txt (what scripts/setup.sh installs with) agrees with pyproject.toml's ranges,
pins every dependency a test-suite install needs, and its tooling rejects malformed files."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from cosmos_primitives.config.toml_io import tomllib

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "lock.txt"


def _lock_tools():
    spec = importlib.util.spec_from_file_location("lock_versions", ROOT / "scripts" / "lock_versions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lock_versions = _lock_tools()


def _requirements() -> list[Requirement]:
    """The core dependencies and every extra's but vllm (which the lock cannot hold)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra, reqs in project["optional-dependencies"].items():
        if extra != "vllm":
            lines += [r for r in reqs if not r.startswith("cosmos_primitives")]
    return [Requirement(line) for line in lines]


def test_the_lock_pins_every_dependency_within_the_pyproject_ranges() -> None:
    pins = lock_versions.read_lock(LOCK)
    outside, missing = [], []
    for req in _requirements():
        name = lock_versions.normalise(req.name)
        if lock_versions.SETUP_CHOOSES.match(name):
            assert name not in pins, f"{name} is chosen by setup.sh and must not be in the lock"
            continue
        if name not in pins:
            missing.append(name)
        elif not req.specifier.contains(pins[name], prereleases=True):
            outside.append(f"{name}=={pins[name]} not in {req.specifier}")
    assert not missing, f"{LOCK} does not pin {missing}: refresh it with 'make lock'"
    assert not outside, f"{LOCK} pins versions pyproject.toml forbids: {outside}"


def test_the_lock_never_pins_torch_or_its_cuda_wheels() -> None:
    pins = lock_versions.read_lock(LOCK)
    assert not [n for n in pins if re.match(r"^(torch|torchvision|triton|nvidia-.*|cuda-.*)$", n)]
    assert lock_versions.normalise("Typing_Extensions") == "typing-extensions"


def test_a_malformed_lock_line_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "lock.txt"
    bad.write_text("# header\nnumpy==2.0\ntransformers>=5\n")
    with pytest.raises(SystemExit, match=r"lock.txt:3: expected 'name==version', got 'transformers>=5'"):
        lock_versions.read_lock(bad)
