"""The main job: ops.cutlass_gemm against torch.mm, measured in the same run.

    python -m benchmarks.gemm [--dtypes bf16,fp16,fp32,tf32,fp64] [--suite all|models|square|overhead]
                              [--quick | --full] [--candidates] [--autotune] [--out DIR]

For each dtype and shape: median time of warmed-up runs (CUDA events, L2 flushed; on CPU
torch.utils.benchmark), TFLOP/s (2*M*N*K / time), the speed ratio ops / torch.mm, and each side's max
relative error against a float64 reference (max |C - C_ref| / max |C_ref|).

Shapes: the GEMMs of all-MiniLM-L6-v2 (hidden 384, intermediate 1536) and of Llama-3-8B projections
(4096x4096, 4096x1024, 4096x14336, 14336x4096) at 1, 16, 128, 1024 and 4096 tokens, as x @ W^T with W
an nn.Linear weight (N, K), so B is a column-major view as in a real model; plus a square sweep
256..8192. Results go to a table on the terminal and to JSON, markdown and a PNG plot in --out.

--suite overhead measures the cost of a call where the arithmetic is negligible (16^3..128^3): the
median wall time per call of back-to-back calls (torch.utils.benchmark; CUDA synchronized once per
block, so on a GPU this is the host's issue cost), over several interleaved rounds, min of the medians.
It also times ``torch.ops.aten.mm.default``: torch.mm's own kernel called the way every torch.library op
is called from Python (through the OpOverload binding, not torch.mm's generated one), which tells the
binding's share of the overhead from this library's.

--candidates (GPU) also times every candidate tactic of each shape (ops.gemm.plan(A, B)["candidates"],
forced with ops.gemm.set_tactic) and writes gemm_candidates.{json,md}: which tactic is fastest for which
shape, against the heuristic's choice: the data to fit the heuristic (cutlass_gemm/tactic.cpp) to.
--autotune runs with ops.gemm.set_autotune(True) (each shape tuned on its first, warm-up, call).

Without a GPU it runs the same suite (quick by default) on the CPU kernels, which use ATen's BLAS: the
CUTLASS kernels need an NVIDIA GPU (sm80 or newer).
"""

import argparse
import math
import os
import sys
import time

import torch

import ops
from benchmarks.common import (RESULTS, CudaTimer, PartialLog, cpu_time, fastest, machine_facts, mark_stopped,
                               markdown_table, max_rel_error, measure_all, output_check, sweep_tactics, write_json,
                               warn_without_candidate_kernels, wrong_results)

TOKENS = [1, 16, 128, 1024, 4096]
OVERHEAD_SIZES = [16, 64, 128]
MINILM = {"minilm.qkv": (384, 3 * 384), "minilm.attn_out": (384, 384), "minilm.ffn_up": (384, 1536),
          "minilm.ffn_down": (1536, 384)}  # name: (K = in_features, N = out_features)
LLAMA = {"llama3_8b.q_proj": (4096, 4096), "llama3_8b.kv_proj": (4096, 1024),
         "llama3_8b.gate_up": (4096, 14336), "llama3_8b.down": (14336, 4096)}
SQUARE = [256, 512, 1024, 2048, 4096, 8192]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "tf32": torch.float32,
          "fp64": torch.float64}


def shapes(suite, quick, device):
    """(name, M, N, K, B_layout) rows. Quick mode: fewer token counts and sizes (and, on CPU, the
    small end only, since a CPU BLAS needs seconds per large GEMM)."""
    tokens = [1, 128, 1024] if quick else TOKENS
    square = [256, 1024, 4096] if quick else SQUARE
    if device == "cpu" and quick:
        tokens, square = [1, 16, 128], [256, 512, 1024]
    rows = []
    if suite == "overhead":
        return [(f"overhead {s}", s, s, s, "row") for s in OVERHEAD_SIZES]
    if suite in ("all", "models"):
        for table in (MINILM, LLAMA):
            for name, (k, n) in table.items():
                for t in tokens:
                    if device == "cpu" and quick and name.startswith("llama") and t > 16:
                        continue
                    rows.append((f"{name} T={t}", t, n, k, "weight"))
    if suite in ("all", "square"):
        rows += [(f"square {s}", s, s, s, "row") for s in square]
    return rows


def call_times(fns, rounds=5):
    """Seconds per call of back-to-back calls of each of `fns` (host-bound for tiny problems): min over
    `rounds` rounds of cpu_time's median (torch.utils.benchmark synchronizes CUDA around each timed block),
    the functions interleaved within each round, so that a drift of the machine (clocks, another
    process) is shared by all of them rather than landing on whichever was timed first."""
    best = [math.inf] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            best[i] = min(best[i], cpu_time(fn))
    return best


def run(args, log=None):
    """Measures every case of the chosen suite. Returns (device, quick, results, candidates, tuning cache
    or None, number of cases planned, aborted: None, or the error that stopped the run). Each result (and
    candidate sweep) also goes to `log` (a PartialLog) as it is measured."""
    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    quick = args.quick or (device == "cpu" and not args.full)
    if device == "cpu":
        print("No NVIDIA GPU here: the CUTLASS kernels need an NVIDIA GPU (sm80 or newer). On CPU "
              "ops.cutlass_gemm runs ATen's BLAS, so this run compares two CPU BLAS calls "
              f"({'quick' if quick else 'full'} suite).", flush=True)
    timer = CudaTimer() if device == "cuda" else None
    if args.candidates and device == "cuda":
        warn_without_candidate_kernels("swap-AB, SIMT GEMV; each case's not_built lists their tactics")
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if not dtypes:
        sys.exit(f"--dtypes is empty; choose from {', '.join(DTYPES)}")
    for d in dtypes:
        if d not in DTYPES:
            sys.exit(f"unknown dtype {d!r}; choose from {', '.join(DTYPES)}")
    cases = [(d, *s) for d in dtypes for s in shapes(args.suite, quick, device)]
    results, candidates, tuning = [], [], None
    overhead = args.suite == "overhead"
    if args.autotune:
        ops.gemm.set_autotune(True)
    saved_precision = torch.get_float32_matmul_precision()
    gen = torch.Generator(device=device).manual_seed(0)

    def measure(case):
        n_results, n_candidates = len(results), len(candidates)
        measure_case(args, device, timer, gen, overhead, case, results, candidates)
        if log is not None:
            for r in results[n_results:]:
                log.write("result", r)
            for c in candidates[n_candidates:]:
                log.write("candidates", c)

    try:
        _, aborted = measure_all(cases, measure, "gemm", label=lambda case: f"{case[0]} {case[1]}")
    finally:
        torch.set_float32_matmul_precision(saved_precision)
        if args.autotune:
            tuning = ops.gemm.tuning_cache()
            ops.gemm.set_autotune(False)
    return device, quick, results, candidates, tuning, len(cases), aborted


def measure_case(args, device, timer, gen, overhead, case, results, candidates):
    """Measures one (dtype, shape) case: appends its row to results (and, with --candidates, every
    tactic's time to candidates, each tactic's output first checked against the float64 reference)."""
    dname, name, M, N, K, b_layout = case
    dtype = DTYPES[dname]
    torch.set_float32_matmul_precision("high" if dname == "tf32" else "highest")
    A = torch.randn(M, K, device=device, dtype=dtype, generator=gen)
    if b_layout == "weight":
        B = torch.randn(N, K, device=device, dtype=dtype, generator=gen).t()  # x @ W^T
    else:
        B = torch.randn(K, N, device=device, dtype=dtype, generator=gen)
    ref = torch.mm(A.double(), B.double())
    ours = ops.cutlass_gemm(A, B)
    theirs = torch.mm(A, B)
    err_ours, err_torch = max_rel_error(ours, ref), max_rel_error(theirs, ref)
    del ours, theirs
    extra = {}
    if overhead:
        t_ours, t_torch, t_aten = call_times([lambda: ops.cutlass_gemm(A, B), lambda: torch.mm(A, B),
                                              lambda: torch.ops.aten.mm.default(A, B)])
        extra["aten_op_ms"] = t_aten * 1e3
    elif device == "cuda":
        t_ours = timer(lambda: ops.cutlass_gemm(A, B))
        t_torch = timer(lambda: torch.mm(A, B))
    else:
        t_ours = cpu_time(lambda: ops.cutlass_gemm(A, B))
        t_torch = cpu_time(lambda: torch.mm(A, B))
    # The heuristic's tactic (with --autotune the JSON also holds the tuning cache: what ran instead).
    plan = ops.gemm.plan(A, B) if device == "cuda" else None
    tactic = plan["tactic"]["name"] if plan else "cpu (ATen)"
    if args.candidates and plan and not overhead and dname in ("bf16", "fp16"):
        # torch's error is the scale of the check: the heuristic's own output is one of the candidates.
        times, problems = sweep_tactics(lambda: ops.cutlass_gemm(A, B), plan["candidates"], timer,
                                        check=output_check(ref, dtype, [err_torch]))
        candidates.append({
            "dtype": dname, "shape": name, "M": M, "N": N, "K": K, "torch_ms": t_torch * 1e3,
            "heuristic": tactic, "best": fastest(times),
            "times_ms": {k: (v * 1e3 if v else None) for k, v in times.items()}, "problems": problems,
            "not_built": plan.get("candidates_not_built", []),
        })
    del ref
    flops = 2.0 * M * N * K
    results.append({
        "dtype": dname, "shape": name, "M": M, "N": N, "K": K, "tactic": tactic,
        "ops_ms": t_ours * 1e3, "torch_ms": t_torch * 1e3,
        "ops_tflops": flops / t_ours / 1e12, "torch_tflops": flops / t_torch / 1e12,
        "ratio": t_torch / t_ours,
        "ops_max_rel_err": err_ours, "torch_max_rel_err": err_torch, **extra,
    })


def geomean(values):
    values = [v for v in values if v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def report(device, quick, results, out_dir, candidates=(), tuning=None, suite="all", planned=None, aborted=None):
    """Prints the table and writes {stem}.json, {stem}.md (and gemm.png, gemm_candidates.*). planned: the
    number of cases the run set out to measure, when it stopped before measuring them all; aborted: the
    error that stopped it (measure_all)."""
    headers = ["dtype", "shape", "M", "N", "K", "ops ms", "torch.mm ms", "ops TFLOP/s",
               "torch.mm TFLOP/s", "ratio", "ops err", "torch.mm err", "tactic"]
    rows = [[r["dtype"], r["shape"], r["M"], r["N"], r["K"], f"{r['ops_ms']:.4f}", f"{r['torch_ms']:.4f}",
             f"{r['ops_tflops']:.2f}", f"{r['torch_tflops']:.2f}", f"{r['ratio']:.3f}",
             f"{r['ops_max_rel_err']:.2e}", f"{r['torch_max_rel_err']:.2e}", r["tactic"]] for r in results]
    facts = machine_facts(device)
    summary = {}
    for d in sorted({r["dtype"] for r in results}):
        ratios = [r["ratio"] for r in results if r["dtype"] == d]
        summary[d] = {"geomean_ratio": geomean(ratios), "min_ratio": min(ratios)}
    if suite == "overhead":  # the binding's share: torch.mm's kernel called as a torch.library op is
        headers.insert(7, "aten.mm.default ms")
        for row, r in zip(rows, results):
            row.insert(7, f"{r['aten_op_ms']:.4f}")
    table = markdown_table(headers, rows)
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    print()
    for row in [headers] + rows:
        print("  ".join(str(c).rjust(w) for c, w in zip(row, widths)))
    print()
    for d, s in summary.items():
        print(f"{d}: geometric-mean ratio (ops / torch.mm speed) {s['geomean_ratio']:.3f}, "
              f"lowest {s['min_ratio']:.3f}")
    os.makedirs(out_dir, exist_ok=True)
    stem = "gemm_overhead" if suite == "overhead" else "gemm"
    payload = {"benchmark": stem, "device": device, "quick": quick, "machine": facts,
               "build": {k: v for k, v in vars(ops.build_info).items() if k.isupper()},
               "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "summary": summary, "results": results}
    if tuning is not None:
        payload["tuning_cache"] = tuning
    interrupted = mark_stopped(payload, len(results), len(results) if planned is None else planned, aborted)
    write_json(os.path.join(out_dir, f"{stem}.json"), payload)
    if candidates:
        report_candidates(candidates, facts, out_dir)
    where = facts.get("gpu", f"CPU ({facts['cpu']}, {facts['cpu_threads']} threads)")
    with open(os.path.join(out_dir, f"{stem}.md"), "w") as f:
        f.write(f"# ops.cutlass_gemm vs torch.mm on {where}\n\n")
        if suite == "overhead":
            f.write("Call cost of tiny problems: time per call of back-to-back calls (min over rounds of "
                    "the median), i.e. host overhead where the arithmetic is negligible. "
                    "aten.mm.default: torch.mm's kernel called through `torch.ops.aten.mm.default`, the "
                    "Python binding every torch.library op (this library's included) is called through; "
                    "ops - aten.mm.default is this library's own cost.\n\n")
        f.write(f"torch {facts['torch']}, CUDA {facts['cuda']}, driver {facts.get('driver', '-')}; "
                f"{'quick' if quick else 'full'} suite{interrupted}; ratio = torch.mm time / ops time (>1: ops faster); "
                "err = max |C - C_fp64| / max |C_fp64|.\n\n")
        f.write(table + "\n\n")
        for d, s in summary.items():
            f.write(f"- {d}: geometric-mean ratio {s['geomean_ratio']:.3f}, lowest {s['min_ratio']:.3f}\n")
    if suite == "overhead":
        print(f"\nwrote {out_dir}/{stem}.json, {stem}.md")
        return
    plot(results, where, os.path.join(out_dir, "gemm.png"))
    print(f"\nwrote {out_dir}/gemm.json, gemm.md, gemm.png")


def report_candidates(candidates, facts, out_dir):
    """gemm_candidates.{json,md}: every tactic's time per shape, the fastest, and the heuristic's pick."""
    write_json(os.path.join(out_dir, "gemm_candidates.json"),
               {"benchmark": "gemm_candidates", "machine": facts, "results": candidates})
    headers = ["dtype", "shape", "torch.mm ms", "heuristic", "heuristic ms", "best", "best ms",
               "heuristic / best", "wrong results"]
    rows = []
    for c in candidates:
        h = c["times_ms"].get(c["heuristic"])
        b = c["times_ms"].get(c["best"]) if c["best"] else None
        rows.append([c["dtype"], c["shape"], f"{c['torch_ms']:.4f}", c["heuristic"],
                     f"{h:.4f}" if h else "-", c["best"] or "-", f"{b:.4f}" if b else "-",
                     f"{h / b:.3f}" if h and b else "-", ", ".join(wrong_results(c["problems"])) or "-"])
    with open(os.path.join(out_dir, "gemm_candidates.md"), "w") as f:
        f.write(f"# cutlass_gemm tactics per shape on {facts.get('gpu', 'CPU')}\n\n")
        f.write("heuristic / best > 1: the heuristic (cutlass_gemm/tactic.cpp) left that much on the table. "
                "wrong results: tactics whose output failed the check against the float64 reference (not timed: "
                "a kernel bug to fix before that tactic can be chosen). All times, and why a tactic has none: "
                "gemm_candidates.json.\n\n")
        f.write(markdown_table(headers, rows) + "\n")
    print(f"wrote {out_dir}/gemm_candidates.json, gemm_candidates.md")


def plot(results, where, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dtypes = sorted({r["dtype"] for r in results})
    fig, axes = plt.subplots(len(dtypes), 1, figsize=(max(8, 0.35 * len(results) / len(dtypes) + 4),
                                                       3.6 * len(dtypes)), squeeze=False)
    for ax, d in zip(axes[:, 0], dtypes):
        rs = [r for r in results if r["dtype"] == d]
        x = range(len(rs))
        ax.bar([i - 0.2 for i in x], [r["ops_tflops"] for r in rs], width=0.4, label="ops.cutlass_gemm")
        ax.bar([i + 0.2 for i in x], [r["torch_tflops"] for r in rs], width=0.4, label="torch.mm")
        ax.set_xticks(list(x))
        ax.set_xticklabels([r["shape"] for r in rs], rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("TFLOP/s")
        ax.set_title(f"{d} on {where}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", default=None,
                        help="comma-separated: bf16,fp16,fp32 (TF32 off),tf32 (fp32 with TF32 on),fp64 "
                             "(default: bf16,fp16,fp32,tf32 on GPU; fp32,bf16 on CPU)")
    parser.add_argument("--suite", choices=["all", "models", "square", "overhead"], default="all")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="fewer token counts and sizes")
    mode.add_argument("--full", action="store_true", help="the full suite even on CPU (slow)")
    parser.add_argument("--cpu", action="store_true", help="run on CPU even if a GPU is present")
    parser.add_argument("--candidates", action="store_true",
                        help="(GPU) also time every candidate tactic per shape: gemm_candidates.{json,md}")
    parser.add_argument("--autotune", action="store_true", help="run with ops.gemm.set_autotune(True)")
    parser.add_argument("--out", default=None, help=f"results folder (default {RESULTS}/local)")
    args = parser.parse_args(argv)
    gpu = torch.cuda.is_available() and not args.cpu
    if args.dtypes is None:
        args.dtypes = "bf16,fp16,fp32,tf32" if gpu else "fp32,bf16"
    out_dir = args.out or os.path.join(RESULTS, "local")
    log = PartialLog(out_dir, "gemm_overhead" if args.suite == "overhead" else "gemm")
    device, quick, results, candidates, tuning, planned, aborted = run(args, log)
    if not results:
        log.finish()
        sys.exit(f"aborted before any case was measured: {aborted}" if aborted else
                 "interrupted before any case was measured: nothing to report")
    report(device, quick, results, out_dir, candidates, tuning, args.suite, planned, aborted)
    log.finish()
    if aborted:
        sys.exit(f"aborted after {len(results)} of {planned} cases (the reports say so): {aborted}")
    if len(results) < planned:
        sys.exit(f"interrupted: {len(results)} of {planned} cases measured (the reports say so)")


if __name__ == "__main__":
    main()
