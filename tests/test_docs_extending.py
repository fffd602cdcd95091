"""Every ```python block of docs/extending.md runs as written and its own asserts hold.

All blocks run in one fresh interpreter (torch and transformers load once), each in its own
namespace and in document order; the child reports each block's outcome as one JSON line. The
child, not pytest's process, holds the one-rank gloo group the model-family snippet creates.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
# What the page promises: a reward, SFT and GRPO dataset adapters, a model family.
EXPECTED_BLOCKS = 4
TIMEOUT_S = 240

RUNNER = r"""
import json, linecache, sys, traceback
blocks = json.load(sys.stdin)
for index, source in enumerate(blocks):
    namespace = {"__name__": f"extending_block_{index}"}
    filename = f"docs/extending.md block {index}"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # source lines in tracebacks
    try:
        exec(compile(source, filename, "exec"), namespace)
        outcome = {"index": index, "ok": True}
    except BaseException:
        outcome = {"index": index, "ok": False, "traceback": traceback.format_exc()}
    print("BLOCK-RESULT " + json.dumps(outcome), flush=True)
"""


def python_blocks(text: str) -> list[str]:
    return [m.group(1) for m in FENCE.finditer(text)]


def first_line(source: str) -> str:
    return next((line for line in source.splitlines() if line.strip()), "<empty block>")


@pytest.fixture(scope="module")
def blocks() -> list[str]:
    return python_blocks(DOC.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def outcomes(blocks: list[str], tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict]:
    workdir = tmp_path_factory.mktemp("docs_extending")
    env = dict(os.environ, COSMOS_NO_PROGRESS="1", WANDB_MODE="offline", TOKENIZERS_PARALLELISM="false",
               COSMOS_DEVICE="cpu", TMPDIR=str(workdir))
    proc = subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps(blocks), capture_output=True,
                          text=True, cwd=workdir, env=env, timeout=TIMEOUT_S)
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("BLOCK-RESULT "):
            outcome = json.loads(line[len("BLOCK-RESULT "):])
            results[outcome["index"]] = outcome
    if len(results) != len(blocks):
        pytest.fail(f"the snippet runner stopped after {len(results)} of {len(blocks)} blocks "
                    f"(exit code {proc.returncode}); its stderr ends with:\n{proc.stderr[-4000:]}")
    return results


def test_page_has_its_snippets(blocks: list[str]) -> None:
    assert len(blocks) == EXPECTED_BLOCKS, (
        f"{DOC} has {len(blocks)} python blocks, expected {EXPECTED_BLOCKS}; update EXPECTED_BLOCKS when "
        "adding or removing a snippet")
    for index, source in enumerate(blocks):
        assert "assert " in source, f"block {index} ({first_line(source)!r}) checks nothing"


@pytest.mark.parametrize("index", range(EXPECTED_BLOCKS))
def test_snippet_runs(index: int, blocks: list[str], outcomes: dict[int, dict]) -> None:
    if index >= len(blocks):
        pytest.fail(f"{DOC} has only {len(blocks)} python blocks; no block {index}")
    outcome = outcomes[index]
    if not outcome["ok"]:
        pytest.fail(f"{DOC.name} python block {index} (starting {first_line(blocks[index])!r}) raised:\n"
                    f"{outcome['traceback']}", pytrace=False)


def test_runner_reports_a_failing_block() -> None:
    """The harness itself: a raising block is reported with its index, the others still run."""
    text = "```python\nx = 1\n```\n\n```python\nassert 1 == 2, 'boom'\n```\n\n```python\ny = 2\n```\n"
    found = python_blocks(text)
    assert [first_line(b) for b in found] == ["x = 1", "assert 1 == 2, 'boom'", "y = 2"]
    proc = subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps(found), capture_output=True,
                          text=True, timeout=60)
    reported = [json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines()
                if line.startswith("BLOCK-RESULT ")]
    assert [r["ok"] for r in reported] == [True, False, True]
    assert "boom" in reported[1]["traceback"] and "docs/extending.md block 1" in reported[1]["traceback"]
