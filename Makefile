# The two commands of the README. Both run the (idempotent) setup first.
PY := .venv/bin/python

.PHONY: setup demo test lint lock check-latest
setup:
	@bash scripts/setup.sh

demo: setup
	$(PY) examples/quickstart.py

test: setup
	.venv/bin/ruff check .
	$(PY) -m pytest

lint: setup
	.venv/bin/ruff check .

# Not CI: try the newest allowed versions on the fast tests (check-latest), or do that and rewrite
# requirements/lock.txt when they pass (lock). docs/install.md says when.
check-latest:
	bash scripts/check_latest.sh

lock:
	bash scripts/check_latest.sh --write-lock
