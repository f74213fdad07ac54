# pkmixer: `make demo` runs the main job, `make test` the test suite. Both create .venv with pip if missing.
VENV ?= .venv
PY := $(VENV)/bin/python
# The versions CI tested (`make constraints` writes them); `make install CONSTRAINTS=` lets pip choose instead.
CONSTRAINTS ?= constraints.txt
PIP := $(PY) -m pip install -q --no-cache-dir $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
# Where torch comes from: PyPI (on Linux x86-64 its CUDA build, which runs on the CPU too) unless this names another
# package index, e.g. `make install TORCH_INDEX=https://download.pytorch.org/whl/cpu` for PyTorch's CPU-only build.
TORCH_INDEX ?=

.PHONY: install test test-slow test-all demo bench bench-full constraints clean

# The runtime only: torch, timm and the rest of pyproject's dependencies, pkmixer itself editable.
# --no-cache-dir: where torch is downloaded (a ~3 GB CUDA build), pip's cache would hold a second copy of it, and
# a CI machine once ran out of disk during this install.
$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --no-cache-dir --upgrade pip
	$(if $(TORCH_INDEX),$(PIP) --index-url $(TORCH_INDEX) torch torchvision)
	$(PIP) -e .
	touch $@

# What the tests need beyond it: pyproject's test extra (pytest, pytest-timeout, JAX, Flax, Ray).
$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) -e '.[test]'
	touch $@

install: $(VENV)/.installed

# The slow tier's budget in seconds: pytest-timeout stops the session after it (checked between tests; each test
# is bounded by the `timeout` in pyproject.toml). It took 7 min on 2 shared cores (docs/architecture.md).
SLOW_BUDGET_S ?= 1500

test: $(VENV)/.installed-test  # the default tier: every test not marked slow
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-slow: $(VENV)/.installed-test  # the slow tier only: training to an accuracy, kill/resume, Ray, torchrun, full-size models
	$(PY) -m pytest -q -m slow --session-timeout=$(SLOW_BUDGET_S) $(PYTEST_ARGS)

test-all: $(VENV)/.installed-test  # both tiers in one run
	$(PY) -m pytest -q -m "" $(PYTEST_ARGS)

demo: install  # Fig. 5 at small scale: pkmixer reproduce fig5 --scale small (writes results/; resumable)
	$(VENV)/bin/pkmixer reproduce fig5 --scale small

bench: install  # benchmark suite, quick mode (a few minutes on 2 cores): benchmarks/results/*.json and *.md
	$(PY) -m benchmarks.run --mode $(or $(MODE),quick)

bench-full: install  # the full suite (an hour or more on 2 cores); same as `make bench MODE=full`
	$(PY) -m benchmarks.run --mode full

constraints: $(VENV)/.installed-test  # rewrite constraints.txt from .venv (after the tests pass with new versions)
	$(PY) .ci/freeze_constraints.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache
