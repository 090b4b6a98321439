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
# Files written (8 at most come back from the device tool): device_check.log (everything), build.log,
# junit.xml, gemm.json, gemm.md, gemm.png, allocator.json, allocator.md.
# Budget (about 8 minutes on 16 cores): build ~1.5, tests ~3, GEMM benchmark <= 3, allocator benchmark
# and compute-sanitizer ~1.5. The CPU-only slow tests (C++ loader, DDP on gloo, TorchScript round trip)
# run in CI and are skipped here; the AOTInductor export test runs for CUDA.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-benchmarks/results/local/device-check}"
mkdir -p "$OUT"
exec > >(tee "$OUT/device_check.log") 2>&1
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
status=0
stage() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }

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

stage "build (MAX_JOBS=$(nproc), TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-default 8.0;9.0a})"
export MAX_JOBS="$(nproc)"
start=$(date +%s)
if ! timeout 300 "$PY" setup.py build_ext --inplace > "$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"; echo "BUILD FAILED"; exit 1
fi
echo "build took $(( $(date +%s) - start )) s"
grep -i "warning" "$OUT/build.log" | grep -v "Wno\|deprecated" | sort | uniq -c | sort -rn | head -10 || true

stage "tests (CPU and CUDA)"
timeout 240 "$PY" -m pytest tests -q -rfE --maxfail=30 --junitxml="$OUT/junit.xml" \
  -m "cuda or not slow" || status=1

stage "benchmark: ops.cutlass_gemm vs torch.mm"
timeout 200 "$PY" -m benchmarks.gemm --out "$OUT" ${BENCH_ARGS:-} || status=1

stage "benchmark: allocators"
timeout 90 "$PY" -m benchmarks.allocator --iters 1000 --out "$OUT" || status=1

stage "compute-sanitizer (memcheck, racecheck)"
for tool in memcheck racecheck; do
  timeout 90 compute-sanitizer --tool "$tool" --error-exitcode 9 "$PY" benchmarks/sanitizer_smoke.py \
    2>&1 | tail -5
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "compute-sanitizer $tool: FAILED"; status=1; }
done

stage "done (status $status)"
exit $status
