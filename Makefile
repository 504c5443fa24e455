# Two commands a new user needs: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export RAY_AUTH_MODE ?= disabled

.PHONY: run test test-slow install install-dev clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Stamp files make the second call fast: reinstall only when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml $(VENV)/.installed
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

run: install
	$(BIN)/raysim run experiments/quickstart.yaml

# The suite CI runs (about 10 minutes on 2 cores); `make test-slow` adds the long accountant grids.
test: install-dev
	$(BIN)/python -m pytest -q -m "not slow"

test-slow: install-dev
	$(BIN)/python -m pytest -q -m slow

clean:
	rm -rf $(VENV) results .pytest_cache
