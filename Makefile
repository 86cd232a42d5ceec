# Switchyard — the two commands: `make up` (the whole stack, embedded) and `make test`.
# Both create or refresh the virtualenv first; nothing else needs to be installed by hand.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# PostgreSQL for the second pass of the database tests; skipped (with a note) if unreachable.
SWITCHYARD_TEST_POSTGRES_URL ?= postgres://postgres@127.0.0.1:5432/postgres
# Test processes (pytest-xdist), each given whole files so that a module's shared stack starts
# once. Most tests wait on real processes and sockets, so three keep two cores busy.
TEST_WORKERS ?= 3
PARALLEL := -n $(TEST_WORKERS) --dist loadfile

.PHONY: up test test-live lint format bench venv clean system-packages assets

## Every Debian package the suite, the stack or the benches need, in one list: a new machine has
## none of what a previous session installed by hand. chromium: the browser tests; iptables and
## faketime: the multi-host tests' partitions and skewed clocks (testkit/netns.py); wrk:
## the benches' load generator. Installed only where one is missing (one apt-get for all).
SYSTEM_PACKAGES := chromium iptables faketime wrk

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

## The portal's front-end libraries (htmx, Chart.js, axe-core for the browser tests): npm ci
## from the committed lock file, copied into the static files. Nothing is fetched at run time.
VENDOR := portal/static/portal/vendor
ASSETS := $(VENDOR)/.installed
$(ASSETS): frontend/package.json frontend/package-lock.json
	@command -v npm >/dev/null || (echo "npm (Node.js 20+) is needed to install the portal's assets" && exit 1)
	cd frontend && npm ci --no-audit --no-fund --loglevel=error
	mkdir -p $(VENDOR)
	cp frontend/node_modules/htmx.org/dist/htmx.min.js $(VENDOR)/htmx.min.js
	cp frontend/node_modules/chart.js/dist/chart.umd.min.js $(VENDOR)/chart.umd.min.js
	cp frontend/node_modules/axe-core/axe.min.js $(VENDOR)/axe.min.js
	@touch $(ASSETS)

assets: $(ASSETS)

## Run every process on this machine: Valkey, simulated vLLM fleet, web, gateway, Celery.
up: $(STAMP) $(ASSETS)
	$(PY) -m ops.stack

## The full test suite: lint and types, then the tests on SQLite, then the database tests
## again on PostgreSQL if one answers.
test: lint system-packages $(ASSETS)
	$(PY) -m pytest $(PARALLEL) $(PYTEST_ARGS)
	@if $(PY) -c "import psycopg,sys; psycopg.connect('$(SWITCHYARD_TEST_POSTGRES_URL)', connect_timeout=3).close()" 2>/dev/null; then \
		echo "--- database tests on PostgreSQL ($(SWITCHYARD_TEST_POSTGRES_URL))"; \
		SWITCHYARD_DATABASE_URL='$(SWITCHYARD_TEST_POSTGRES_URL)' $(PY) -m pytest -m django_db $(PARALLEL) $(PYTEST_ARGS); \
	else \
		echo "--- PostgreSQL not reachable at $(SWITCHYARD_TEST_POSTGRES_URL): database tests ran on SQLite only"; \
	fi

## The list above, checked by dpkg rather than by a command on PATH (a package's binary may sit
## in /usr/sbin). Playwright's own browser download is never used: the browser is Debian's.
system-packages:
	@missing=$$(for p in $(SYSTEM_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:" $$missing; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

## The simulator's contract tests against a real vLLM on the CPU (installs it; takes minutes).
test-live: $(STAMP)
	bash tests/live/run.sh

## Lint, formatting, types, and the import contracts (pyproject.toml's [tool.importlinter]: the
## floors of docs/architecture.md, no import circle, the lean data path).
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m mypy .

format: $(STAMP)
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

## Benchmarks (results in bench/RESULTS.md); the load generator is Debian's wrk. Every bench
## with a `__main__` runs here, each writing its section of bench/RESULTS.md; all are loopback
## only and bounded (about 40 minutes together; the scale-out ones are meant for a machine with
## many cores: elsewhere they still run, and their tables name what saturated). Left out, as not
## benchmarks but servers the others start, which never exit on their own:
## bench.gateway.bare_relay and bench.gateway.instant_vllm.
bench: $(STAMP) system-packages
	$(PY) -m bench.simulator.throughput
	$(PY) -m bench.scheduling.lua_cost
	$(PY) -m bench.gateway.overhead
	$(PY) -m bench.gateway.records
	$(PY) -m bench.gateway.recording
	$(PY) -m bench.scheduling.overload
	$(PY) -m bench.scheduling.flood
	$(PY) -m bench.guardrails.quality
	$(PY) -m bench.guardrails.injection_speed
	$(PY) -m bench.guardrails.service_load
	$(PY) -m bench.guardrails.latency
	$(PY) -m bench.records.persist
	$(PY) -m bench.async_tasks.submit
	$(PY) -m bench.async_tasks.batcher
	$(PY) -m bench.files.feasibility
	$(PY) -m bench.files.s3_throughput
	$(PY) -m bench.files.backfill
	$(PY) -m bench.files.deadlines
	$(PY) -m bench.scaleout.admission
	$(PY) -m bench.scaleout.shards

clean:
	rm -rf $(VENV) .run
