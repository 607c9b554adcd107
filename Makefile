# xwm-bridge — `make run` starts the daemon on 127.0.0.1:8787; `make test` runs the whole suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# the suite's workers (pytest-xdist): most tests wait on sockets and child processes, so
# two workers on two cores take about half the time; PYTEST_WORKERS= runs it in one process
PYTEST_WORKERS ?= -n 2 --dist worksteal

.PHONY: run test lint typecheck check bench clean console-screenshots

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,fast]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/xwm-bridge serve

test: $(STAMP)
	$(BIN)/ruff check xwm_bridge internal tests
	$(BIN)/ruff format --check xwm_bridge internal tests
	$(BIN)/mypy
	$(BIN)/hadolint Dockerfile
	$(BIN)/pytest $(PYTEST_WORKERS)

lint: $(STAMP)
	$(BIN)/ruff check xwm_bridge internal tests
	$(BIN)/ruff format --check xwm_bridge internal tests
	$(BIN)/hadolint Dockerfile

typecheck: $(STAMP)
	$(BIN)/mypy

# screenshots of each console view (needs Debian's chromium: apt-get install chromium)
console-screenshots: $(STAMP)
	$(BIN)/python -m internal.console_screenshots

bench: $(STAMP)
	$(BIN)/python -m internal.bench.forwarding

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
