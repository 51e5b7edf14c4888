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

# The whole suite: static checks, then every tier: the e2e tier's two halves beside unit +
# integration (three pytest runs at once, see scripts/test-tiers).
test: lint
	PYTEST=$(PY)/pytest ./scripts/test-tiers
