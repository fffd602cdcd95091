# The two commands of the README. Both run the (idempotent) setup first.
PY := .venv/bin/python
# The suite's modules run in parallel, one worker per core (at most 4), a whole module per worker at
# a time (module fixtures that train are built once), in the order tests/conftest.py gives (longest
# first). PYTEST_PARALLEL= runs it in one process.
PYTEST_PARALLEL ?= -n auto --maxprocesses=4 --dist loadfile --no-loadscope-reorder

.PHONY: setup demo test lint lock check-latest
setup:
	@bash scripts/setup.sh

demo: setup
	$(PY) examples/quickstart.py

test: setup
	.venv/bin/ruff check .
	$(PY) -m pytest $(PYTEST_PARALLEL)

lint: setup
	.venv/bin/ruff check .

# Not CI: try the newest allowed versions on the fast tests (check-latest), or do that and rewrite
# requirements/lock.txt when they pass (lock). docs/install.md says when.
check-latest:
	bash scripts/check_latest.sh

lock:
	bash scripts/check_latest.sh --write-lock
