"""Timing and reporting helpers shared by the benchmarks (README.md, "Benchmarks")."""

import argparse
import contextlib
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import traceback

import torch
import torch.utils.benchmark as benchmark
from tqdm import tqdm

import ops
from ops.linear import ACTIVATION_FUNCTIONS

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def warn_without_candidate_kernels(kernels):
    """For a --candidates sweep: say so when this build lacks the candidate-only `kernels`."""
    if not ops.build_info.CANDIDATE_KERNELS:
        print(f"--candidates: this build has no candidate-only kernels ({kernels}); their tactics are not "
              "timed (rebuild with OPS_CANDIDATE_KERNELS=1).", flush=True)


def machine_facts(device):
    """GPU / CPU, driver, torch, CUDA: recorded with every result."""
    facts = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        facts["gpu"] = props.name
        facts["compute_capability"] = f"{props.major}.{props.minor}"
        facts["sm_count"] = props.multi_processor_count
        try:
            facts["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            facts["driver"] = "unknown"
    return facts


class CudaTimer:
    """Median time of `fn` on the GPU: CUDA events around each call after warm-up, with the L2 cache
    flushed before every timed call, so small problems are not measured out of a warm cache (METHOD.md /
    HOPPER.md). The flush reads a buffer larger than L2 (flush="read", the default): L2 is then full of
    clean lines. A flush that writes the buffer (flush="write", zero_(), as triton's do_bench does) leaves
    it full of dirty lines, which the timed kernel pays to write back as it evicts them: up to the L2's
    size (50-60 MB) of extra HBM traffic inside the timed region, which biases memory-bound timings (an
    F.linear at T = 1 timed at 1.5 TB/s for a 32 MB weight on the H200). benchmarks.ops records a copy
    timed both ways."""

    def __init__(self, l2_flush_bytes=256 * 1024 * 1024, flush="read"):
        if flush not in ("read", "write"):
            raise ValueError(f"CudaTimer: flush must be 'read' or 'write', got {flush!r}")
        self.flush = torch.zeros(l2_flush_bytes // 4, dtype=torch.float32, device="cuda")
        self.sink = torch.zeros((), dtype=torch.float32, device="cuda")
        self.flush_mode = flush

    def flush_l2(self):
        if self.flush_mode == "read":
            torch.sum(self.flush, dim=None, out=self.sink)
        else:
            self.flush.zero_()

    def __call__(self, fn, warmup=10, reps=50, max_seconds=2.0):
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        # Estimate one call to cap the total time of huge problems.
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        torch.cuda.synchronize()
        est = e0.elapsed_time(e1) / 1e3
        reps = max(5, min(reps, int(max_seconds / max(est, 1e-6))))
        for i in range(reps):
            self.flush_l2()
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts[:reps], ends[:reps])) / 1e3


def graph_time(calls, replays=20):
    """Seconds per call of `calls` (functions, each on buffers of its own) captured in order into one
    CUDA graph, over `replays` replays (median, CUDA events): the launch cost a model captured in a graph
    pays, with each call reading its operands cold when their total exceeds L2, as the layers of a
    decode step do."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture (library handles, workspaces)
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    del graph
    return statistics.median(s.elapsed_time(e) for s, e in events) / 1e3 / len(calls)


def copies_beyond_l2(nbytes, most=32):
    """How many buffers of `nbytes` to cycle through so that together they are at least twice the GPU's
    L2 (each then comes from HBM when its turn comes): 2 to `most`."""
    l2 = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 64 << 20)
    return max(2, min(most, math.ceil(2 * l2 / max(nbytes, 1))))


def int_list(text):
    """argparse type: comma-separated positive integers."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"a value appears twice in {text!r}")
    return values


def add_patterns_argument(parser):
    """--patterns: which of the compile pass's patterns a benchmark applies."""
    parser.add_argument("--patterns", default="rules",
                        help="rules (the pass's default rules), all (every pattern), or comma-separated names of "
                             f"{list(ops.compile.PATTERNS)} (those patterns, everywhere they match)")


def chosen_patterns(parser, text):
    """--patterns as ops.compile.backend takes it: None (the rules), or the pattern names."""
    if text == "rules":
        return None
    if text == "all":
        return tuple(ops.compile.PATTERNS)
    names = text.split(",")
    unknown = [n for n in names if n not in ops.compile.PATTERNS]
    if unknown:
        parser.error(f"--patterns: expected rules, all or names of {list(ops.compile.PATTERNS)}, got {unknown}")
    return tuple(names)


# The fused linear's activations, as PyTorch writes them (the references of ops.linear's epilogues).
ACT = {name: fn for name, fn in ACTIVATION_FUNCTIONS.items() if name != "none"}


def copy_bandwidth(copy_bytes, timed, device):
    """GB/s of a device copy of `copy_bytes` (each byte read and written once) timed by `timed`: the
    bandwidth ceiling a memory-bound op is measured against."""
    src = torch.empty(copy_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * copy_bytes / timed(lambda: dst.copy_(src)) / 1e9


def cpu_measurement(fn, min_run_time=0.2):
    """torch.utils.benchmark's Measurement of fn on CPU (warm-up and block sizing included), with the
    process's intra-op threads (torch.get_num_threads(); the Timer's default of one thread would hide a
    CPU kernel that runs on one thread only)."""
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=min_run_time)


def cpu_time(fn, min_run_time=0.2):
    """Median seconds per call on CPU (cpu_measurement)."""
    return cpu_measurement(fn, min_run_time).median


NOISE = 0.1  # torch.utils.benchmark's own threshold: a Measurement whose IQR exceeds 10% of its median warns
# A measurement during which this process's threads waited for a CPU, on average, more than this many threads'
# worth of time is BUSY: another process held the cores it runs on.
BUSY = 0.1


def _run_queue_wait_ns():
    """{thread id: nanoseconds it has waited runnable for a CPU} of this process's threads (the second field of
    Linux's /proc/self/task/<tid>/schedstat); None where the kernel does not report it."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    waits = {}
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                waits[tid] = int(f.read().split()[1])
        except (OSError, IndexError, ValueError):  # a thread that ended meanwhile
            continue
    return waits or None


def cpu_wait(fn):
    """(fn()'s value, the mean number of this process's threads that waited for a CPU while fn ran: the run-queue
    wait of all its threads over the wall time; None where the kernel does not report it). Above BUSY, another
    process held the cores: a parallel CPU kernel then waits at each barrier for its thread's next time slice,
    steadily, so the measurement's IQR stays small. On 2 cores with another process using 1.3 of them, a
    16 x 1536 x 384 fp32 torch.mm on 2 threads took 11 ms per call with an IQR of 2-5% (0.14 ms alone), and
    these threads waited 1.2 threads' worth of the time."""
    before, start = _run_queue_wait_ns(), time.perf_counter()
    value = fn()
    after, wall = _run_queue_wait_ns(), time.perf_counter() - start
    if before is None or after is None:
        return value, None
    waited = sum(ns - before.get(tid, 0) for tid, ns in after.items())  # a new thread waited only since start
    return value, max(0.0, waited / 1e9 / wall)


def cpu_compare(fns, rounds=3, min_run_time=0.1, retries=1):
    """Seconds per call of each of `fns` on CPU, interleaved in `rounds` rounds so that a drift of the
    machine (another process, clocks) is shared rather than landing on whichever was timed first.

    Returns (times, spread, wait). times: each function's fastest round (its median). wait: the largest
    cpu_wait of the measurements those times come from (None where unknown); while it exceeds BUSY, up to
    `retries` more rounds run, so a measurement taken while another process held the cores is replaced once
    they are free. spread: the largest relative spread of the measurements not BUSY (of all of them where a
    function has none): a measurement's IQR / median, or one function's medians across rounds
    ((max - min) / min). A spread above NOISE means the machine's noise is of the size of the differences
    the ratio would show."""
    runs = [[] for _ in fns]  # (median, IQR / median, wait) per round

    def one_round():
        for i, fn in enumerate(fns):
            m, wait = cpu_wait(lambda: cpu_measurement(fn, min_run_time))
            runs[i].append((m.median, m.iqr / m.median, wait))

    def busy(run):
        return run[2] is not None and run[2] > BUSY

    for _ in range(rounds):
        one_round()
    for _ in range(retries):
        if not any(busy(min(r)) for r in runs):
            break
        one_round()
    spread = 0.0
    for r in runs:
        quiet = [run for run in r if not busy(run)] or r
        medians = [run[0] for run in quiet]
        spread = max([spread, (max(medians) - min(medians)) / min(medians)] + [run[1] for run in quiet])
    waits = [min(r)[2] for r in runs]
    wait = None if None in waits else max(waits)
    return [min(r)[0] for r in runs], spread, wait


@contextlib.contextmanager
def replacing(path):
    """A text file that replaces `path` when the block ends without an error (a temporary file renamed onto
    it): a run killed while it writes a report leaves the previous file, never a truncated one."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    temp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(temp, "w") as f:
            yield f
        os.replace(temp, path)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)


def write_text(path, text):
    with replacing(path) as f:
        f.write(text)


def write_json(path, payload):
    write_text(path, json.dumps(payload, indent=1))


def write_report(out_dir, name, payload, title, table):
    """<out_dir>/<name>.json (payload) and <name>.md (title + table)."""
    write_json(os.path.join(out_dir, f"{name}.json"), payload)
    write_text(os.path.join(out_dir, f"{name}.md"), f"# {title}\n\n{table}\n")


def mark_stopped(payload, measured, planned, aborted=None):
    """For a run that stopped before its last case: records {"measured", "planned"} in the JSON payload
    under "interrupted" (Ctrl-C, or device_check.sh's `timeout -s INT`) or, given `aborted` (the error
    that stopped it, from measure_all), under "aborted" with that error; returns the note for the report's
    text. "" (and the payload unchanged) for a complete run."""
    if aborted is not None:
        payload["aborted"] = {"measured": measured, "planned": planned, "error": aborted}
        return f" (ABORTED after {measured} of {planned} cases: {aborted})"
    if measured >= planned:
        return ""
    payload["interrupted"] = {"measured": measured, "planned": planned}
    return f" (INTERRUPTED: {measured} of {planned} cases measured)"


def first_line(error):
    """An exception's message, first line (CUDA and c10 errors append pages of context)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def measure_all(cases, measure, desc, label=str):
    """Calls measure(case) for each case under a progress bar, until the end or until something stops
    the run. Returns (number of cases measured, aborted): aborted is None for a complete or an
    interrupted run (Ctrl-C, or device_check.sh's `timeout -s INT`: a KeyboardInterrupt), else the error
    that stopped it, naming its case (`label(case)`); the traceback goes to stderr. Either way the caller
    still reports the cases measured: a kernel that fails on one shape must not cost the timings of the
    shapes before it (a crash in the fp32 case lost every bf16/fp16 timing of the 2026-11-30 H200 run)."""
    done = 0
    bar = tqdm(cases, desc=desc, file=sys.stderr, dynamic_ncols=True)
    case = None
    try:
        for case in bar:
            bar.set_postfix_str(label(case))
            measure(case)
            done += 1
    except KeyboardInterrupt:
        bar.close()
        print(f"\ninterrupted: reporting the {done} of {len(cases)} cases measured so far", file=sys.stderr)
    except Exception as e:  # noqa: BLE001 - reported with its traceback; the caller exits non-zero
        bar.close()
        traceback.print_exc()
        aborted = f"{label(case)}: {type(e).__name__}: {first_line(e)}"
        print(f"\naborted at {aborted}\nreporting the {done} of {len(cases)} cases measured so far",
              file=sys.stderr)
        return done, aborted
    return done, None


class PartialLog:
    """<out_dir>/<stem>.partial.jsonl: each measured record as one JSON line ({"kind": kind, ...}), written
    and flushed as it is measured. A process that dies without reporting (a segfault in a kernel under
    test) leaves what it measured there; once the full report is written, finish() deletes the file."""

    def __init__(self, out_dir, stem, append=False):
        os.makedirs(out_dir, exist_ok=True)
        self.path = os.path.join(out_dir, f"{stem}.partial.jsonl")
        self._file = open(self.path, "a" if append else "w")  # append: a worker resuming (benchmarks.watchdog)

    def write(self, kind, record):
        self._file.write(json.dumps({"kind": kind, **record}) + "\n")
        self._file.flush()

    def finish(self):
        self._file.close()
        os.remove(self.path)


class DeviceUnusable(RuntimeError):
    """A CUDA error that leaves the context unusable (an illegal address, a launch failure): every later
    CUDA call of the process fails too, so the run stops there (measure_all reports it)."""


def cuda_context_usable():
    """False after a sticky CUDA error (torch.cuda.synchronize raises); True without CUDA."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return True
    try:
        torch.cuda.synchronize()
        return True
    except RuntimeError:
        return False


def max_rel_error(c, ref):
    """max |c - ref| / max |ref|, computed in float64 (ref: a float64 tensor)."""
    return ((c.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def output_check(reference, dtype, trusted_errors=()):
    """A `check` for sweep_tactics: what is wrong with an output, or None. The output must be finite and
    within max(4 x the largest of `trusted_errors`, 2 x the dtype's machine epsilon) of `reference`
    (float64) in max relative error (max_rel_error). trusted_errors: that error for results already
    checked in this dtype (torch's, the heuristic tactic's), so that a tactic which only rounds or sums
    in another order (split-K, stream-K) passes and one that computes something else (errors of order 1,
    NaN, an unwritten tile) does not."""
    limit = max([4 * e for e in trusted_errors] + [2 * torch.finfo(dtype).eps])

    def check(out):
        if not bool(torch.isfinite(out).all()):
            return "non-finite values in the output"
        err = max_rel_error(out, reference)
        return None if err <= limit else f"max relative error {err:.2e} > {limit:.2e}"
    return check


def sweep_order(names):
    """`names` with the tactics of CUTLASS's stream-K hang reports (stream-K scheduler, swap-AB: small M;
    NVIDIA/cutlass#1801, #1917, #2238) last, so that a hang comes after every other measurement."""
    def risky(name):  # a stream-K scheduler, or a column-major D (the third layout letter): swap-AB
        kernel = name.split("/")[0]
        return "_stream_k" in kernel or re.search(r"_[tn]{2}n_align", kernel) is not None

    return sorted(names, key=risky)


def sweep_tactics(fn, names, timer, check=None, progress=None, case="", skip=None, rounds=1):
    """Forces each tactic of `names` in turn (ops.gemm.set_tactic; the heuristic is restored afterwards),
    checks its output with `check` (fn's return value -> None, or what is wrong: see output_check) and
    times `fn` (cutlass_gemm, or a linear on top of one) with `timer`. progress (benchmarks.watchdog):
    each tactic's start and end are recorded for the watchdog; skip: {tactic: why}, tactics an earlier
    worker hung or crashed in, not run again. rounds > 1: the tactics that ran are timed again in that
    many interleaved rounds (each round times every tactic once) and keep their fastest round, so a drift
    of the GPU's clocks over the sweep is shared by all of them rather than landing on a few.

    Returns (times, problems): times {name: seconds per call, or None where there is no time}, problems
    {name: why not: "refused: ..." where CUTLASS refuses the tactic for the shape (not fatal), "WRONG
    RESULT: ..." where its output failed the check (then it is not timed: a fast wrong kernel must not
    come out "best"), "HANG: ..." or "CRASH: ..." from skip}. When a tactic leaves the CUDA context
    unusable, a supervised worker's progress ends the process (a crash row, benchmarks.watchdog); otherwise
    it raises DeviceUnusable."""
    times, problems = {}, {}
    skip = skip or {}
    try:
        for name in names:
            if name in skip:
                times[name], problems[name] = None, skip[name]
                continue
            ops.gemm.set_tactic(name)
            if progress is not None:
                progress.start(case, name)
            try:
                problem = check(fn()) if check else None
                times[name] = timer(fn) if problem is None else None
            except RuntimeError as e:
                if not cuda_context_usable():
                    if progress is not None:
                        progress.device_lost(case, name, first_line(e))
                    raise DeviceUnusable(f"tactic {name} left the CUDA context unusable: {first_line(e)}") from e
                times[name], problem = None, None
                problems[name] = f"refused: {first_line(e)}"
                print(f"  {name}: {problems[name]}", file=sys.stderr)
            if progress is not None:
                progress.end(case, name)
            if problem is not None:
                problems[name] = f"WRONG RESULT: {problem}"
                print(f"  {name}: {problems[name]}", file=sys.stderr)
        for _ in range(rounds - 1):
            for name in [n for n in names if times.get(n)]:
                ops.gemm.set_tactic(name)
                if progress is not None:
                    progress.start(case, name)
                try:
                    times[name] = min(times[name], timer(fn))
                except RuntimeError as e:  # ran before, fails now: no time, so never "best"
                    if not cuda_context_usable():
                        if progress is not None:
                            progress.device_lost(case, name, first_line(e))
                        raise DeviceUnusable(f"tactic {name} left the CUDA context unusable: {first_line(e)}") from e
                    times[name], problems[name] = None, f"failed in a later round: {first_line(e)}"
                    print(f"  {name}: {problems[name]}", file=sys.stderr)
                if progress is not None:
                    progress.end(case, name)
    finally:
        ops.gemm.set_tactic(None)
    return times, problems


def cuda_kernels(fn):
    """The names of the CUDA kernels `fn` launches (torch.profiler): which cuBLAS kernel torch.mm or
    F.linear ran for a shape, so that a loss names what it lost to."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
    return sorted(n for n in names if not n.lower().startswith(("memset", "memcpy")))


def fastest(times):
    """The tactic of sweep_tactics' `times` with the smallest time, or None when none has one."""
    valid = {name: t for name, t in times.items() if t}
    return min(valid, key=valid.get) if valid else None


def wrong_results(problems):
    """The tactics whose output failed the check, from sweep_tactics' problems (a column of the reports)."""
    return sorted(name for name, why in problems.items() if why.startswith("WRONG RESULT"))


def markdown_table(headers, rows):
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)
