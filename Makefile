# Switchyard — the two commands: `make up` (the whole stack, embedded) and `make test`.
# Both create or refresh the virtualenv first; nothing else needs to be installed by hand.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# PostgreSQL for the second pass of the database tests; skipped (with a note) if unreachable.
SWITCHYARD_TEST_POSTGRES_URL ?= postgres://postgres@127.0.0.1:5432/postgres

.PHONY: up test test-live lint format bench venv clean chromium

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

## Run every process on this machine: Valkey, simulated vLLM fleet, web, gateway, Celery.
up: $(STAMP)
	$(PY) -m config.stack

## The full test suite: lint and types, then the tests on SQLite, then the database tests
## again on PostgreSQL if one answers.
test: lint chromium
	$(PY) -m pytest $(PYTEST_ARGS)
	@if $(PY) -c "import psycopg,sys; psycopg.connect('$(SWITCHYARD_TEST_POSTGRES_URL)', connect_timeout=3).close()" 2>/dev/null; then \
		echo "--- database tests on PostgreSQL ($(SWITCHYARD_TEST_POSTGRES_URL))"; \
		SWITCHYARD_DATABASE_URL='$(SWITCHYARD_TEST_POSTGRES_URL)' $(PY) -m pytest -m django_db $(PYTEST_ARGS); \
	else \
		echo "--- PostgreSQL not reachable at $(SWITCHYARD_TEST_POSTGRES_URL): database tests ran on SQLite only"; \
	fi

## Debian's Chromium for the browser tests (tests/browser); Playwright's own browser download
## is never used.
chromium:
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium)

## The simulator's contract tests against a real vLLM on the CPU (installs it; takes minutes).
test-live: $(STAMP)
	bash tests/live/run.sh

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy .

format: $(STAMP)
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

## Benchmarks (results in bench/RESULTS.md); the load generator is Debian's wrk.
bench: $(STAMP)
	@command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk)
	$(PY) -m bench.simulator.throughput
	$(PY) -m bench.scheduling.lua_cost
	$(PY) -m bench.gateway.overhead
	$(PY) -m bench.scheduling.overload
	$(PY) -m bench.guardrails.quality
	$(PY) -m bench.guardrails.latency
	$(PY) -m bench.gateway.records
	$(PY) -m bench.records.persist

clean:
	rm -rf $(VENV) .run
