# Two commands a newcomer needs: `make run` (set up on first use, open the app) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check
# `make run` needs only the runtime; tests and lint add the dev extra (ruff, mypy, snapshots).
RUNTIME_STAMP := $(VENV)/.runtime
DEV_STAMP     := $(VENV)/.installed

.PHONY: run test lint services-up services-down clean

$(BIN)/python:
	@echo "dojo: creating $(VENV) with $$($(PYTHON) --version 2>&1)"
	@$(PYTHON) -m venv $(VENV)
	@echo "dojo: updating pip"
	@$(PIP) install --quiet --upgrade pip

$(RUNTIME_STAMP): pyproject.toml | $(BIN)/python
	@echo "dojo: installing Interview Dojo and what it runs on (the first time takes a minute)"
	@$(PIP) install --progress-bar on -e .
	@touch $@

$(DEV_STAMP): pyproject.toml | $(BIN)/python
	@echo "dojo: installing Interview Dojo with the tools for tests and lint"
	@$(PIP) install --progress-bar on -e ".[dev]"
	@touch $(RUNTIME_STAMP) $@

run: $(RUNTIME_STAMP)
	$(BIN)/dojo

test: $(DEV_STAMP)
	$(BIN)/dojo services up
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(DEV_STAMP)
	$(BIN)/ruff check app tests labs
	$(BIN)/mypy
	@# each lab's checks on their own: every lab has its own _support, conftest, test_01_…
	@for checks in labs/*/checks; do echo "$(BIN)/mypy $$checks"; \
	  MYPYPATH=$$checks $(BIN)/mypy --explicit-package-bases $$checks || exit 1; done
	$(BIN)/dojo lint

services-up: $(RUNTIME_STAMP)
	$(BIN)/dojo services up

services-down: $(RUNTIME_STAMP)
	$(BIN)/dojo services down

clean:
	rm -rf $(VENV) build *.egg-info
