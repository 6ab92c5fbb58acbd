# Everything the project needs is installed by these targets into ./.venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev
RUN_STAMP := $(VENV)/.installed-run
# pytest-xdist workers, one test file per worker at a time (ADR 33): both targets run one per
# core (WORKERS=0 runs the whole suite in one process, e.g. to read a test's -s output)
WORKERS ?= auto
QUICK_WORKERS ?= auto
# a worker that crashes is not replaced: under --dist loadfile, pytest-xdist 3.8 runs the crashing
# test again in each replacement, and can hang (CI hit that after a segfault); the run reports it
XDIST := --dist loadfile --max-worker-restart=0

.PHONY: run test test-quick bench bench-faults clean

# make run needs the runtime dependencies only (no test tools); make test adds the dev extras.
$(RUN_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $(RUN_STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

## make run: serve on SQLite under ./var/ (prints the board URL and, first time, the admin password)
run: $(RUN_STAMP)
	$(VENV)/bin/switchboard serve

## make test: the whole suite (PostgreSQL tests skip when none is reachable)
test: $(STAMP)
	$(PY) -m pytest -n $(WORKERS) $(XDIST)

## make test-quick: the suite without the fault suite and the browser tests (a developer's loop)
test-quick: $(STAMP)
	$(PY) -m pytest -n $(QUICK_WORKERS) $(XDIST) -m "not fault and not browser"

## make bench: benchmarks with ratios against baselines measured in the same run
bench: $(STAMP)
	$(PY) bench/claim_complete.py

## make bench-faults: throughput and answer times around each fault of the fault suite
bench-faults: $(STAMP)
	$(PY) bench/faults.py

clean:
	rm -rf $(VENV) var .pytest_cache .hypothesis
