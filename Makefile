# pkmixer: `make demo` runs the main job, `make test` the test suite. Both create .venv with pip if missing.
VENV ?= .venv
PY := $(VENV)/bin/python
# The torch build this project is tested with on Linux x86-64; elsewhere pip picks a matching release.
ifeq ($(shell uname -sm),Linux x86_64)
TORCH_SPEC ?= torch==2.14.1 torchvision==0.29.1
else
TORCH_SPEC ?= torch torchvision
endif

.PHONY: install test test-all demo bench bench-full clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed

test: install
	$(PY) -m pytest -q

test-all: install  # slow tests included
	$(PY) -m pytest -q -m ""

demo: install  # Fig. 5 at small scale: S-Mixer, RP S-Mixer, SW-MLP against width at fixed Ω (results/; resumable)
	$(VENV)/bin/pkmixer reproduce fig5 --scale small

bench: install  # benchmark suite, quick mode (a few minutes on 2 cores): benchmarks/results/*.json and *.md
	$(PY) -m benchmarks.run --mode $(or $(MODE),quick)

bench-full: install  # the full suite (an hour or more on 2 cores); same as `make bench MODE=full`
	$(PY) -m benchmarks.run --mode full

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
