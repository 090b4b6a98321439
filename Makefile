# The two commands of README.md: `make bench` (the main job) and `make test`. Each first installs what
# the project needs and builds ops._C in place (incrementally: ninja rebuilds only changed files).
PYTHON ?= python3
PIP := $(PYTHON) -m pip
ARGS ?=

.PHONY: build bench test

build:
	$(PIP) install -q -r requirements.txt
	$(PIP) install -q --no-deps -r requirements-nodeps.txt
	$(PYTHON) setup.py -q build_ext --inplace

bench: build
	$(PYTHON) -m benchmarks.gemm $(ARGS)

test: build
	$(PYTHON) -m pytest tests $(ARGS)
