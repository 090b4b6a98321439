"""The GPU check's GEMM sweep, planned to fit its device call: each group's cases (as device_check.sh
runs them), the tactics each times (the H200's candidates, from the host planner, on CPU) and an
estimate of its seconds.

    python -m benchmarks.sweep_plan [--budget SECONDS] [--json | --commands]

Each group decides one regime of the tactic heuristic (cutlass_gemm/core/tactic.cpp); the groups run in this
order, each under its own time limit in device_check.sh, so a short lease cuts the last ones.

The estimate is a model, not a measurement: a tactic costs the CudaTimer's calls (10 warm-up, 1 probe,
up to 50 timed, 5 at least within 2 s; each timed call after a 256 MiB L2 flush read) at an assumed
kernel time of twice its floor (benchmarks/GPU_PLAN.md: 790 TFLOP/s, 4.8 TB/s) plus 5 us, a host cost of
30 us per timed call when the kernel is shorter, 5 ms of checking per tactic and 1 s per case (operands,
the float64 reference, torch.profiler, plans). A GPU run's stages.tsv gives the real seconds.
"""

import argparse
import json
import math
import sys

import torch

import ops
from benchmarks import gemm

H200 = dict(cc_major=9, cc_minor=0, arch_list="8.0;9.0a", sm_count=132)
PEAK_FLOPS, PEAK_BYTES = 790e12, 4.8e12  # benchmarks/GPU_PLAN.md: bf16 torch.mm at 8192^3, HBM3e
FLUSH_S = 256 * 2 ** 20 / 4.3e12  # CudaTimer's L2 flush: a 256 MiB read at the measured copy bandwidth
HOST_S, CHECK_S, CASE_S = 30e-6, 5e-3, 1.0
TACTIC_LIMIT_S = 20  # a tactic whose timing (at most ~2 s of calls) has not returned by then is a hang

# (group, argv of the benchmark, what it decides). Fused linears: benchmarks.ops (its own group below).
GROUPS = [
    ("decode", ["--suite", "decode", "--dtypes", "bf16", "--candidates"],
     "M = 1-16 over the Llama-3-8B projections: SIMT GEMV, swap-AB 64x16/64x32, split-K and stream-K; "
     "GB/s against the copy ceiling, CUDA-graph replay, fused silu/gelu_tanh"),
    ("mid", ["--suite", "models", "--models", "llama3_8b", "--tokens", "32,64,128,256", "--dtypes", "bf16",
             "--candidates"],
     "T = 32-256: ping-pong 64x128 (2x1 cluster) against stream-K and split-K"),
    ("squares", ["--suite", "square", "--squares", "4096,8192", "--dtypes", "bf16,fp16", "--candidates",
                 "--rounds", "3"],
     "large tiles: every configuration x swizzle 1/2/4/8 x raster, three interleaved rounds"),
    ("large", ["--suite", "models", "--models", "llama3_8b", "--tokens", "1024,4096", "--dtypes", "bf16",
               "--candidates"],
     "prefill: 128x256 by wave efficiency, ping-pong 128x128, cooperative 256x128, 1x2 clusters"),
    ("minilm", ["--suite", "models", "--models", "minilm", "--tokens", "128,1024", "--dtypes", "bf16",
                "--candidates"],
     "small N and K (384, 1536): launch-bound tiles"),
]
# --short: the subset that still decides each regime (the ends of each token range, one dtype).
SHORT = {"decode": ["--tokens", "1,16"], "mid": ["--tokens", "64,256"], "squares": ["--squares", "8192", "--dtypes", "bf16"],
         "large": ["--tokens", "4096"], "minilm": ["--tokens", "1024"], "fused": ["--tokens", "4096", "--acts", "silu"],
         "fused-decode": ["--tokens", "1", "--acts", "silu"]}
FUSED = [
    ("fused", ["--candidates", "--ops", "linear", "--tokens", "1024,4096", "--acts", "silu,gelu_tanh", "--dtypes",
               "bf16", "--no-compile"],
     "fused linear (4096 -> 4096, bias): the ping-pong 128x128 _<act> kernels against the cooperative ones"),
    ("fused-decode", ["--candidates", "--ops", "linear", "--tokens", "1,16", "--acts", "silu,gelu_tanh", "--dtypes",
                      "bf16", "--no-compile"],
     "fused linear at decode: the SIMT GEMV with bias and activation against stream-K and split-K"),
]


def _tactic_seconds(flops, nbytes):
    t = 2 * max(flops / PEAK_FLOPS, nbytes / PEAK_BYTES) + 5e-6
    reps = max(5, min(50, int(2.0 / t)))
    return 11 * max(t, HOST_S) + reps * max(t + FLUSH_S, HOST_S) + CHECK_S


def _plan(M, N, K, dtype, epilogue="plain", b_layout="weight"):
    A = torch.empty(M, K, dtype=dtype)
    B = torch.empty(N, K, dtype=dtype).t() if b_layout == "weight" else torch.empty(K, N, dtype=dtype)
    return ops._library.gemm_plan_for_target(A, B, H200["cc_major"], H200["cc_minor"], H200["arch_list"],
                                             False, H200["sm_count"], epilogue, candidate_kernels=True)


def _case_row(M, N, K, dtype, rounds=1, epilogue="plain", b_layout="weight"):
    candidates = _plan(M, N, K, dtype, epilogue, b_layout)["candidates"]
    size = dtype.itemsize if hasattr(dtype, "itemsize") else torch.empty((), dtype=dtype).element_size()
    per = _tactic_seconds(2.0 * M * N * K, (M * K + N * K + M * N) * size)
    seconds = CASE_S + len(candidates) * per * (1 + (rounds - 1) * 0.9)  # a later round skips the check
    return candidates, seconds


def limit_seconds(estimate):
    """A group's time limit in device_check.sh: twice its estimate, at least 30 s."""
    return max(30, 2 * estimate)


def _shortened(name, argv):
    """argv with the options of SHORT[name] set to SHORT's values."""
    argv, extra = list(argv), SHORT[name]
    for option, value in zip(extra[::2], extra[1::2]):
        if option in argv:
            argv[argv.index(option) + 1] = value
        else:
            argv += [option, value]
    return argv


def plan(short=False):
    """[{group, decides, argv, cases, tactics, seconds, names}] in the order the check runs them (names:
    the tactics' names); short: SHORT."""
    rows = []
    for name, argv, decides in GROUPS:
        argv = _shortened(name, argv) if short else argv
        args = gemm.parse_args(argv)
        cases = gemm.planned_cases(args, "cuda")
        names, seconds = [], 0
        for dname, _, M, N, K, b_layout in cases:
            n, s = _case_row(M, N, K, gemm.DTYPES[dname], args.rounds, b_layout=b_layout)
            names, seconds = names + n, seconds + s
        if name == "decode":  # graph captures and the fused eager and replayed timings per shape
            seconds += len(cases) * 1.0
        rows.append({"group": name, "decides": decides, "argv": ["benchmarks.gemm", *argv], "cases": len(cases),
                     "tactics": len(names), "seconds": math.ceil(seconds), "names": names})
    for name, argv, decides in FUSED:
        argv = _shortened(name, argv) if short else argv
        tokens = [int(t) for t in argv[argv.index("--tokens") + 1].split(",")]
        acts = argv[argv.index("--acts") + 1].split(",")
        names, seconds = [], 0
        for t in tokens:
            for act in acts:
                n, s = _case_row(t, 4096, 4096, torch.bfloat16, epilogue=act)
                names, seconds = names + n, seconds + s
        rows.append({"group": name, "decides": decides, "argv": ["benchmarks.ops", *argv],
                     "cases": len(tokens) * len(acts), "tactics": len(names), "seconds": math.ceil(seconds),
                     "names": names})
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds the sweep's estimate may reach: exit 1 beyond")
    parser.add_argument("--short", action="store_true", help="the subset that decides each regime (SHORT)")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true")
    output.add_argument("--commands", action="store_true",
                        help="one line per group for device_check.sh: name, time limit (s), module and arguments, "
                             "tab-separated")
    args = parser.parse_args(argv)
    if args.budget is not None and not args.budget > 0:  # NaN too
        parser.error(f"--budget must be a positive number of seconds, got {args.budget}")
    rows = plan(args.short)
    total = sum(r["seconds"] for r in rows)
    if args.commands:
        for r in rows:
            options = [*r["argv"][1:], "--tactic-limit", str(TACTIC_LIMIT_S)]
            print("\t".join([r["group"], str(limit_seconds(r["seconds"])), r["argv"][0], " ".join(options)]))
    elif args.json:
        print(json.dumps({"groups": [{k: v for k, v in r.items() if k != "names"} for r in rows],
                          "seconds": total}, indent=1))
    else:
        print(f"{'group':12} {'cases':>5} {'tactics':>7} {'est. s':>6}  decides")
        for r in rows:
            print(f"{r['group']:12} {r['cases']:5} {r['tactics']:7} {r['seconds']:6}  {r['decides']}")
        print(f"{'total':12} {sum(r['cases'] for r in rows):5} {sum(r['tactics'] for r in rows):7} {total:6}")
    if args.budget is not None and total > args.budget:
        print(f"the sweep's estimate ({total} s) exceeds the budget ({args.budget:g} s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
