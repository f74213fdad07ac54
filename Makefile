# pkmixer: `make demo` runs the main job, `make test` the test suite. Both create .venv with pip if missing.
VENV ?= .venv
PY := $(VENV)/bin/python
# The torch build this project is tested with on Linux x86-64; elsewhere pip picks a matching release.
ifeq ($(shell uname -sm),Linux x86_64)
TORCH_SPEC ?= torch==2.14.1 torchvision==0.29.1
else
TORCH_SPEC ?= torch torchvision
endif

.PHONY: install test test-slow test-all demo bench bench-full clean

# --no-cache-dir: where torch is downloaded (a ~3 GB CUDA build), pip's cache would hold a second copy of it, and
# a CI machine once ran out of disk during this install.
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --no-cache-dir --upgrade pip
	$(PY) -m pip install -q --no-cache-dir $(TORCH_SPEC)
	$(PY) -m pip install -q --no-cache-dir -e '.[test]'
	touch $@

install: $(VENV)/.installed

# The slow tier's budget in seconds: pytest-timeout stops the session after it (checked between tests; each test
# is bounded by the `timeout` in pyproject.toml). It took 7 min on 2 shared cores (docs/architecture.md).
SLOW_BUDGET_S ?= 1500

test: install  # the default tier: every test not marked slow (under 3 min on 2 quiet cores)
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-slow: install  # the slow tier only: training to an accuracy, kill/resume, Ray, torchrun, full-size models
	$(PY) -m pytest -q -m slow --session-timeout=$(SLOW_BUDGET_S) $(PYTEST_ARGS)

test-all: install  # both tiers in one run
	$(PY) -m pytest -q -m "" $(PYTEST_ARGS)

demo: install  # Fig. 5 at small scale, a subset of its medium design: two S-Mixer widths at fixed Ω, 5 seeds (results/; resumable)
	$(VENV)/bin/pkmixer reproduce fig5 --scale small

bench: install  # benchmark suite, quick mode (a few minutes on 2 cores): benchmarks/results/*.json and *.md
	$(PY) -m benchmarks.run --mode $(or $(MODE),quick)

bench-full: install  # the full suite (an hour or more on 2 cores); same as `make bench MODE=full`
	$(PY) -m benchmarks.run --mode full

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
