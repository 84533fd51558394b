# Two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
REPO   ?= model_repository

.PHONY: run test install models unit integration bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

$(REPO)/.built: $(STAMP)
	$(PY) -m gateway.cli models build --repo $(REPO)

models: $(REPO)/.built

# Serve the demo models on 127.0.0.1:8000 (HTTP) and :8001 (gRPC), replicas on a local Ray Serve.
run: models
	$(VENV)/bin/sloserve serve --repo $(REPO)

# The whole suite: unit tests (no Ray, no sleeps) and integration tests (real servers, real Ray).
test: models
	$(PY) -m pytest -q -p no:cacheprovider tests

unit: $(STAMP)
	$(PY) -m pytest -q tests/unit

clean:
	rm -rf $(VENV) $(REPO) .pytest_cache
