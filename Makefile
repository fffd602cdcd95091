# The two commands of the README. Both run the (idempotent) setup first.
PY := .venv/bin/python
# The suite's modules run in parallel, one worker per core (at most 4), a whole module per worker at
# a time (module fixtures that train are built once), in the order tests/conftest.py gives (longest
# first). PYTEST_PARALLEL= runs it in one process.
PYTEST_PARALLEL ?= -n auto --maxprocesses=4 --dist loadfile --no-loadscope-reorder
# glibc gives every freed allocation over its mmap threshold (the tiny models' 150k-vocabulary logits,
# 30-250 MB each) back to the kernel and page-faults it in again on the next step: a third of the suite's
# CPU time was that page-fault work (sys). These tunables keep freed memory in the heap for reuse (the
# processes and everything they start inherit them). tests/test_suite_allocator.py checks they take.
SUITE_MALLOC ?= glibc.malloc.mmap_threshold=2147483647:glibc.malloc.trim_threshold=4294967296
# Python caches the bytecode of what it imports (setup installs with pip --no-compile): a shell with
# PYTHONDONTWRITEBYTECODE=1 would have every process of the suite compile the library and the parts of
# torch / transformers it uses again (about 6 CPU-s each). tests/test_suite_bytecode.py checks this.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup demo test lint lock check-latest
setup:
	@bash scripts/setup.sh

demo: setup
	$(PY) examples/quickstart.py

test: setup
	.venv/bin/ruff check .
	GLIBC_TUNABLES=$(SUITE_MALLOC) $(PY) -m pytest $(PYTEST_PARALLEL)

lint: setup
	.venv/bin/ruff check .

# Not CI: try the newest allowed versions on the fast tests (check-latest), or do that and rewrite
# requirements/lock.txt when they pass (lock). docs/install.md says when.
check-latest:
	bash scripts/check_latest.sh

lock:
	bash scripts/check_latest.sh --write-lock
