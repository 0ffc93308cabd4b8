# seqcls — the two commands a newcomer needs are `make demo` and `make test` (see README.md).
# Both create the virtualenv on first use from the lock files (~1.5 min, 2.7 GB) and reuse it after.
#
# requirements.txt      the human-edited top-level pins (edit this one, then `make lock`)
# requirements.lock     every package of the environment, exact versions + sha256 hashes (generated)
# requirements-build.lock  pip + what builds the package and the lock's sdists, hashed (generated)
# requirements-torch.txt / requirements-torch.lock  the seqcls[torch] extra (Hugging Face PyTorch
#                       checkpoints), locked on top of requirements.lock; `make test` installs it, `make demo` not
# `make setup` installs only from the two locks: nothing is resolved, every file is hash-checked,
# no build dependency is fetched unhashed (--no-build-isolation builds with the locked setuptools).
# Then two local distributions, editable: the product (pyproject.toml: seqcls + the serving modules
# of model_repository/common) and the development tools (tools/pyproject.toml: seqcls_tools).

SHELL := /bin/bash
VENV ?= .venv
PYTHON ?= $(shell command -v python3.11 || command -v python3)
PY := $(VENV)/bin/python
LOCK := requirements.lock
BUILD_LOCK := requirements-build.lock
STAMP := $(VENV)/.seqcls-installed-$(shell cat $(BUILD_LOCK) $(LOCK) pyproject.toml tools/pyproject.toml 2>/dev/null | sha256sum | cut -c1-12)
TORCH_LOCK := requirements-torch.lock
TORCH_STAMP := $(VENV)/.seqcls-torch-installed-$(shell cat $(LOCK) $(TORCH_LOCK) 2>/dev/null | sha256sum | cut -c1-12)
PERF_LOCK := requirements-perf.lock
PERF_DIR := $(VENV)/perf-analyzer
PERF_STAMP := $(PERF_DIR)/.installed-$(shell cat $(PERF_LOCK) 2>/dev/null | sha256sum | cut -c1-12)
PYTEST_ARGS ?=

.PHONY: setup setup-torch setup-perf system-deps lock demo test lint docs clean-demo airflow-ui bench stack

setup: $(STAMP)

# The seqcls[torch] extra on top of the main environment: only what requirements.lock lacks is
# installed (torch's CPU build, transformers), hash-checked like the rest (~15 s, +0.9 GB here).
setup-torch: setup $(TORCH_STAMP)

$(TORCH_STAMP): $(LOCK) $(TORCH_LOCK)
	$(VENV)/bin/pip install --quiet --require-hashes --no-deps -r $(TORCH_LOCK)
	$(VENV)/bin/pip check
	@rm -f $(VENV)/.seqcls-torch-installed-*
	@touch $@

# perf_analyzer (Triton's load generator, for the benchmark) beside the venv, not in it: two wheels
# --no-deps into $(PERF_DIR), hash-checked (~5 s, 45 MB); see requirements-perf.txt.
setup-perf: setup $(PERF_STAMP)

$(PERF_STAMP): $(PERF_LOCK)
	rm -rf $(PERF_DIR)
	$(VENV)/bin/pip install --quiet --require-hashes --no-deps --target $(PERF_DIR) -r $(PERF_LOCK)
	@touch $@

$(STAMP): $(BUILD_LOCK) $(LOCK) pyproject.toml tools/pyproject.toml
	@bash scripts/system-deps.sh
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), f"seqcls needs Python 3.11, found {sys.version.split()[0]} ($(PYTHON)); set PYTHON=/path/to/python3.11"'
	@$(PYTHON) -c 'import os, platform; libc = os.confstr("CS_GNU_LIBC_VERSION") or "no glibc"; ok = platform.machine() == "x86_64" and libc.startswith("glibc ") and tuple(map(int, libc.split()[1].split(".")[:2])) >= (2, 35); assert ok, f"$(LOCK) is for Linux x86_64 with glibc >= 2.35 (nvidia-pytriton wheels), found {platform.machine()} {libc}"'
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --require-hashes --no-deps -r $(BUILD_LOCK)
	$(VENV)/bin/pip install --quiet --require-hashes --no-deps --no-build-isolation -r $(LOCK)
	$(VENV)/bin/pip install --quiet --no-deps --no-build-isolation -e . -e tools
	$(VENV)/bin/pip check
	@rm -f $(VENV)/.seqcls-installed-*
	@touch $@

# Regenerate both locks from requirements.txt and pyproject's [build-system] (+ SDIST_BUILD_REQUIRES) with uv (installed on
# first use into build/lock-tools, pinned; UV=/path/to/uv to use another). Versions already in a
# lock are kept unless requirements.txt forces a change; UPGRADE=1 re-resolves every transitive
# package to the newest allowed, UPGRADE_PACKAGE="a b" only those. The target is this project's
# only platform: CPython 3.11 on Linux x86_64 with glibc >= 2.35 (nvidia-pytriton's wheels need
# manylinux_2_35). Hashes are PyPI's (uv ignores pip.conf; set UV_DEFAULT_INDEX for a mirror).
# The build lock is constrained by requirements.lock: a package in both (packaging) has one version.
UV_VERSION := 0.13.9
LOCK_TOOLS := build/lock-tools
UV ?= $(LOCK_TOOLS)/bin/uv
# What the lock's source-only packages need to build without isolation, besides setuptools+wheel:
# seqeval's sdist takes its version from setuptools-scm (without it: "metadata has 0.0.0"); jieba
# needs nothing else. A new sdist-only package with other build requirements goes here.
SDIST_BUILD_REQUIRES := setuptools-scm
# Where uv finds torch's CPU build (not on PyPI): a wheel directory or PyTorch's CPU index page.
TORCH_FIND_LINKS ?= https://download.pytorch.org/whl/cpu/torch/
UV_COMPILE = $(UV) pip compile --quiet --generate-hashes --python-version 3.11 \
	--python-platform x86_64-manylinux_2_35 --custom-compile-command 'make lock' \
	$(if $(UPGRADE),--upgrade) $(foreach p,$(UPGRADE_PACKAGE),--upgrade-package $(p))

lock:
	@command -v $(UV) >/dev/null || { $(PYTHON) -m venv $(LOCK_TOOLS) && $(LOCK_TOOLS)/bin/pip install --quiet uv==$(UV_VERSION); }
	$(UV_COMPILE) requirements.txt -o $(LOCK)
	$(PYTHON) -c 'import sys, tomllib; print("pip", *tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"], *sys.argv[1:], sep="\n")' \
	  $(SDIST_BUILD_REQUIRES) | $(UV_COMPILE) - -c $(LOCK) -o $(BUILD_LOCK)
	$(UV_COMPILE) --find-links $(TORCH_FIND_LINKS) requirements-torch.txt -c $(LOCK) -o $(TORCH_LOCK)
	$(UV_COMPILE) --no-deps requirements-perf.txt -o $(PERF_LOCK)

system-deps:
	@bash scripts/system-deps.sh

# Main job end to end on embedded defaults (builds the demo checkpoint once, then releases it).
demo: setup
	@bash scripts/demo.sh

# The Airflow UI (api-server, scheduler, dag-processor, triggerer) + local Triton on 127.0.0.1:8080,
# login admin / seqcls-demo, until Ctrl-C.
airflow-ui: setup
	.venv/bin/seqcls airflow-ui

# The compose file's stack as local processes (PostgreSQL, MLflow server, Redis, Triton, Airflow with the
# CeleryExecutor and two workers) on 127.0.0.1 until Ctrl-C; needs `make system-deps` (postgresql, redis-server).
stack: setup
	.venv/bin/seqcls team-stack

# The serving benchmark (see docs/performance.md); QUICK=1 for the seconds-long harness check.
bench: setup-perf
	.venv/bin/seqcls bench $(if $(QUICK),--quick,)

# The test suite CI runs (.ci/run calls exactly this): lint, the layers contract (pyproject's
# [tool.importlinter]), the manual (mkdocs build --strict: a broken link fails), then every test tier, on PYTEST_WORKERS
# pytest-xdist workers (0: one process). A test spends most of its time in one single-threaded Python
# process (a CLI, an Airflow task, a Triton stub), so one worker leaves the second core idle. Each
# worker takes whole files (module-scoped servers stay shared), longest first (tests/conftest.py).
# --max-worker-restart=0: a worker that dies ends the run naming its test; pytest-xdist 3.8 replacing it
# under --dist loadfile can wait forever (pytest-xdist#1327; a fresh-clone run hung that way).
PYTEST_WORKERS ?= 2
test: setup-torch setup-perf
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir build/site
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --max-worker-restart=0 --durations=40 $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check plugins tools tests dags model_repository

# The manual under docs/ (MkDocs Material) into build/site; `.venv/bin/mkdocs serve` to browse it live.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir build/site

clean-demo:
	rm -rf var/demo
