# Every target installs what it needs first (scripts/bootstrap.sh is idempotent).
VENV := .venv
PY := $(VENV)/bin/python
SANDRL := $(VENV)/bin/sandrl

.PHONY: setup demo test lint bench clean

setup:
	@bash scripts/bootstrap.sh

demo: setup
	$(SANDRL) demo

test: setup lint
	$(PY) -m pytest -q

lint: setup
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/ruff format --check src tests
	$(VENV)/bin/mypy

bench: setup
	$(SANDRL) bench sandbox

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
