# Two commands for a newcomer: `make demo` and `make test`. Both build the
# environment first, so they work on a fresh machine with only Python 3.11+.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The demo needs only the package and the embedded SQS (no Spark, no test tools).
DEMO_STAMP := $(VENV)/.demo-installed

.PHONY: demo test lint typecheck check bench bench-peers clean

# Both environments: uv installs them far sooner than pip (the demo's in seconds where
# pip takes over a minute; the tests', Spark included, in 14 min against pip's 49 on a
# loaded 2-core machine, and in seconds once uv's cache holds them); pip if uv cannot.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	( $(BIN)/pip install --quiet uv && \
	  $(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -e '.[dev]' ) || \
	( $(BIN)/pip install --quiet --upgrade pip && $(BIN)/pip install --quiet -e '.[dev]' )
	touch $(STAMP)

$(DEMO_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	( $(BIN)/pip install --quiet uv && \
	  $(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -e '.[local]' ) || \
	$(BIN)/pip install --quiet -e '.[local]'
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/python examples/demo.py

# Two processes (the Spark tests together on one: tests/conftest.py); `pytest` alone
# runs in one, as does `pytest -n 0`.
test: $(STAMP)
	$(BIN)/pytest -n 2 --dist loadgroup

lint: $(STAMP)
	$(BIN)/ruff check sqsworker spark_sink tests examples bench
	$(BIN)/ruff format --check sqsworker spark_sink tests examples bench

typecheck: $(STAMP)
	$(BIN)/mypy

check: lint typecheck test

# The frameworks bench.peers compares sqsworker with, in a venv of their own: they are
# not dependencies of sqsworker (bench/peers-requirements.txt pins them).
PEERS := bench/.venv-peers
$(PEERS)/.installed: bench/peers-requirements.txt
	$(PYTHON) -m venv --clear $(PEERS)
	$(PEERS)/bin/pip install --quiet -r bench/peers-requirements.txt
	touch $@

bench: $(STAMP) $(PEERS)/.installed
	$(BIN)/python -m bench
	$(BIN)/python -m bench.compare
	$(BIN)/python -m bench.http
	$(BIN)/python -m bench.peers

# Only the comparison with other frameworks (docs/comparison.md), about 20 minutes.
bench-peers: $(STAMP) $(PEERS)/.installed
	$(BIN)/python -m bench.peers

clean:
	rm -rf $(VENV) $(PEERS) .pytest_cache .mypy_cache .ruff_cache .demo
