# Two commands a new user needs: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export RAY_AUTH_MODE ?= disabled

.PHONY: run test test-slow test-cluster lint bench install install-dev clean

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

# Fast default suite (unit tests and the quick end-to-end ones); `make test-cluster` runs the simulation suites
# (many runs each, in one process) and the tests that start Ray or other processes (clusters, kill-and-resume,
# subprocesses), `make test-slow` the long accountant grids.
# Two pytest workers (one per core here), whole files per worker so module fixtures are built once.
test: install-dev
	$(BIN)/python -m pytest -q -m "not slow and not cluster and not simulation" -n 2 --dist loadfile --durations=15

# ruff with the rule set in pyproject.toml (pycodestyle errors and warnings, pyflakes); CI runs it.
lint: install-dev
	$(BIN)/ruff check .

test-cluster: install-dev
	$(BIN)/python -m pytest -q -m "simulation and not cluster and not slow" -n 2 --dist loadfile
	$(BIN)/python -m pytest -q -m "cluster and not slow"

test-slow: install-dev
	$(BIN)/python -m pytest -q -m slow

# The benchmark suite (experiments/bench/README.md), offline on the digits data (about 10 minutes here);
# `make bench DATA_ROOT=/path/to/data` runs the cross-device benchmark on CIFAR-10 instead.
bench: install-dev
	$(BIN)/python experiments/bench/cross_device.py $(if $(DATA_ROOT),--data-root $(DATA_ROOT),--dataset digits)
	$(BIN)/python experiments/bench/cross_device.py --config experiments/paper/shakespeare.yaml --dataset shakespeare \
		--variants nodp,client --timed-rounds 3 --no-first-round --set data.max_samples_per_user=128 --set data.val_fraction=0
	$(BIN)/python experiments/bench/dp_step.py
	$(BIN)/python experiments/bench/dp_step.py --profile
	$(BIN)/python experiments/bench/stacked_clients.py
	$(BIN)/python experiments/bench/round_overhead.py --dataset digits
	$(BIN)/python experiments/bench/sweep_overhead.py
	$(BIN)/python experiments/bench/first_run.py
	$(BIN)/python experiments/bench/population.py --dataset digits --sizes 100 500
	$(BIN)/python experiments/bench/adpc_sigma_h.py --config experiments/quickstart.yaml
	$(BIN)/python experiments/bench/adpc_read.py
	$(BIN)/python experiments/bench/accounting_round.py
	$(BIN)/python experiments/bench/correlated_noise.py
	$(BIN)/python experiments/bench/step_noise.py
	$(BIN)/python experiments/bench/restoring_force.py
	$(BIN)/python experiments/bench/mechanism_cost.py $(if $(DATA_ROOT),--data-root $(DATA_ROOT),--dataset digits)
	$(BIN)/python experiments/bench/tune_speed.py --lrs 2 --rounds 5 --final-seeds 2

clean:
	rm -rf $(VENV) results .pytest_cache
