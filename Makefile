VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint format docs clean distclean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e '.[test]'
	touch $@

# The service on http://127.0.0.1:8000 with a local model store and the iris demo model.
run: $(STAMP)
	$(BIN)/kestrel serve --demo --store .kestrel/store --cache-dir .kestrel/cache

# Each recipe line must succeed; pytest exit code 5 (no tests collected) fails the target.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/pytest -n 2 -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

docs: $(STAMP)
	$(BIN)/python -m compiler.docs > docs/operators.md

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache .kestrel-cache
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
