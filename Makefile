# Two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# Two installs into the one .venv: what serving needs (run, models) and everything (test, lint, unit,
# dashboards: it runs Locust).
STAMP  := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
REPO   ?= model_repository

.PHONY: run test lint install install-test models unit integration bench clean dashboards

# Serving: sloserve and ONNX Runtime for the CPU, no PyTorch (the demo cnn model ships prebuilt,
# sloserve/modeltools/cnn.py).
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[cpu]'
	touch $(STAMP)

# Everything: also the test tools (pytest, Locust, ruff, mypy, ...) and PyTorch with Ray Train
# ([train]), into the same .venv. It includes the serving install, so it marks that one done too
# (unless already done since pyproject.toml last changed): `make run` after it installs nothing.
$(TEST_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[cpu,test,train]'
	test $(STAMP) -nt pyproject.toml || touch $(STAMP)
	touch $(TEST_STAMP)

install: $(STAMP)

install-test: $(TEST_STAMP)

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
dashboards: $(TEST_STAMP) models
	$(PY) -m sloserve.loadtests.dashboards --repo $(REPO) --duration $(DURATION) $(DASHBOARDS_ARGS)

# The whole suite: the standing checks, unit tests (no Ray, no sleeps) and integration tests
# (real servers, real Ray). The full install first, so the models' build finds the serving one done.
test: $(TEST_STAMP) models lint
	$(PY) -m pytest -q -p no:cacheprovider --durations=30 tests

# Lint and format (ruff), types (mypy), and the layers of docs/architecture.md (import-linter).
lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

unit: $(TEST_STAMP)
	$(PY) -m pytest -q tests/unit

clean:
	rm -rf $(VENV) $(REPO) .pytest_cache
