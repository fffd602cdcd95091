"""The allocator settings ``make test`` runs the suite under (the Makefile's ``SUITE_MALLOC``) keep a
freed large tensor's pages for the next one instead of page-faulting them in again each time: counted
in page faults, not seconds, so the check does not depend on the machine's load."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# tensors of 4-30 MB, then of 40 and 100 MB, allocated, written and freed in turn, five times, as a
# training step's activations and logits are; prints the page faults of the second (large) group
_PROBE = """
import resource, torch
for sizes in ((4, 16, 30), (40, 100)):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        for mb in sizes:
            t = torch.empty(mb << 18, dtype=torch.float32)
            t.fill_(1.0)
            del t
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def suite_malloc() -> str:
    match = re.search(r"^SUITE_MALLOC \?= (\S+)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert match, "the Makefile no longer sets SUITE_MALLOC"
    return match.group(1)


def page_faults(tunables: str | None) -> int:
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    if tunables:
        env["GLIBC_TUNABLES"] = tunables
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


def test_the_suite_s_allocator_settings_reuse_freed_tensor_pages() -> None:
    default, tuned = page_faults(None), page_faults(suite_malloc())
    pages = (140 << 20) // 4096  # of one round
    # glibc's default maps each tensor afresh: every page faults in on every allocation
    assert default >= 4 * pages, default
    # the suite's settings keep them in the heap: the pages fault in about once and are reused (a fresh
    # clone's run once counted one page over a round: the bound is a round and a half, default is 4+)
    assert tuned <= 3 * pages // 2, (tuned, default)
