"""Each op the pass rewrites to, alone, against the formula it replaces compiled alone by Inductor (what the
pass would otherwise leave), over a grid of rows x last dimension: the most a rule of ops.compile.RULES
could cover. The rules themselves need models compiled with and without the rewrite
(benchmarks.compile_models), where Inductor fuses the formula with its neighbours.

    python -m benchmarks.compile_rules [--dtypes fp32,bf16] [--out DIR]

The rule printed for each op and dtype is the smallest last dimension and the largest element count whose
whole rectangle of measured shapes ran at least as fast as Inductor's code (speed-up >= 1). Times are medians of torch.utils.benchmark with the process's
threads (benchmarks.common.cpu_time), the median of three rounds that alternate the two sides.
"""

import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F

import ops
from benchmarks.common import RESULTS, cpu_time, machine_facts, markdown_table, write_report

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
ROWS = (1, 16, 128, 1024, 4096)
HIDDEN = (128, 512, 1024, 2048, 4096)  # the norms' row length
GATE_UP = (1024, 3584, 8192, 28672)  # silu_and_mul's 2 * d
ROUNDS = 3


def _hf_norm(x, w):
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)


def _add_norm(x, r, w):
    h = x + r
    return _hf_norm(h, w), h


def _silu_mul(x):
    a, b = x.chunk(2, dim=-1)
    return F.silu(a) * b


def cases(device, dtype):
    """(op, rows, last dimension, ops call, formula, its arguments)."""
    for rows in ROWS:
        for hidden in HIDDEN:
            x = torch.randn(rows, hidden, device=device, dtype=dtype)
            r = torch.randn_like(x)
            w = torch.rand(hidden, device=device, dtype=dtype) + 0.5
            yield "rms_norm", rows, hidden, lambda x=x, w=w: ops.rms_norm(x, w, 1e-6), _hf_norm, (x, w)
            # In place on the same buffers, as in a decoder's residual stream (the values grow from call to
            # call, which does not change the CPU kernels' speed).
            x2, r2 = x.clone(), r.clone()
            yield ("fused_add_rms_norm", rows, hidden, lambda x=x2, r=r2, w=w: ops.fused_add_rms_norm(x, r, w, 1e-6),
                   _add_norm, (x, r, w))
        for width in GATE_UP:
            x = torch.randn(rows, width, device=device, dtype=dtype)
            yield "silu_and_mul", rows, width, lambda x=x: ops.silu_and_mul(x), _silu_mul, (x,)


def rule(points):
    """(smallest last dimension, largest element count) of the rule that covers the most measured shapes
    (last, numel, speed-up) while every shape it covers has a speed-up >= 1; None if none does."""
    best, best_covered = None, 0
    for smallest in sorted({last for last, _, _ in points}):
        bound = None
        for numel, speedup in sorted((numel, s) for last, numel, s in points if last >= smallest):
            if speedup < 1.0:
                break
            bound = numel
        covered = sum(1 for last, numel, _ in points if bound is not None and last >= smallest and numel <= bound)
        if covered > best_covered:
            best, best_covered = (smallest, bound), covered
    return best


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--out", default=os.path.join(RESULTS, "local"))
    args = parser.parse_args(argv)
    device = "cpu"
    rows, results = [], []
    for dname in args.dtypes.split(","):
        dtype = DTYPES[dname]
        for op, n, last, ops_fn, formula, fargs in cases(device, dtype):
            torch._dynamo.reset()
            compiled = torch.compile(formula, dynamic=False)
            compiled(*fargs)
            # Rounds alternate the two sides: glibc's malloc adapts its mmap threshold to the sizes freed, so
            # a side timed alone right after a size change pays page faults the other does not.
            t_ops, t_ind = [], []
            for _ in range(ROUNDS):
                t_ops.append(cpu_time(ops_fn, min_run_time=0.1))
                t_ind.append(cpu_time(lambda: compiled(*fargs), min_run_time=0.1))
            t_ops, t_ind = statistics.median(t_ops), statistics.median(t_ind)
            speedup = t_ind / t_ops
            results.append({"op": op, "dtype": dname, "rows": n, "last": last, "numel": n * last,
                            "ops_us": t_ops * 1e6, "inductor_us": t_ind * 1e6, "speedup": speedup})
            rows.append([op, dname, n, last, f"{t_ops * 1e6:.1f}", f"{t_ind * 1e6:.1f}", f"{speedup:.2f}"])
            print(rows[-1], flush=True)
    suggested = {}
    for op in ("rms_norm", "fused_add_rms_norm", "silu_and_mul"):
        per_dtype = [rule([(r["last"], r["numel"], r["speedup"]) for r in results if r["op"] == op and r["dtype"] == d])
                     for d in args.dtypes.split(",")]
        if all(per_dtype):
            suggested[op] = {"min_last": max(p[0] for p in per_dtype), "max_numel": min(p[1] for p in per_dtype)}
    table = markdown_table(["op", "dtype", "rows", "last dim", "ops us", "torch.compile us", "speed-up"], rows)
    table += "\n\nRules (every measured shape they cover at speed-up >= 1, all dtypes): " + repr(suggested) + "\n"
    print(table)
    payload = {"benchmark": "compile_rules", "device": device, "machine": machine_facts(device), "results": results,
               "suggested_rules": suggested}
    write_report(args.out, "compile_rules", payload, f"ops vs Inductor's code for the pass's formulas on CPU", table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
