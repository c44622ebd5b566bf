VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-slow test-overload lint format docs bench bench-http clean distclean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e '.[test]'
	touch $@

# The service on http://127.0.0.1:8000 with a local model store and the iris demo model.
run: $(STAMP)
	$(BIN)/kestrel serve --demo --store .kestrel/store --cache-dir .kestrel/cache

# Each recipe line must succeed; pytest exit code 5 (no tests collected) fails the target.
# Tests marked slow (minutes each: kill -9 rounds) run in test-slow.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/pytest -n 2 -q -m "not slow"

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
	bash .ci/install-wrk
	$(BIN)/python bench/load.py --out bench-results/load.json --doc docs/performance-http.md

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache .kestrel-cache
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
