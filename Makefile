# Two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
REPO   ?= model_repository

.PHONY: run test lint install models unit integration bench clean dashboards

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[cpu,test,train]'
	touch $(STAMP)

install: $(STAMP)

$(REPO)/.built: $(STAMP)
	$(PY) -m sloserve.cli models build --repo $(REPO)

models: $(REPO)/.built

# Serve the demo models on 127.0.0.1:8000 (HTTP) and :8001 (gRPC), replicas on a local Ray Serve.
run: models
	$(VENV)/bin/sloserve serve --repo $(REPO)

# Gateway (make run's server), a bounded Locust load (DURATION seconds, at most 600) and Prometheus,
# all on 127.0.0.1; prints the Prometheus UI and the main SLO queries. Ctrl-C stops everything.
# docs/operations.md, "Watching it under load". Extra flags: DASHBOARDS_ARGS="--config deploy/sloserve.example.yaml".
DURATION ?= 300
dashboards: models
	$(PY) -m sloserve.loadtests.dashboards --repo $(REPO) --duration $(DURATION) $(DASHBOARDS_ARGS)

# The whole suite: the standing checks, unit tests (no Ray, no sleeps) and integration tests
# (real servers, real Ray).
test: models lint
	$(PY) -m pytest -q -p no:cacheprovider tests

# Lint and format (ruff), types (mypy), and the layers of docs/architecture.md (import-linter).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

unit: $(STAMP)
	$(PY) -m pytest -q tests/unit

clean:
	rm -rf $(VENV) $(REPO) .pytest_cache
