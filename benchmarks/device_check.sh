#!/usr/bin/env bash
# The GPU check: on a bare GPU machine, build the package with all cores,
# run the CUDA tests, the benchmarks and compute-sanitizer, and write logs, JSON, markdown and plots
# to the folder given as its argument (default benchmarks/results/local/):
#   bash benchmarks/device_check.sh [OUTDIR]
#
# The device machine has torch, nvcc, ninja, pytest, hypothesis, matplotlib and tqdm, but no
# nvidia-cutlass and no registry. Carry the wheel (about 6 MB) in .whl/ (git-ignored):
#   python3 -m pip download --no-deps --only-binary=:all: -d .whl nvidia-cutlass==4.2.0.0
# and call, from the repository root:   bash benchmarks/device_check.sh OUTDIR   (carry: [".whl"])
# To skip the build on the device (minutes: an SM90 16-bit kernel TU takes ~3 on one core here), prebuild the library here for its torch
# and sm_90a (benchmarks/prebuilt.py says how) into .prebuilt/ (git-ignored) and carry it too
# (carry: [".whl", ".prebuilt"]). It is used only if built from these very sources against the same
# torch build; PREBUILT=0 builds anyway.
#
# Files written to OUTDIR: device_check.log (everything, as it runs) and results.tgz, which holds the rest:
# build.log, diag_throw_cpu.log and diag_throw_cuda.log (a C++ error out of the library, checked after
# every build), tests.xml and tests_sm80.xml (JUnit); stage gemm: gemm_half/ and gemm_fp32/
# (gemm.{json,md,png}); sanitizer_*.log;
# sweep/<group>/ (gemm_candidates.*, gemm_decode.* or ops_linear_candidates.*: the tactic sweep's groups,
# benchmarks/sweep_plan.py); gemm_overhead.{json,md} (overhead); ops.{json,md} and ops_candidates/ (ops_linear_candidates.*,
# ops_rms_kernels.*); model.*, allocator.* (their stages). results.tgz is rewritten after every stage, so a
# call cut off at its time limit still returns the stages that ended (the device tool returns at most
# 8 files per call: one archive fits any number of reports).
#
# STAGES picks what runs (default: all): build sm80 gemm sweep tests sanitizer diag ops fp8 grouped model overhead
# allocator
# (the build always runs), in the order of this script, most decisive first. All of them exceed one
# 9-minute device call, and a 15-minute device lease includes the machine's start: run two
# calls on one warm machine (benchmarks/GPU_PLAN.md gives the commands and which stages each lease runs),
# the second at once (a machine goes back 30 s after a call); a later call's build is a ninja no-op.
# Each stage has its own time limit; a failing stage does not stop the others.
# The sweep stage times every candidate tactic of the shapes that decide each regime of the tactic
# heuristic (cutlass_gemm/core/tactic.cpp), one process per group under its own limit.
# SWEEP=short runs the sweep's subset that decides each regime (benchmarks/sweep_plan.py --short).
# BUILD=0 uses the library already built in place. GEMM_ARGS passes options to benchmarks.gemm (e.g.
# "--quick"); TEST_JOBS the pytest-xdist workers
# (default 8; 0 runs the tests in one process); TEST_FILES the test files of the tests stage (default:
# all, the decisive ones first), e.g. those an earlier run's tests.xml does not list. CPU tests run in CI, not here.
# DEADLINE_S (default 560): seconds from this script's start by which everything has ended, packed
# included. Every stage's time limit is cut to what is left of it (less 25 s for the kill grace and the
# packing); a stage with under 10 s left is SKIPPED. Set it a little under the device call's limit: the
# tool kills the call at its limit, and what a killed stage measured is lost (benchmarks/GPU_PLAN.md
# gives each call's value). A table of every stage's exit status and seconds ends the
# log (stages.tsv in results.tgz): 124 is a stage cut by its time limit.
# Time limits send SIGINT first (`limit`): pytest then prints its summary of what ran, and the
# benchmarks write the cases measured so far (marked INTERRUPTED); a process still alive 20 s later is
# killed. A benchmark that hits an error (a kernel failing on one shape) reports the cases before it
# (marked ABORTED, with the error) and exits non-zero; one that dies outright (a segfault) leaves them in
# <report>.partial.jsonl, one JSON line per case. The candidate sweeps check each tactic's output
# against a float64 reference before timing it: a wrong one is listed under "wrong results", not timed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-benchmarks/results/local}"
mkdir -p "$OUT"
# tee ignores SIGINT/SIGTERM: a signal to the whole process group must not cut the log short.
exec > >(trap '' INT TERM; exec tee "$OUT/device_check.log") 2>&1
tee_pid=$!
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
status=0
t0=$(date +%s)  # the call's start
DEADLINE_S="${DEADLINE_S:-560}"
# Each stage's header also prints the GPU's clock, temperature and power at that moment (a throttled
# stage shows there).
stage() {
  echo; echo "=== $* ($(date -u +%H:%M:%S), $(( $(date +%s) - t0 )) s of ${DEADLINE_S})"
  if command -v nvidia-smi > /dev/null 2>&1; then
    nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader 2>/dev/null | sed 's/^/GPU now: /'
  fi
  true
}
# budget SECONDS: SECONDS, or less where the deadline leaves less (25 s kept for the kill grace and packing).
budget() { local left=$(( DEADLINE_S - ($(date +%s) - t0) - 25 )); echo $(( $1 < left ? $1 : left )); }
# seconds_for SECONDS: budget SECONDS; or, when under 10 s are left, a SKIPPED line and exit status 1.
seconds_for() {
  local seconds; seconds=$(budget "$1")
  if (( seconds < 10 )); then echo "SKIPPED (deadline: ${DEADLINE_S} s from the start)" >&2; return 1; fi
  echo "$seconds"
}
# limit SECONDS CMD...: CMD under a time limit of budget SECONDS (SIGINT, then SIGKILL 20 s later); exit
# status 200 without running CMD when under 10 s are left.
# CMD runs in the background while the script waits for it, so that a SIGTERM to the script is handled
# at once (a trap waits for a foreground command), by on_term.
current=""  # the running stage's `timeout` process
limit() {
  local seconds rc; seconds=$(seconds_for "$1") || return 200; shift
  timeout -s INT -k 20 "$seconds" "$@" &
  current=$!
  wait "$current"; rc=$?
  current=""
  return $rc
}
stage_rows=()  # "name<TAB>exit status<TAB>seconds" of every step that ran (or was skipped)
# step NAME SECONDS CMD...: limit SECONDS CMD..., its exit status and time recorded in stage_rows.
current_step=""  # its name, for on_term
step() {
  local name="$1" start rc; shift; start=$(date +%s)
  current_step="$name"
  limit "$@"; rc=$?
  current_step=""
  stage_rows+=("$name"$'\t'"$rc"$'\t'"$(( $(date +%s) - start ))")
  (( rc == 0 )) || status=1
  return $rc
}

stage "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv || true
"$PY" -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, torch.version.git_version[:12], 'cuda', torch.version.cuda, 'gpu', torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))"
nvcc --version | tail -2
echo "cores: $(nproc --all)"

stage "CUTLASS headers"
# Needed to build (a prebuilt library needs none): without the wheel, only a prebuilt library can run.
have_cutlass=1
if ! "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('cutlass_library') is None)"; then
  if "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/ops-site .whl/nvidia_cutlass-*.whl; then
    export PYTHONPATH="/tmp/ops-site${PYTHONPATH:+:$PYTHONPATH}"
  else
    have_cutlass=0; echo "no nvidia-cutlass wheel in .whl/ (see the header of this script): only a prebuilt library can run"
  fi
fi

STAGES="${STAGES:-build sm80 gemm sweep tests sanitizer diag ops fp8 grouped model overhead allocator}"
MORE="$(mktemp -d)"  # every report; packed into $OUT/results.tgz after each stage
pack() {
  printf '%s\n' "stage	exit status	seconds" "${stage_rows[@]}" > "$MORE/stages.tsv"
  tar -czf "$OUT/results.tgz.part" -C "$MORE" . && mv "$OUT/results.tgz.part" "$OUT/results.tgz"
}
# On exit: pack, then let tee write the log's last lines. On SIGTERM (a caller giving up): the running
# stage gets SIGINT (through its `timeout`), as at its time limit, so it reports what it measured; then
# the same.
finish() { pack; exec 1>&- 2>&-; wait "$tee_pid" 2>/dev/null; }
on_term() {
  echo; echo "=== SIGTERM: the running stage is interrupted (SIGINT), then the reports are packed"
  if [ -n "$current" ]; then kill -INT "$current" 2>/dev/null; wait "$current"; fi
  stage_rows+=("${current_step:-(between stages)}, SIGTERM"$'\t'"143"$'\t'"-")
  exit 143
}
trap finish EXIT
trap on_term TERM

# The candidate-only kernels (swap-AB, SIMT GEMV) too: the candidate sweep and the sanitizer force them.
export OPS_CANDIDATE_KERNELS=1
stage "build (MAX_JOBS=$(nproc --all), TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-default 8.0;9.0a}, OPS_CANDIDATE_KERNELS=1)"
export MAX_JOBS="$(nproc --all)"
start=$(date +%s)
# A library prebuilt on a CPU machine for this torch and sm_90a (benchmarks/prebuilt.py; carry
# .prebuilt) saves the build's minutes, if it was built from these very sources; else, build.
# BUILD=0: use the library already built in place (a rerun on the same machine; the tests' dry runs).
if [ "${BUILD:-1}" = 0 ]; then
  "$PY" -c "import ops; print('BUILD=0: the library built in place,', ops.library_path())" || { echo "BUILD=0 but ops does not load"; exit 1; }
elif [ -d .prebuilt ] && [ "${PREBUILT:-1}" != 0 ] && "$PY" -m benchmarks.prebuilt use .prebuilt > "$MORE/build.log" 2>&1; then
  cat "$MORE/build.log"
else
  [ -s "$MORE/build.log" ] && cat "$MORE/build.log"
  if [ "$have_cutlass" = 0 ]; then echo "BUILD IMPOSSIBLE: no prebuilt library for these sources and no CUTLASS headers"; exit 2; fi
  seconds=$(seconds_for 360) || { echo "BUILD SKIPPED: the deadline (DEADLINE_S=${DEADLINE_S}) leaves no time"; exit 1; }
  if ! timeout "$seconds" "$PY" setup.py build_ext --inplace >> "$MORE/build.log" 2>&1; then
    tail -40 "$MORE/build.log"; echo "BUILD FAILED"; exit 1
  fi
  grep -i "warning" "$MORE/build.log" | grep -v "Wno\|deprecated" | sort | uniq -c | sort -rn | head -10 || true
fi
echo "build took $(( $(date +%s) - start )) s"
"$PY" -c "import ops; print('candidate-only kernels built:', ops.build_info.CANDIDATE_KERNELS)" || true
pack

# Every check of a bad input throws a C++ exception through the library's frames. On 2026-11-30 each
# CUDA test where ops' C++ code threw crashed its process (SIGSEGV, no Python traceback: a TORCH_CHECK
# of rms_norm, the allocator's out-of-memory error), while PyTorch's own exceptions reached Python:
# if these two die too, every error test below is void. The library's runtime facts go with them.
stage "C++ exceptions out of ops' library (CPU op, CUDA op)"
preload=""
if cc -shared -fPIC -O1 -o /tmp/segv_backtrace.so benchmarks/diag/segv_backtrace.c 2>&1; then preload=/tmp/segv_backtrace.so; fi
lib=$("$PY" -c "import ops; print(ops.library_path())" 2>/dev/null || echo ops/_C.abi3.so)
# diag NAME [ENV=VALUE ...] -- CODE: CODE in a fresh interpreter (at most 60 s) with faulthandler and
# segv_backtrace.so, its output in diag_NAME.log with the native frames named; returns its exit status
# (200: skipped at the deadline).
diag() {
  local name="$1"; shift
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  echo "--- $name"
  local seconds; seconds=$(seconds_for 60) || { stage_rows+=("diag-$name"$'\t'"200"$'\t'"0"); return 200; }
  env "${envs[@]}" LD_PRELOAD="$preload" timeout "$seconds" "$PY" -X faulthandler -c "$1" > "$MORE/diag_$name.log" 2>&1
  local rc=$?
  echo "exit status $rc" >> "$MORE/diag_$name.log"
  stage_rows+=("diag-$name"$'\t'"$rc"$'\t'"-")
  benchmarks/diag/symbolize_backtrace.sh "$lib" < "$MORE/diag_$name.log" | tail -60
  return $rc
}
echo "compiler: $("${CXX:-c++}" --version 2>/dev/null | head -1)"
ldd "$lib" 2>/dev/null | grep -E "libstdc\+\+|libgcc_s" || true
echo "unwinder or C++ runtime defined in the library itself (a private copy): $(nm -D --defined-only "$lib" 2>/dev/null | grep -cE ' (__cxa_throw|__cxa_begin_catch|_Unwind_RaiseException|__gxx_personality_v0)$') symbols"
throw='
import os, sys, torch, ops
device = os.environ["DEVICE"]
if device == "cuda" and not torch.cuda.is_available():
    sys.exit(print("no GPU: not run"))
try:
    ops.rms_norm(torch.randn(4, 8, device=device), torch.randn(7, device=device))
except (RuntimeError, ValueError) as e:
    print(device + ": raised", type(e).__name__ + ":", str(e).splitlines()[0][:120])
else:
    sys.exit(device + ": no error raised for a weight of the wrong size")'
for device in cpu cuda; do
  diag "throw_$device" DEVICE="$device" -- "$throw"
  rc=$?
  if (( rc != 0 && rc != 200 )); then
    status=1; echo "THROW FAILED ($device, exit status $rc): C++ errors from ops crash this build; the error tests below are void"
  fi
done
pack

want() { [[ " ${STAGES} " == *" $1 "* ]]; }

jobs=()  # pytest-xdist workers for the test stages
if [ "${TEST_JOBS:-8}" != 0 ] && "$PY" -c "import xdist" 2>/dev/null; then jobs=(-n "${TEST_JOBS:-8}"); fi

if want sm80; then
  # The CUTLASS 2.x kernels on Hopper, which the library withholds there unless OPS_CUTLASS_SM80_ON_SM90=1
  # (they gave wrong results through CUTLASS's 2.x GemmUniversalAdapter on 2026-11-30; now launched
  # through GemmUniversalBase). If this passes, they can be dispatched on Hopper by default.
  stage "tests: the SM80 kernels on Hopper (OPS_CUTLASS_SM80_ON_SM90=1: fp32 3xTF32, fp64)"
  OPS_CUTLASS_SM80_ON_SM90=1 step sm80-tests 100 "$PY" -m pytest tests/test_gemm_cuda.py tests/test_gemm.py \
    tests/test_linear.py tests/test_func_transforms.py -q -rfE --maxfail=20 "${jobs[@]}" -m cuda \
    -k "dtype2 or dtype3 or float32 or float64 or fp32 or gradcheck or func_transform" \
    --junitxml="$MORE/tests_sm80.xml"
  pack
fi

if want gemm; then
  # One process per dtype group: a crash in one (a segfault in the fp32 case cost the 2026-11-30 run
  # every bf16/fp16 timing) keeps the others' reports.
  # The heuristic's table first, then every candidate tactic in a second process: a candidate never run
  # on a GPU before (the SIMT GEMV, the 128x256 fused linear) that breaks the CUDA context costs the
  # sweep's remaining shapes, not the main table (~11 s for both dtypes with the sweep on the H200).
  stage "benchmark: ops.cutlass_gemm vs torch.mm, bf16/fp16"
  step gemm-half 60 "$PY" -m benchmarks.gemm --dtypes bf16,fp16 --out "$MORE/gemm_half" ${GEMM_ARGS:-}
  pack
  stage "benchmark: ops.cutlass_gemm vs torch.mm, tf32/fp32/fp64 (the SM80 3xTF32 and fp64 kernels on)"
  OPS_CUTLASS_SM80_ON_SM90=1 step gemm-fp32 60 "$PY" -m benchmarks.gemm --dtypes tf32,fp32,fp64 --suite square --out "$MORE/gemm_fp32" ${GEMM_ARGS:-}
  pack
fi

if want sweep; then
  # The tactic sweep, one process per regime (benchmarks/sweep_plan.py: the groups, their tactic counts,
  # estimates and limits), most decisive first; every tactic under the watchdog (a hang is a row).
  mapfile -t sweep_groups < <("$PY" -m benchmarks.sweep_plan --commands ${SWEEP:+--$SWEEP})
  (( ${#sweep_groups[@]} )) || { echo "benchmarks.sweep_plan listed no groups"; status=1; }
  for group in "${sweep_groups[@]}"; do
    IFS=$'\t' read -r name limit_s module args <<< "$group"
    stage "sweep: $name (limit ${limit_s} s)"
    # shellcheck disable=SC2086
    step "sweep-$name" "$limit_s" "$PY" -m "$module" $args --out "$MORE/sweep/$name"
    pack
  done
fi

if want tests; then
  stage "tests: CUDA, torch.export + AOTInductor with cutlass_gemm (CPU tests run in CI)"
  # The files that decide the open issues first, then the rest: a time limit cuts the tail (the first
  # run ended 259 tests into ~900).
  first="tests/test_gemm_cuda.py tests/test_linear.py tests/test_gemm.py tests/test_fused.py tests/test_allocator.py tests/test_streams.py"
  rest=$(ls tests/test_*.py | grep -v -x -F -f <(tr ' ' '\n' <<< "$first"))
  # shellcheck disable=SC2086
  step tests 300 "$PY" -m pytest ${TEST_FILES:-$first $rest} -q -rfE --maxfail=30 --durations=15 "${jobs[@]}" -m cuda \
    -k "not test_export or cutlass_gemm" --junitxml="$MORE/tests.xml"
  pack
fi

if want sanitizer; then
  # PYTORCH_NO_CUDA_MEMORY_CACHING=1: every tensor its own cudaMalloc, so a write past a tensor's end is
  # an error for memcheck (inside one of the caching allocator's segments it is invisible). The SM80
  # kernels run too (OPS_CUTLASS_SM80_ON_SM90=1).
  stage "compute-sanitizer (memcheck, racecheck)"
  # The smoke's own output (a line per section, its wrong values) goes to sanitizer_<tool>_app.log.
  for tool in memcheck racecheck; do
    start=$(date +%s)
    if ! seconds=$(seconds_for 75); then rc=200; else
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 OPS_CUTLASS_SM80_ON_SM90=1 timeout -k 10 "$seconds" compute-sanitizer --tool "$tool" \
        --error-exitcode 9 --print-limit 50 --log-file "$MORE/sanitizer_$tool.log" \
        "$PY" -m benchmarks.sanitizer_smoke > "$MORE/sanitizer_${tool}_app.log" 2>&1
      rc=$?
      tail -8 "$MORE/sanitizer_${tool}_app.log"; tail -5 "$MORE/sanitizer_$tool.log" 2>/dev/null
    fi
    stage_rows+=("sanitizer-$tool"$'\t'"$rc"$'\t'"$(( $(date +%s) - start ))")
    case $rc in
      0) ;;
      124) echo "compute-sanitizer $tool: TIMED OUT"; status=1 ;;
      200) status=1 ;;
      *) echo "compute-sanitizer $tool: FAILED (exit $rc; its report: sanitizer_$tool.log, the smoke's output: sanitizer_${tool}_app.log)"; status=1 ;;
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
  # bf16 only: each torch.compile reference is an Inductor compile (76 in the full three-dtype suite).
  step ops 60 "$PY" -m benchmarks.ops --dtypes bf16 --out "$MORE"
  pack
  # The rms_norm kernel variants in their own process (the fused linear's tactics: the sweep stage's
  # fused and fused-decode groups), without torch.compile references.
  stage "benchmark: every rms_norm kernel variant"
  step ops-candidates 120 "$PY" -m benchmarks.ops --candidates --no-compile --ops rms_norm,fused_add_rms_norm \
    --out "$MORE/ops_candidates"
  pack
fi

if want fp8; then
  stage "benchmark: FP8 scaled GEMM vs torch._scaled_mm and bf16 torch.mm; FP8 quantization"
  step fp8 60 "$PY" -m benchmarks.fp8 --quick --out "$MORE"
  pack
fi

if want grouped; then
  stage "benchmark: grouped GEMM vs torch._grouped_mm and a loop of mm on MoE experts; transformers' MoE block; FP8 rows vs torch._scaled_grouped_mm"
  step grouped 150 "$PY" -m benchmarks.grouped --quick --fp8 --out "$MORE"
  pack
fi

if want model; then
  stage "benchmark: MiniLM and Llama MLP block, stock vs ops"
  step model 90 "$PY" -m benchmarks.model --patterns all --out "$MORE"
  pack
fi

if want overhead; then
  stage "benchmark: call cost of tiny GEMMs (host overhead; fp32 on the SM80 3xTF32 kernel)"
  OPS_CUTLASS_SM80_ON_SM90=1 step overhead 90 "$PY" -m benchmarks.gemm --suite overhead --dtypes bf16,fp32 --out "$MORE"
  pack
fi

if want allocator; then
  stage "benchmark: allocators"
  step allocator 60 "$PY" -m benchmarks.allocator --iters 1000 --out "$MORE"
  pack
fi

stage "stages (exit status 124: cut by its time limit; 200: skipped, the deadline was near)"
printf '%s\n' "${stage_rows[@]}" | column -t -s $'\t' 2>/dev/null || printf '%s\n' "${stage_rows[@]}"
stage "done (status $status)"
exit $status
