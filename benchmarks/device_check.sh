#!/usr/bin/env bash
# The GPU check (DESIGN.md, "The GPU check"): on a bare GPU machine, build the package with all cores,
# run the tests (CUDA ones included) and the GEMM benchmark, and write logs, JSON, markdown and a plot
# to $OUT (or benchmarks/results/local/device-check when $OUT is unset). Sized for one device call of
# at most 9 minutes: each stage has its own time limit, and a failing stage does not stop the others.
#
# The device machine has torch, nvcc, ninja, pytest, hypothesis, matplotlib and tqdm, but no
# nvidia-cutlass and no registry. Carry the wheel (about 6 MB) in .whl/ (git-ignored):
#   python3 -m pip download --no-deps --only-binary=:all: -d .whl nvidia-cutlass==4.2.0.0
# and call, from the repository root:   bash benchmarks/device_check.sh       (carry: [".whl"])
#
# Files written (8 at most come back from the device tool per call): device_check.log (everything),
# build.log, gemm.json, gemm.md, gemm.png, gemm_candidates.json, gemm_candidates.md (stage gemm),
# gemm_overhead.json (stage overhead), ops.json, model.json, allocator.json (their stages).
#
# STAGES picks what runs (default: all): build tests gemm overhead ops model allocator sanitizer (the
# build always runs). All stages together exceed one 10-minute device call; run them as calls on one
# warm machine (the build is kept: later builds are no-ops), most important first:
#   STAGES="build tests" bash benchmarks/device_check.sh                  (~4 min build + ~3 min tests)
#   STAGES="gemm overhead" bash benchmarks/device_check.sh                (~3 min)
#   STAGES="ops model allocator sanitizer" bash benchmarks/device_check.sh (~4 min)
# The gemm stage also times every candidate tactic of the half-precision shapes (--candidates): the
# data the tactic heuristic (cutlass_gemm/tactic.cpp) is to be fitted to.
# GEMM_ARGS passes options to benchmarks.gemm (e.g. "--quick"). CPU tests run in CI, not here.
# Time limits send SIGINT first (`limit`): pytest then prints its summary of what ran, and the
# benchmarks write the cases measured so far (marked INTERRUPTED); a process still alive 20 s later is
# killed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-benchmarks/results/local/device-check}"
mkdir -p "$OUT"
exec > >(tee "$OUT/device_check.log") 2>&1
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
status=0
stage() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
limit() { timeout -s INT -k 20 "$@"; }

stage "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv || true
"$PY" -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'gpu', torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))"
nvcc --version | tail -2
echo "cores: $(nproc)"

stage "CUTLASS headers"
if ! "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('cutlass_library') is None)"; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/ops-site .whl/nvidia_cutlass-*.whl \
    && export PYTHONPATH="/tmp/ops-site${PYTHONPATH:+:$PYTHONPATH}" \
    || { echo "no nvidia-cutlass wheel in .whl/ (see the header of this script)"; exit 2; }
fi

STAGES="${STAGES:-build tests gemm ops model allocator sanitizer}"
stage "build (MAX_JOBS=$(nproc), TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-default 8.0;9.0a})"
export MAX_JOBS="$(nproc)"
start=$(date +%s)
if ! timeout 360 "$PY" setup.py build_ext --inplace > "$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"; echo "BUILD FAILED"; exit 1
fi
echo "build took $(( $(date +%s) - start )) s"
grep -i "warning" "$OUT/build.log" | grep -v "Wno\|deprecated" | sort | uniq -c | sort -rn | head -10 || true

want() { [[ " ${STAGES} " == *" $1 "* ]]; }
MORE="$(mktemp -d)"  # markdown twins of the JSON files (the device tool returns 8 files at most)
keep() { [ -f "$MORE/$1" ] && cp "$MORE/$1" "$OUT/"; }  # also what an interrupted benchmark wrote

if want tests; then
  stage "tests: CUDA (CPU tests run in CI)"
  limit 240 "$PY" -m pytest tests -q -rfE --maxfail=30 -m cuda -k "not test_export" || status=1
  stage "tests: torch.export + AOTInductor on CUDA (cutlass_gemm)"
  limit 120 "$PY" -m pytest tests/test_export.py -q -rfE -k "cuda and cutlass_gemm" || status=1
fi

if want gemm; then
  stage "benchmark: ops.cutlass_gemm vs torch.mm (and every candidate tactic of bf16/fp16 shapes)"
  limit 240 "$PY" -m benchmarks.gemm --candidates --out "$OUT" ${GEMM_ARGS:-} || status=1
fi

if want overhead; then
  stage "benchmark: call cost of tiny GEMMs (host overhead)"
  limit 60 "$PY" -m benchmarks.gemm --suite overhead --dtypes bf16,fp32 --out "$MORE" || status=1
  keep gemm_overhead.json
fi

if want ops; then
  stage "benchmark: fused ops vs PyTorch"
  limit 90 "$PY" -m benchmarks.ops --out "$MORE" || status=1
  keep ops.json
fi

if want model; then
  stage "benchmark: MiniLM and Llama MLP block, stock vs ops"
  limit 120 "$PY" -m benchmarks.model --out "$MORE" || status=1
  keep model.json
fi

if want allocator; then
  stage "benchmark: allocators"
  limit 90 "$PY" -m benchmarks.allocator --iters 1000 --out "$MORE" || status=1
  keep allocator.json
fi

if want sanitizer; then
  stage "compute-sanitizer (memcheck, racecheck)"
  for tool in memcheck racecheck; do
    timeout 75 compute-sanitizer --tool "$tool" --error-exitcode 9 "$PY" benchmarks/sanitizer_smoke.py 2>&1 | tail -5
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "compute-sanitizer $tool: FAILED"; status=1; }
  done
fi

stage "done (status $status)"
exit $status
