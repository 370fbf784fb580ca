# Every target installs what it needs first (scripts/bootstrap.sh is idempotent).
VENV := .venv
PY := $(VENV)/bin/python
SANDRL := $(VENV)/bin/sandrl

.PHONY: setup demo test lint bench clean harbor-env docs

setup:
	@bash scripts/bootstrap.sh

demo: setup
	$(SANDRL) demo

test: setup lint
	@bash scripts/harbor-env.sh --if-possible >/dev/null
	$(PY) -m pytest -q

lint: setup
	$(VENV)/bin/ruff check src tests integrations
	$(VENV)/bin/ruff format --check src tests integrations
	$(VENV)/bin/mypy

# Harbor's own virtualenv (Python >= 3.12) with sandrl's Harbor environment; prints its path.
harbor-env:
	@bash scripts/harbor-env.sh

# The config reference in the user guide, written from the config classes' docstrings.
docs: setup
	$(SANDRL) config reference -o docs/guide/config-reference.md

bench: setup
	$(SANDRL) bench sandbox

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
