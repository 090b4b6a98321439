#!/usr/bin/env bash
# The GPU check: on a bare GPU machine, build the package with all cores,
# run the CUDA tests, the benchmarks and compute-sanitizer, and write logs, JSON, markdown and plots
# to $OUT (or benchmarks/results/local/device-check when $OUT is unset).
#
# The device machine has torch, nvcc, ninja, pytest, hypothesis, matplotlib and tqdm, but no
# nvidia-cutlass and no registry. Carry the wheel (about 6 MB) in .whl/ (git-ignored):
#   python3 -m pip download --no-deps --only-binary=:all: -d .whl nvidia-cutlass==4.2.0.0
# and call, from the repository root:   bash benchmarks/device_check.sh       (carry: [".whl"])
# To skip the build on the device (~2 minutes of device time), prebuild the library here for its torch
# and sm_90a (benchmarks/prebuilt.py says how) into .prebuilt/ (git-ignored) and carry it too
# (carry: [".whl", ".prebuilt"]). It is used only if built from these very sources against the same
# torch build; PREBUILT=0 builds anyway.
#
# Files written to $OUT: device_check.log (everything, as it runs) and results.tgz, which holds the rest:
# build.log, tests.xml and tests_sm80.xml (JUnit); stage gemm: gemm_half/ and gemm_fp32/
# (gemm.{json,md,png}) and gemm_candidates/ (gemm_candidates.{json,md}); sanitizer_*.log;
# gemm_overhead.{json,md} (overhead); ops.{json,md} and ops_candidates/ (ops_linear_candidates.*,
# ops_rms_kernels.*); model.*, allocator.* (their stages). results.tgz is rewritten after every stage, so a
# call cut off at its time limit still returns the stages that ended (the device tool returns at most
# 8 files per call: one archive fits any number of reports).
#
# STAGES picks what runs (default: all): build sm80 gemm tests sanitizer diag ops model overhead allocator
# (the build always runs), in the order of this script, most decisive first. All of them exceed one
# 9-minute device call: run two calls on one warm machine (benchmarks/GPU_PLAN.md), the second at once
# (a machine goes back 30 s after a call): STAGES="build sm80 gemm tests" (the test stage, last, gets
# what is left of 560 s), then STAGES="sanitizer diag ops model overhead allocator" (its build is a
# ninja no-op; its limits add up to ~10 minutes, so the later stages may be cut: they come last). Each
# stage has its own time limit; a failing stage does not stop the others.
# The gemm stage also times every candidate tactic of the half-precision shapes (--candidates): the
# data the tactic heuristic (cutlass_gemm/tactic.cpp) is to be fitted to.
# GEMM_ARGS passes options to benchmarks.gemm (e.g. "--quick"); TEST_JOBS the pytest-xdist workers
# (default 8; 0 runs the tests in one process). CPU tests run in CI, not here.
# Time limits send SIGINT first (`limit`): pytest then prints its summary of what ran, and the
# benchmarks write the cases measured so far (marked INTERRUPTED); a process still alive 20 s later is
# killed. A benchmark that hits an error (a kernel failing on one shape) reports the cases before it
# (marked ABORTED, with the error) and exits non-zero; one that dies outright (a segfault) leaves them in
# <report>.partial.jsonl, one JSON line per case. The candidate sweeps check each tactic's output
# against a float64 reference before timing it: a wrong one is listed under "wrong results", not timed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-benchmarks/results/local/device-check}"
mkdir -p "$OUT"
exec > >(tee "$OUT/device_check.log") 2>&1
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
status=0
t0=$(date +%s)  # the call's start: the last stage of call 1 gets what is left of its budget
stage() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
limit() { timeout -s INT -k 20 "$@"; }

stage "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv || true
"$PY" -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, torch.version.git_version[:12], 'cuda', torch.version.cuda, 'gpu', torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))"
nvcc --version | tail -2
echo "cores: $(nproc --all)"

stage "CUTLASS headers"
if ! "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('cutlass_library') is None)"; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/ops-site .whl/nvidia_cutlass-*.whl \
    && export PYTHONPATH="/tmp/ops-site${PYTHONPATH:+:$PYTHONPATH}" \
    || { echo "no nvidia-cutlass wheel in .whl/ (see the header of this script)"; exit 2; }
fi

STAGES="${STAGES:-build sm80 gemm tests sanitizer diag ops model overhead allocator}"
MORE="$(mktemp -d)"  # every report; packed into $OUT/results.tgz after each stage
pack() { tar -czf "$OUT/results.tgz.part" -C "$MORE" . && mv "$OUT/results.tgz.part" "$OUT/results.tgz"; }
trap pack EXIT

stage "build (MAX_JOBS=$(nproc --all), TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-default 8.0;9.0a})"
export MAX_JOBS="$(nproc --all)"
start=$(date +%s)
# A library prebuilt on a CPU machine for this torch and sm_90a (benchmarks/prebuilt.py; carry
# .prebuilt) saves the build's ~2 minutes, if it was built from these very sources; else, build.
if [ -d .prebuilt ] && [ "${PREBUILT:-1}" != 0 ] && "$PY" -m benchmarks.prebuilt use .prebuilt > "$MORE/build.log" 2>&1; then
  cat "$MORE/build.log"
else
  [ -s "$MORE/build.log" ] && cat "$MORE/build.log"
  if ! timeout 360 "$PY" setup.py build_ext --inplace >> "$MORE/build.log" 2>&1; then
    tail -40 "$MORE/build.log"; echo "BUILD FAILED"; exit 1
  fi
  grep -i "warning" "$MORE/build.log" | grep -v "Wno\|deprecated" | sort | uniq -c | sort -rn | head -10 || true
fi
echo "build took $(( $(date +%s) - start )) s"
pack

want() { [[ " ${STAGES} " == *" $1 "* ]]; }

jobs=()  # pytest-xdist workers for the test stages
if [ "${TEST_JOBS:-8}" != 0 ] && "$PY" -c "import xdist" 2>/dev/null; then jobs=(-n "${TEST_JOBS:-8}"); fi

if want sm80; then
  # The CUTLASS 2.x kernels on Hopper, which the library withholds there unless OPS_CUTLASS_SM80_ON_SM90=1
  # (they gave wrong results through CUTLASS's 2.x GemmUniversalAdapter on 2026-11-30; now launched
  # through GemmUniversalBase). If this passes, they can be dispatched on Hopper by default.
  stage "tests: the SM80 kernels on Hopper (OPS_CUTLASS_SM80_ON_SM90=1: fp32 3xTF32, fp64)"
  OPS_CUTLASS_SM80_ON_SM90=1 limit 100 "$PY" -m pytest tests/test_gemm_cuda.py tests/test_gemm.py \
    tests/test_linear.py tests/test_func_transforms.py -q -rfE --maxfail=20 "${jobs[@]}" -m cuda \
    -k "dtype2 or dtype3 or float32 or float64 or fp32 or gradcheck or func_transform" \
    --junitxml="$MORE/tests_sm80.xml" || status=1
  pack
fi

if want gemm; then
  # One process per dtype group: a crash in one (the first run lost every bf16/fp16 timing to a
  # segfault in the fp32 case) keeps the others' reports.
  # The heuristic's table first, then every candidate tactic in a second process: a candidate never run
  # on a GPU before (the SIMT GEMV, the 128x256 fused linear) that breaks the CUDA context costs the
  # sweep's remaining shapes, not the main table (the first run took ~11 s for both dtypes with the sweep).
  stage "benchmark: ops.cutlass_gemm vs torch.mm, bf16/fp16"
  limit 60 "$PY" -m benchmarks.gemm --dtypes bf16,fp16 --out "$MORE/gemm_half" ${GEMM_ARGS:-} || status=1
  pack
  stage "benchmark: every candidate tactic of the bf16/fp16 shapes"
  limit 120 "$PY" -m benchmarks.gemm --dtypes bf16,fp16 --candidates --out "$MORE/gemm_candidates" ${GEMM_ARGS:-} || status=1
  pack
  stage "benchmark: ops.cutlass_gemm vs torch.mm, tf32/fp32/fp64 (the SM80 3xTF32 and fp64 kernels on)"
  OPS_CUTLASS_SM80_ON_SM90=1 limit 60 "$PY" -m benchmarks.gemm --dtypes tf32,fp32,fp64 --suite square --out "$MORE/gemm_fp32" ${GEMM_ARGS:-} || status=1
  pack
fi

if want tests; then
  stage "tests: CUDA, torch.export + AOTInductor with cutlass_gemm (CPU tests run in CI)"
  left=$(( 560 - ($(date +%s) - t0) ))  # ends inside a 590 s device call, with pytest's summary
  # The files that decide the open issues first, then the rest: a time limit cuts the tail (the first
  # run ended 259 tests into ~900).
  first="tests/test_gemm_cuda.py tests/test_linear.py tests/test_gemm.py tests/test_fused.py tests/test_allocator.py tests/test_streams.py"
  rest=$(ls tests/test_*.py | grep -v -x -F -f <(tr ' ' '\n' <<< "$first"))
  # shellcheck disable=SC2086
  limit $(( left > 300 ? 300 : (left < 30 ? 30 : left) )) "$PY" -m pytest $first $rest -q -rfE --maxfail=30 --durations=15 "${jobs[@]}" -m cuda \
    -k "not test_export or cutlass_gemm" --junitxml="$MORE/tests.xml" || status=1
  pack
fi

if want sanitizer; then
  # PYTORCH_NO_CUDA_MEMORY_CACHING=1: every tensor its own cudaMalloc, so a write past a tensor's end is
  # an error for memcheck (inside one of the caching allocator's segments it is invisible). The SM80
  # kernels run too (OPS_CUTLASS_SM80_ON_SM90=1).
  stage "compute-sanitizer (memcheck, racecheck)"
  for tool in memcheck racecheck; do
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 OPS_CUTLASS_SM80_ON_SM90=1 timeout 75 compute-sanitizer --tool "$tool" \
      --error-exitcode 9 --print-limit 50 --log-file "$MORE/sanitizer_$tool.log" \
      "$PY" -m benchmarks.sanitizer_smoke 2>&1 | tail -5
    rc=${PIPESTATUS[0]}
    tail -5 "$MORE/sanitizer_$tool.log" 2>/dev/null
    case $rc in
      0) ;;
      124) echo "compute-sanitizer $tool: TIMED OUT"; status=1 ;;
      *) echo "compute-sanitizer $tool: FAILED (exit $rc; its report: sanitizer_$tool.log)"; status=1 ;;
    esac
  done
  pack
fi

if want diag; then
  # The allocator's out-of-memory path segfaulted on 2026-11-30 (test_out_of_memory_raises_and_pool_stays_usable):
  # which step dies. faulthandler prints the Python line; segv_backtrace.so (LD_PRELOAD) the native
  # frames, named by symbolize_backtrace.sh. A-D: the test's steps; E-F: our pool's null-return path
  # with the same size, no exception; G: PyTorch's own cudaMallocAsync backend asking the driver for
  # the same 64 TiB (a driver fault would crash it too).
  stage "diagnostic: ops allocator out of memory"
  preload=""
  if cc -shared -fPIC -O1 -o /tmp/segv_backtrace.so benchmarks/diag/segv_backtrace.c 2>&1; then preload=/tmp/segv_backtrace.so; fi
  diag() {  # diag NAME [ENV=VALUE ...] -- CODE
    local name="$1"; shift
    local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
    echo "--- $name"
    env "${envs[@]}" LD_PRELOAD="$preload" timeout 60 "$PY" -X faulthandler -c "$1" > "$MORE/diag_$name.log" 2>&1
    echo "exit status $?" >> "$MORE/diag_$name.log"
    benchmarks/diag/symbolize_backtrace.sh ops/_C.abi3.so < "$MORE/diag_$name.log" | tail -60
  }
  # The test's request (64 TiB), then 1 TiB (also far beyond the GPU): whether the size or the path
  # crashes.
  throw='
import os, torch, ops
ops.allocator.install(); print("A installed", flush=True)
try:
    torch.empty(1 << int(os.environ["SIZE_LOG2"]), dtype=torch.uint8, device="cuda")
except torch.cuda.OutOfMemoryError as e:
    print("B raised:", str(e)[:80], flush=True)
print("C stats:", ops.allocator.stats(), flush=True)
x = torch.ones(1 << 20, device="cuda"); print("D", x.sum().item(), flush=True)'
  diag throw SIZE_LOG2=46 -- "$throw"
  diag throw_1tib SIZE_LOG2=40 -- "$throw"
  diag null -- '
import ctypes, torch, ops
torch.cuda.init(); lib = ops.allocator._lib(); lib.ops_pool_alloc.restype = ctypes.c_void_p
lib.ops_pool_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]  # else 1 << 46 passes as int 0
print("E null path:", lib.ops_pool_alloc(1 << 46, 0, None), flush=True); print("F", ops.allocator.stats(), flush=True)'
  diag driver PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync -- '
import torch
try:
    torch.empty(1 << 46, dtype=torch.uint8, device="cuda")
except torch.cuda.OutOfMemoryError as e:
    print("G cudaMallocAsync backend raised:", str(e)[:80], flush=True)'
  pack
fi

if want ops; then
  stage "benchmark: fused ops vs PyTorch"
  limit 60 "$PY" -m benchmarks.ops --out "$MORE" || status=1
  pack
  # The sweeps in their own process, as for the GEMM (ops_candidates/ also gets its own ops.md).
  stage "benchmark: every fused-linear tactic and rms_norm kernel variant"
  limit 120 "$PY" -m benchmarks.ops --candidates --out "$MORE/ops_candidates" || status=1
  pack
fi

if want model; then
  stage "benchmark: MiniLM and Llama MLP block, stock vs ops"
  limit 90 "$PY" -m benchmarks.model --out "$MORE" || status=1
  pack
fi

if want overhead; then
  stage "benchmark: call cost of tiny GEMMs (host overhead; fp32 on the SM80 3xTF32 kernel)"
  OPS_CUTLASS_SM80_ON_SM90=1 limit 90 "$PY" -m benchmarks.gemm --suite overhead --dtypes bf16,fp32 --out "$MORE" || status=1
  pack
fi

if want allocator; then
  stage "benchmark: allocators"
  limit 60 "$PY" -m benchmarks.allocator --iters 1000 --out "$MORE" || status=1
  pack
fi

stage "done (status $status)"
exit $status
