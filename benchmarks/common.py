"""Timing and reporting helpers shared by the benchmarks (DESIGN.md, "Measuring performance")."""

import json
import os
import platform
import statistics
import subprocess
import sys

import torch
import torch.utils.benchmark as benchmark

import ops

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


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
    flushed before every timed call (a write of a buffer larger than L2), so small problems are not
    measured out of a warm cache (METHOD.md / HOPPER.md)."""

    def __init__(self, l2_flush_bytes=256 * 1024 * 1024):
        self.flush = torch.empty(l2_flush_bytes, dtype=torch.uint8, device="cuda")

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
            self.flush.zero_()
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts[:reps], ends[:reps])) / 1e3


def cpu_time(fn, min_run_time=0.2):
    """Median seconds per call on CPU, by torch.utils.benchmark (warm-up and block sizing included)."""
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn})
    return timer.blocked_autorange(min_run_time=min_run_time).median


def write_json(path, payload):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)


def write_report(out_dir, name, payload, title, table):
    """<out_dir>/<name>.json (payload) and <name>.md (title + table)."""
    write_json(os.path.join(out_dir, f"{name}.json"), payload)
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write(f"# {title}\n\n{table}\n")


def mark_interrupted(payload, measured, planned):
    """For a run stopped before its last case (Ctrl-C, or device_check.sh's `timeout -s INT`): records
    {"measured", "planned"} in the JSON payload and returns the note for the report's text; "" (and the
    payload unchanged) for a complete run."""
    if measured >= planned:
        return ""
    payload["interrupted"] = {"measured": measured, "planned": planned}
    return f" (INTERRUPTED: {measured} of {planned} cases measured)"


def sweep_tactics(fn, names, timer):
    """{tactic name: seconds per call of `fn`, or None where CUTLASS refuses that tactic for the shape}
    for each name in `names`, forced one at a time with ops.gemm.set_tactic (restored to the heuristic
    afterwards). `fn` runs the GEMM (cutlass_gemm, or a linear on top of one)."""
    times = {}
    try:
        for name in names:
            ops.gemm.set_tactic(name)
            try:
                times[name] = timer(fn)
            except RuntimeError as e:  # a tactic CUTLASS refuses for this shape: recorded, not fatal
                times[name] = None
                print(f"  {name}: {str(e).splitlines()[0]}", file=sys.stderr)
    finally:
        ops.gemm.set_tactic(None)
    return times


def markdown_table(headers, rows):
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)
