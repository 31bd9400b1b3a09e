# Two commands a newcomer needs: `make run` (set up on first use, open the app) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test lint services-up services-down clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	@touch $(STAMP)

run: $(STAMP)
	$(BIN)/dojo

test: $(STAMP)
	$(BIN)/dojo services up
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check app tests labs
	$(BIN)/mypy
	@# each lab's checks on their own: every lab has its own _support, conftest, test_01_…
	@for checks in labs/*/checks; do echo "$(BIN)/mypy $$checks"; \
	  MYPYPATH=$$checks $(BIN)/mypy --explicit-package-bases $$checks || exit 1; done
	$(BIN)/dojo lint

services-up: $(STAMP)
	$(BIN)/dojo services up

services-down: $(STAMP)
	$(BIN)/dojo services down

clean:
	rm -rf $(VENV) build *.egg-info
