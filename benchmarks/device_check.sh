#!/usr/bin/env bash
# The GPU check (DESIGN.md, "The GPU check"): on a bare GPU machine, build the package with all cores,
# run the CUDA tests, the benchmarks and compute-sanitizer, and write logs, JSON, markdown and plots
# to $OUT (or benchmarks/results/local/device-check when $OUT is unset).
#
# The device machine has torch, nvcc, ninja, pytest, hypothesis, matplotlib and tqdm, but no
# nvidia-cutlass and no registry. Carry the wheel (about 6 MB) in .whl/ (git-ignored):
#   python3 -m pip download --no-deps --only-binary=:all: -d .whl nvidia-cutlass==4.2.0.0
# and call, from the repository root:   bash benchmarks/device_check.sh       (carry: [".whl"])
#
# Files written to $OUT: device_check.log (everything, as it runs) and results.tgz, which holds the rest:
# build.log, tests.xml (JUnit), gemm.{json,md,png}, gemm_candidates.{json,md} (stage gemm),
# gemm_overhead.{json,md} (overhead), ops.*, model.*, allocator.* (their stages). results.tgz is
# rewritten after every stage, so a call cut off at its time limit still returns the stages that ended
# (the device tool returns at most 8 files per call: one archive fits any number of reports).
#
# STAGES picks what runs (default: all): build tests gemm overhead ops model allocator sanitizer (the
# build always runs), in the order of this script: most important first. With 16 cores the whole script
# is planned to fit one call of < 10 minutes (build ~2-3 min, tests on 8 pytest-xdist workers, the
# benchmarks ~1 min each); each stage has its own time limit, and a failing stage does not stop the
# others. A later call on the same warm machine reuses the build (ninja: no work).
# The gemm stage also times every candidate tactic of the half-precision shapes (--candidates): the
# data the tactic heuristic (cutlass_gemm/tactic.cpp) is to be fitted to.
# GEMM_ARGS passes options to benchmarks.gemm (e.g. "--quick"); TEST_JOBS the pytest-xdist workers
# (default 8; 0 runs the tests in one process). CPU tests run in CI, not here.
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

STAGES="${STAGES:-build tests gemm ops model overhead allocator sanitizer}"
MORE="$(mktemp -d)"  # every report; packed into $OUT/results.tgz after each stage
pack() { tar -czf "$OUT/results.tgz.part" -C "$MORE" . && mv "$OUT/results.tgz.part" "$OUT/results.tgz"; }
trap pack EXIT

stage "build (MAX_JOBS=$(nproc), TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-default 8.0;9.0a})"
export MAX_JOBS="$(nproc)"
start=$(date +%s)
if ! timeout 360 "$PY" setup.py build_ext --inplace > "$MORE/build.log" 2>&1; then
  tail -40 "$MORE/build.log"; echo "BUILD FAILED"; exit 1
fi
echo "build took $(( $(date +%s) - start )) s"
grep -i "warning" "$MORE/build.log" | grep -v "Wno\|deprecated" | sort | uniq -c | sort -rn | head -10 || true
pack

want() { [[ " ${STAGES} " == *" $1 "* ]]; }

if want tests; then
  stage "tests: CUDA, torch.export + AOTInductor with cutlass_gemm (CPU tests run in CI)"
  jobs=()
  if [ "${TEST_JOBS:-8}" != 0 ] && "$PY" -c "import xdist" 2>/dev/null; then jobs=(-n "${TEST_JOBS:-8}"); fi
  limit 200 "$PY" -m pytest tests -q -rfE --maxfail=30 --durations=15 "${jobs[@]}" -m cuda \
    -k "not test_export or cutlass_gemm" --junitxml="$MORE/tests.xml" || status=1
  pack
fi

if want gemm; then
  stage "benchmark: ops.cutlass_gemm vs torch.mm (and every candidate tactic of bf16/fp16 shapes)"
  limit 180 "$PY" -m benchmarks.gemm --candidates --out "$MORE" ${GEMM_ARGS:-} || status=1
  pack
fi

if want ops; then
  stage "benchmark: fused ops vs PyTorch"
  limit 90 "$PY" -m benchmarks.ops --out "$MORE" || status=1
  pack
fi

if want model; then
  stage "benchmark: MiniLM and Llama MLP block, stock vs ops"
  limit 90 "$PY" -m benchmarks.model --out "$MORE" || status=1
  pack
fi

if want overhead; then
  stage "benchmark: call cost of tiny GEMMs (host overhead)"
  limit 60 "$PY" -m benchmarks.gemm --suite overhead --dtypes bf16,fp32 --out "$MORE" || status=1
  pack
fi

if want allocator; then
  stage "benchmark: allocators"
  limit 60 "$PY" -m benchmarks.allocator --iters 1000 --out "$MORE" || status=1
  pack
fi

if want sanitizer; then
  stage "compute-sanitizer (memcheck, racecheck)"
  for tool in memcheck racecheck; do
    timeout 75 compute-sanitizer --tool "$tool" --error-exitcode 9 "$PY" -m benchmarks.sanitizer_smoke 2>&1 | tail -5
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "compute-sanitizer $tool: FAILED"; status=1; }
  done
fi

stage "done (status $status)"
exit $status
