# The two commands of the README. Both run the (idempotent) setup first.
PY := .venv/bin/python

.PHONY: setup demo test lint
setup:
	@bash scripts/setup.sh

demo: setup
	$(PY) examples/quickstart.py

test: setup
	.venv/bin/ruff check .
	$(PY) -m pytest

lint: setup
	.venv/bin/ruff check .
