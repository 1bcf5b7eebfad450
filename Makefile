# The README's two commands are `make demo` and `make test`; both set everything up.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: venv demo test check lint types unit sglang-setup redis browser clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU build of torch lies on disk here; installing it first keeps pip from pulling CUDA.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(BIN)/answer-service demo

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

types: venv
	$(BIN)/mypy

check: lint types

sglang-setup: venv
	$(BIN)/answer-service sglang setup

redis:
	@redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 || \
	  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no

# Debian's chromium for the dashboard's browser test (driven by playwright, no browser download).
browser:
	@command -v chromium >/dev/null 2>&1 || \
	  { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }

unit: venv
	$(BIN)/python -m pytest tests/unit -q

test: check sglang-setup redis browser
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
