# kubeplane developer entry points. `make setup` once (as root), then `make test`.
VENV ?= .venv
PY := $(VENV)/bin

.PHONY: setup test lint unit integration e2e bench

setup:
	./scripts/setup

lint:
	$(PY)/ruff check src tests bench
	$(PY)/ruff format --check src tests bench
	$(PY)/mypy
	$(PY)/lint-imports

unit:
	$(PY)/pytest -m unit

integration:
	$(PY)/pytest -m integration

e2e:
	$(PY)/pytest -m e2e

# The whole suite: static checks, then every tier (unit, integration, e2e) in one pytest run.
test: lint
	$(PY)/pytest tests
