# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONSTRAINTS := docker/constraints-3.11.txt
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: venv postgres test lint typecheck unit demo plan bench clean
SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml sandbox/pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q "uv==0.13.9"
	$(BIN)/uv pip install -q --python $(BIN)/python -c $(CONSTRAINTS) -e '.[dev]' -e ./sandbox
	touch $@

# The ledger tests run against a real PostgreSQL server (Debian's package), started per test session.
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends postgresql; }

lint: venv
	$(BIN)/ruff check airflow_provider_tpu_rl sandbox dags tests
	$(BIN)/ruff format --check airflow_provider_tpu_rl sandbox dags tests
	$(BIN)/sqlfluff lint sql/

typecheck: venv
	$(BIN)/mypy

unit: venv postgres
	$(BIN)/pytest -q

test: lint typecheck unit

plan: venv
	$(BIN)/tpu-rl plan tpu_rl_gke_pipeline

# The whole multi-host pipeline in the local sandbox (no cloud). Run it twice: the second run
# finds the converted checkpoint and skips conversion.
demo: venv
	$(BIN)/tpu-rl-sandbox demo

# Benchmarks (not tests): parse time vs stock operators, orchestration overhead, worker-slot time.
bench: venv
	$(BIN)/tpu-rl-sandbox bench

clean:
	rm -rf $(VENV) .sandbox .demo .airflow
