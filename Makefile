VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
# What serving needs (make run), and on top of it what the tests need (every other target).
SERVE_STAMP := $(VENV)/.installed-serve
STAMP := $(VENV)/.installed-test

.PHONY: run test test-slow test-overload tools lint format docs bench bench-http device-wheels device-baseline clean distclean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(SERVE_STAMP): pyproject.toml | $(VENV)/bin/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(STAMP): pyproject.toml | $(VENV)/bin/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(SERVE_STAMP) $@

# The service on http://127.0.0.1:8000 with a local model store and the iris demo model.
run: $(SERVE_STAMP)
	$(BIN)/kestrel serve --demo --store .kestrel/store --cache-dir .kestrel/cache

# Debian's packages for the system tools the tests run (.ci/install-tools; sudo when not root).
tools:
	bash .ci/install-tools

# Each recipe line must succeed; pytest exit code 5 (no tests collected) fails the target.
# PYTEST_ARGS narrows the run (e.g. one file) or adds pytest options.
# Tests marked slow (minutes each: kill -9 rounds, the overload minute, long live-server
# suites) run in test-slow.
test: $(STAMP) tools
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/pytest -n 2 -q -m "not slow" --durations=20 $(PYTEST_ARGS)

# -s: the overload test prints its latency report (docs/reliability.md) into the log.
test-slow: $(STAMP)
	$(BIN)/pytest -q -s -m slow

# Only the overload minute (three times capacity, docs/reliability.md), with its report.
test-overload: $(STAMP)
	$(BIN)/pytest -q -s -m overload

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

docs: $(STAMP)
	$(BIN)/python -m compiler.docs > docs/operators.md

# Kestrel vs scikit-learn, ONNX Runtime and Hummingbird, one thread (bench/scoring.py): installs
# the other systems, rewrites docs/performance.md, .png and .json (about half an hour on 2 cores).
bench: $(STAMP)
	$(BIN)/python -m pip install -e '.[bench]'
	$(BIN)/python bench/scoring.py --out docs/performance.json --report docs/performance.md

# Kestrel vs a plain FastAPI + scikit-learn server vs hello world over HTTP (bench/load.py), with
# wrk (Debian's package, installed when missing): rewrites docs/performance-http.md (~15 minutes).
bench-http: $(STAMP)
	bash .ci/install-tools wrk
	$(BIN)/python bench/load.py --out bench-results/load.json --doc docs/performance-http.md

# Wheels bench/device.sh installs on a lent GPU machine (its image runs Python 3.12): this
# environment's scikit-learn and LightGBM.
device-wheels: $(STAMP)
	mkdir -p .gpu/wheels
	$(BIN)/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
	  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .gpu/wheels \
	  "scikit-learn==$$($(BIN)/python -c 'import sklearn; print(sklearn.__version__)')" lightgbm

# The float32-decision baseline bench/exactness.py compares against, as files (a lent machine
# has no git history): BENCH=exactness bash bench/device.sh reads it, with .gpu carried.
EXACTNESS_BASELINE ?= d098ae2
device-baseline:
	rm -rf .gpu/baseline && mkdir -p .gpu/baseline
	git archive $(EXACTNESS_BASELINE) compiler lazy | tar -x -C .gpu/baseline

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache .kestrel-cache
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
