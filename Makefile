# seqcls — the two commands a newcomer needs are `make demo` and `make test` (see README.md).
# Both create the virtualenv on first use (pinned requirements.txt, ~1.5-3 min) and reuse it after.

SHELL := /bin/bash
VENV ?= .venv
PYTHON ?= $(shell command -v python3.11 || command -v python3)
PY := $(VENV)/bin/python
STAMP := $(VENV)/.seqcls-installed-$(shell cat requirements.txt pyproject.toml | sha256sum | cut -c1-12)
PYTEST_ARGS ?=

.PHONY: setup system-deps demo test lint clean-demo airflow-ui bench

setup: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	@bash scripts/system-deps.sh
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), f"seqcls needs Python 3.11, found {sys.version.split()[0]} ($(PYTHON)); set PYTHON=/path/to/python3.11"'
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -r requirements.txt
	$(VENV)/bin/pip install --quiet --no-deps -e .
	$(VENV)/bin/pip check
	@rm -f $(VENV)/.seqcls-installed-*
	@touch $@

system-deps:
	@bash scripts/system-deps.sh

# Main job end to end on embedded defaults (builds the demo checkpoint once, then releases it).
demo: setup
	@bash scripts/demo.sh

# The Airflow UI (api-server, scheduler, dag-processor, triggerer) + local Triton on 127.0.0.1:8080,
# login admin / seqcls-demo, until Ctrl-C.
airflow-ui: setup
	.venv/bin/seqcls airflow-ui

# The serving benchmark (see README: Performance); QUICK=1 for the seconds-long harness check.
bench: setup
	.venv/bin/seqcls bench $(if $(QUICK),--quick,)

# The test suite CI runs (.ci/run calls exactly this): lint, then every test tier.
test: setup
	$(VENV)/bin/ruff check .
	$(PY) -m pytest $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check plugins tools tests dags model_repository

clean-demo:
	rm -rf var/demo
