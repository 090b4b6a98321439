# The two commands of README.md: `make bench` (the main job) and `make test`. Each first installs what
# the project needs and builds ops._C in place (incrementally: ninja rebuilds only changed files).
PYTHON ?= python3
PIP := $(PYTHON) -m pip
ARGS ?=

.PHONY: build bench test test-quick

build:
	$(PIP) install -q -r requirements.txt
	$(PIP) install -q --no-deps -r requirements-nodeps.txt
	$(PYTHON) setup.py -q build_ext --inplace

bench: build
	$(PYTHON) -m benchmarks.gemm $(ARGS)

test: build
	$(PYTHON) -m pytest tests $(ARGS)

# The common loop: every op's values, errors and modes, without the slow tests and the files that build or
# run other programs (benchmark CLIs, host emulations, the fuzzer, packaging, the compile pass, machine code).
QUICK_SKIP := benchmarks compile_fuzz compile_pass fused_emulation quantize_fp8_emulation simt_gemv_emulation \
	prebuilt package threads tuning_cache_files machine_code allocator_environment
test-quick: build
	$(PYTHON) -m pytest tests -m "not slow" $(foreach f,$(QUICK_SKIP),--ignore=tests/test_$(f).py) $(ARGS)
