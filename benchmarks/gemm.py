"""The main job: ops.cutlass_gemm against torch.mm, measured in the same run.

    python -m benchmarks.gemm [--dtypes bf16,fp16,fp32,tf32,fp64] [--suite all|models|square|overhead|decode]
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

--suite decode: the Llama-3-8B projections at M = 1, 2, 4, 8, 16 tokens (gemm_decode.{json,md}): GB/s of
both sides beside a copy of the weight's bytes, the calls replayed from a CUDA graph over weight copies
that together exceed L2 (a decode step's launch cost and cold reads), and ops.linear with silu and
gelu_tanh against F.linear + the activation, eager and replayed.

--candidates (GPU) also times every candidate tactic of each shape (ops.gemm.plan(A, B)["candidates"],
forced with ops.gemm.set_tactic) and writes gemm_candidates.{json,md}: which tactic is fastest for which
shape, against the heuristic's choice: the data to fit the heuristic (cutlass_gemm/core/tactic.cpp) to.
Each tactic is named on stderr before it launches and runs under a watchdog (benchmarks/watchdog.py):
one that does not return within --tactic-limit seconds (default 60) or crashes the process is recorded
as a "HANG" or "CRASH" problem of its shape, and the sweep goes on in a new process. The risky cells
(stream-K scheduler and swap-AB tactics, shapes of M <= 64) run last. Each shape also records the CUDA
kernels torch.mm ran (torch.profiler: cuBLAS's kernel names carry tile, cluster and split-K).
--autotune runs with ops.gemm.set_autotune(True) (each shape tuned on its first, warm-up, call).

Without a GPU it runs the same suite (quick by default) on the CPU kernels: the CUTLASS kernels need an
NVIDIA GPU (sm80 or newer), and on CPU ops.cutlass_gemm is ATen's CPU mm, the kernel torch.mm runs. Both
columns then time the same call, which every output says (same_kernel_note). Each CPU row records the
machine's noise: "cpu_spread" (NOISY above 10%) and "cpu_wait" (BUSY above 0.1: another process held the
cores; benchmarks.common.cpu_wait).
"""

import argparse
import math
import os
import sys
import time

import torch

import ops
from benchmarks import watchdog
from benchmarks.common import (ACT, BUSY, NOISE, RESULTS, CudaTimer, PartialLog, copies_beyond_l2, copy_bandwidth,
                               cpu_compare, cpu_time, cuda_kernels, fastest, graph_time, int_list, machine_facts, mark_stopped,
                               markdown_table, max_rel_error, measure_all, output_check, replacing, sweep_order,
                               sweep_tactics, write_json, warn_without_candidate_kernels, wrong_results)

TOKENS = [1, 16, 128, 1024, 4096]
OVERHEAD_SIZES = [16, 64, 128]
MINILM = {"minilm.qkv": (384, 3 * 384), "minilm.attn_out": (384, 384), "minilm.ffn_up": (384, 1536),
          "minilm.ffn_down": (1536, 384)}  # name: (K = in_features, N = out_features)
LLAMA = {"llama3_8b.q_proj": (4096, 4096), "llama3_8b.kv_proj": (4096, 1024),
         "llama3_8b.gate_up": (4096, 14336), "llama3_8b.down": (14336, 4096)}
SQUARE = [256, 512, 1024, 2048, 4096, 8192]
DECODE_TOKENS = [1, 2, 4, 8, 16]
DECODE_ACTS = ("silu", "gelu_tanh")  # the fused linears of decode: gated MLPs' silu, GPT-style gelu_tanh
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "tf32": torch.float32,
          "fp64": torch.float64}


MODELS = {"minilm": MINILM, "llama3_8b": LLAMA}


def shapes(suite, quick, device, tokens=None, squares=None, models=None):
    """(name, M, N, K, B_layout) rows. Quick mode: fewer token counts and sizes (and, on CPU, the
    small end only, since a CPU BLAS needs seconds per large GEMM). tokens, squares (lists of ints) and
    models (names of MODELS) replace the suite's own."""
    default_tokens = [1, 128, 1024] if quick else TOKENS
    square = [256, 1024, 4096] if quick else SQUARE
    if device == "cpu" and quick:
        default_tokens, square = [1, 16, 128], [256, 512, 1024]
    explicit = tokens is not None
    tokens = tokens or default_tokens
    square = squares or square
    rows = []
    if suite == "overhead":
        return [(f"overhead {s}", s, s, s, "row") for s in OVERHEAD_SIZES]
    if suite == "decode":
        decode = tokens if explicit else [1, 16] if quick else DECODE_TOKENS
        names = ["llama3_8b.q_proj", "llama3_8b.kv_proj"] if device == "cpu" and quick else list(LLAMA)
        return [(f"{name} T={t}", t, LLAMA[name][1], LLAMA[name][0], "weight") for name in names for t in decode]
    if suite in ("all", "models"):
        for model in models or MODELS:
            for name, (k, n) in MODELS[model].items():
                for t in tokens:
                    if device == "cpu" and quick and not explicit and name.startswith("llama") and t > 16:
                        continue
                    rows.append((f"{name} T={t}", t, n, k, "weight"))
    if suite in ("all", "square"):
        rows += [(f"square {s}", s, s, s, "row") for s in square]
    return rows


def call_times(fns, rounds=5):
    """(seconds per call of back-to-back calls of each of `fns` (host-bound for tiny problems), spread, wait):
    cpu_compare's interleaved rounds (torch.utils.benchmark synchronizes CUDA around each timed block)."""
    return cpu_compare(fns, rounds, min_run_time=0.2)


def same_kernel_note(suite):
    """What a CPU run's ratios measure: on CPU ops runs ATen's own kernels, the reference's."""
    if suite == "overhead":
        return ("On CPU ops.cutlass_gemm runs ATen's CPU mm (at::cpu::mm), the kernel torch.mm runs: the "
                "columns differ only by each call path's cost.")
    fused = ("; ops.linear runs ATen's linear, then the activation in place, as F.linear + the activation do"
             if suite == "decode" else "")
    return ("On CPU ops.cutlass_gemm runs ATen's CPU mm (at::cpu::mm), the kernel torch.mm runs" + fused +
            ": both sides time the same calls, so a ratio away from 1 measures the machine, not ops. "
            "The CUTLASS kernels need an NVIDIA GPU (sm80 or newer).")


STEMS = {"overhead": "gemm_overhead", "decode": "gemm_decode"}


def case_label(case):
    return f"{case[0]} {case[1]}"


def run(args, log=None, resume=None):
    """Measures every case of the chosen suite. Returns (device, quick, results, candidates, tuning cache
    or None, number of cases planned, aborted: None, or the error that stopped the run). Each result (and
    candidate sweep) also goes to `log` (a PartialLog) as it is measured. resume (a
    watchdog.ResumeState): the records of an earlier worker of this run, whose cases are not measured
    again, and the tactics it hung or crashed in."""
    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    quick = args.quick or (device == "cpu" and not args.full)
    if device == "cpu":
        print(f"No NVIDIA GPU here ({'quick' if quick else 'full'} suite). {same_kernel_note(args.suite)}",
              flush=True)
    timer = CudaTimer() if device == "cuda" else None
    if args.candidates and device == "cuda":
        warn_without_candidate_kernels("swap-AB, SIMT GEMV; each case's not_built lists their tactics")
    cases = planned_cases(args, device)
    results = resume.of("result") if resume else []
    candidates = resume.of("candidates") if resume else []
    done = {(r["dtype"], r["shape"]) for r in results}
    planned = len(cases)
    cases = [c for c in cases if (c[0], c[1]) not in done]
    tuning = None
    progress = watchdog.Progress(log, supervised=args.worker) if log is not None and args.candidates else None
    skips = resume.skips if resume else {}
    overhead = args.suite == "overhead"
    if args.autotune:
        ops.gemm.set_autotune(True)
    saved_precision = torch.get_float32_matmul_precision()
    gen = torch.Generator(device=device).manual_seed(0)

    def measure(case):
        n_results, n_candidates = len(results), len(candidates)
        measure_case(args, device, timer, gen, overhead, case, results, candidates, progress,
                     skips.get(case_label(case), {}))
        if log is not None:
            for r in results[n_results:]:
                log.write("result", r)
            for c in candidates[n_candidates:]:
                log.write("candidates", c)

    try:
        _, aborted = measure_all(cases, measure, "gemm", label=case_label)
    finally:
        torch.set_float32_matmul_precision(saved_precision)
        if args.autotune:
            tuning = ops.gemm.tuning_cache()
            ops.gemm.set_autotune(False)
    return device, quick, results, candidates, tuning, planned, aborted


def measure_case(args, device, timer, gen, overhead, case, results, candidates, progress=None, skip=None):
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
    # Every launch of ours is watched like the candidates (the heuristic's tactic, the decode suite's
    # graphs and fused linears); a step an earlier worker hung or crashed in is not run again.
    skip = dict(skip or {})
    hung = skip.get("heuristic")
    watch = progress is not None and device == "cuda" and not overhead and not hung
    if watch:
        progress.start(case_label(case), "heuristic")
    ours = None if hung else ops.cutlass_gemm(A, B)
    theirs = torch.mm(A, B)
    err_ours = max_rel_error(ours, ref) if ours is not None else float("nan")
    err_torch = max_rel_error(theirs, ref)
    del ours, theirs
    extra = {"problem": hung} if hung else {}
    if overhead:
        (t_ours, t_torch, t_aten), extra["cpu_spread"], extra["cpu_wait"] = call_times(
            [lambda: ops.cutlass_gemm(A, B), lambda: torch.mm(A, B), lambda: torch.ops.aten.mm.default(A, B)])
        extra["aten_op_ms"] = t_aten * 1e3
    elif device == "cuda":
        t_ours = float("nan") if hung else timer(lambda: ops.cutlass_gemm(A, B))
        if watch:
            progress.end(case_label(case), "heuristic")
        t_torch = timer(lambda: torch.mm(A, B))
        extra["torch_kernels"] = cuda_kernels(lambda: torch.mm(A, B))
    else:
        (t_ours, t_torch), extra["cpu_spread"], extra["cpu_wait"] = cpu_compare(
            [lambda: ops.cutlass_gemm(A, B), lambda: torch.mm(A, B)])
    if args.suite == "decode":
        decode_hung = skip.get("decode")
        watch_decode = progress is not None and device == "cuda" and not decode_hung
        if watch_decode:
            progress.start(case_label(case), "decode")
        extra.update(measure_decode(device, timer, gen, A, B, t_ours, t_torch, ops_runs=not (hung or decode_hung)))
        if watch_decode:
            progress.end(case_label(case), "decode")
        if decode_hung:
            extra["decode_problem"] = decode_hung
    # The heuristic's tactic (with --autotune the JSON also holds the tuning cache: what ran instead).
    plan = ops.gemm.plan(A, B) if device == "cuda" else None
    tactic = plan["tactic"]["name"] if plan else "cpu (ATen)"
    extra["same_kernel"] = plan is None or tactic == "aten"  # ATen's kernel on both sides
    if hung and plan:  # the same tactic under its own name among the candidates
        skip.setdefault(tactic, hung)
    if args.candidates and plan and not overhead and dname in ("bf16", "fp16"):
        # torch's error is the scale of the check: the heuristic's own output is one of the candidates.
        times, problems = sweep_tactics(lambda: ops.cutlass_gemm(A, B), sweep_order(plan["candidates"]), timer,
                                        check=output_check(ref, dtype, [err_torch]), progress=progress,
                                        case=case_label(case), skip=skip, rounds=args.rounds)
        candidates.append({
            "dtype": dname, "shape": name, "M": M, "N": N, "K": K, "torch_ms": t_torch * 1e3,
            "heuristic": tactic, "best": fastest(times),
            "times_ms": {k: (v * 1e3 if v else None) for k, v in times.items()}, "problems": problems,
            "not_built": plan.get("candidates_not_built", []), "torch_kernels": extra.get("torch_kernels", []),
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


def measure_decode(device, timer, gen, A, B, t_ours, t_torch, ops_runs=True):
    """Decode's view of x @ W^T (B = W^T): GB/s of both sides beside a copy of the weight's bytes (the
    ceiling), the same calls replayed from a CUDA graph over weights that together exceed L2 (a decode
    step's launch cost and cold reads), and ops.linear with each of DECODE_ACTS against F.linear + the
    activation, eager and replayed. Times in ms; None where not measured (no CUDA graphs on CPU)."""
    W = B.t()
    nbytes = (A.numel() + W.numel() + A.shape[0] * W.shape[0]) * A.element_size()
    timed = timer if device == "cuda" else cpu_time
    out = {"bytes": nbytes, "copy_GBps": copy_bandwidth(W.numel() * W.element_size(), timed, device),
           "ops_GBps": nbytes / t_ours / 1e9 if ops_runs else None, "torch_GBps": nbytes / t_torch / 1e9,
           "ops_graph_ms": None, "torch_graph_ms": None, "fused": {}}
    weights = [W]
    if device == "cuda":
        weights += [torch.randn(W.shape, device=device, dtype=W.dtype, generator=gen)
                    for _ in range(copies_beyond_l2(W.numel() * W.element_size()) - 1)]
        if ops_runs:
            out["ops_graph_ms"] = graph_time([lambda w=w: ops.cutlass_gemm(A, w.t()) for w in weights]) * 1e3
        out["torch_graph_ms"] = graph_time([lambda w=w: torch.mm(A, w.t()) for w in weights]) * 1e3
    for name in DECODE_ACTS:
        act = ACT[name]
        fused = {"ops_ms": timed(lambda: ops.linear(A, W, activation=name)) * 1e3 if ops_runs else None,
                 "ref_ms": timed(lambda: act(torch.nn.functional.linear(A, W))) * 1e3,
                 "ops_graph_ms": None, "ref_graph_ms": None}
        if device == "cuda":
            if ops_runs:
                fused["ops_graph_ms"] = graph_time([lambda w=w: ops.linear(A, w, activation=name)
                                                    for w in weights]) * 1e3
            fused["ref_graph_ms"] = graph_time([lambda w=w: act(torch.nn.functional.linear(A, w))
                                                for w in weights]) * 1e3
        out["fused"][name] = fused
    return out


def _ratio(reference, ours):
    return f"{reference / ours:.3f}" if reference and ours else "-"


def report_decode(results, facts, quick, note, out_dir, same_note=None):
    """gemm_decode.md: the decode suite's bandwidth, CUDA-graph and fused-linear columns; same_note (where
    both sides ran the same kernels) first."""
    headers = ["dtype", "shape", "ops GB/s", "torch.mm GB/s", "copy GB/s", "ops / copy", "ratio",
               "graph: ops us", "graph: torch.mm us", "graph ratio"]
    for name in DECODE_ACTS:
        headers += [f"{name}: ops.linear / F.linear+act", f"{name} graph ratio"]
    rows = []
    for r in results:
        def us(ms):
            return f"{ms * 1e3:.2f}" if ms else "-"
        row = [r["dtype"], r["shape"], f"{r['ops_GBps']:.0f}" if r["ops_GBps"] else "-", f"{r['torch_GBps']:.0f}",
               f"{r['copy_GBps']:.0f}", f"{r['ops_GBps'] / r['copy_GBps']:.0%}" if r["ops_GBps"] else "-",
               f"{r['ratio']:.3f}", us(r["ops_graph_ms"]), us(r["torch_graph_ms"]),
               _ratio(r["torch_graph_ms"], r["ops_graph_ms"])]
        for name in DECODE_ACTS:
            f = r["fused"][name]
            row += [_ratio(f["ref_ms"], f["ops_ms"]), _ratio(f["ref_graph_ms"], f["ops_graph_ms"])]
        rows.append(row)
    if any("cpu_spread" in r for r in results):  # the GEMM pair's noise (the ratio column's)
        at = headers.index("ratio") + 1
        headers[at:at] = ["spread", "CPU wait"]
        for row, r in zip(rows, results):
            row[at:at] = noise_cells(r)
    where = facts.get("gpu", f"CPU ({facts['cpu']}, {facts['cpu_threads']} threads)")
    with replacing(os.path.join(out_dir, "gemm_decode.md")) as f:
        f.write(f"# Decode GEMMs (x @ W^T, M = tokens) on {where}\n\n")
        if same_note:
            f.write(f"**{same_note}**\n\n")
        f.write(f"torch {facts['torch']}, CUDA {facts['cuda']}; {'quick' if quick else 'full'} suite{note}. "
                "GB/s = (x + W + out bytes) / time; copy = a device copy of W's bytes (read and written); "
                "ratio = reference time / ops time (>1: ops faster). graph: the calls replayed from one CUDA "
                "graph over weight copies that together exceed L2, time per call. Fused: ops.linear(x, W, "
                "activation=...) against F.linear followed by the activation, eager and replayed.\n\n")
        f.write(markdown_table(headers, rows) + "\n")
        noisy = [r for r in results if is_noisy(r)]
        if noisy:
            f.write(f"\n{len(noisy)} of {len(results)} rows NOISY (spread above {NOISE:.0%}, or BUSY): their "
                    f"ratios measure the machine, not the two sides. {NOISE_NOTE}\n")


def geomean(values):
    values = [v for v in values if v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def summary_text(s):
    """One dtype's summary line: the geometric mean and lowest ratio of all rows, and of the quiet ones where
    some are NOISY."""
    text = f"{s['geomean_ratio']:.3f}, lowest {s['min_ratio']:.3f}"
    if "quiet_rows" in s:
        text += (f"; without the NOISY rows: {s['quiet_geomean_ratio']:.3f}, lowest {s['quiet_min_ratio']:.3f} "
                 f"({s['quiet_rows']} rows)" if s["quiet_rows"] else "; every row NOISY")
    return text


def is_noisy(r):
    """A row whose ratio measures the machine (NOISY): its spread exceeds NOISE, or it was timed BUSY."""
    return r.get("cpu_spread", 0.0) > NOISE or (r.get("cpu_wait") or 0.0) > BUSY


NOISE_NOTE = ("spread: the largest IQR / median of a measurement, or spread of one side's medians over interleaved "
              f"rounds; NOISY above {NOISE:.0%}. CPU wait: how many of this process's threads, on average, waited "
              "for a CPU while the row's times were measured (Linux's run-queue wait); BUSY above "
              f"{BUSY}: another process held the cores, and each parallel call waited for its threads' turn.")


def noise_cells(r):
    """The "spread" and "CPU wait" cells of a row, marked NOISY and BUSY past their thresholds."""
    spread, wait = r.get("cpu_spread"), r.get("cpu_wait")
    return ["-" if spread is None else (f"{spread:.1%}" if spread < 10 else f"{spread:.0f}x") + (" NOISY" if spread > NOISE else ""),
            "-" if wait is None else f"{wait:.2f}" + (" BUSY" if wait > BUSY else "")]


def same_kernel_facts(device, suite, results):
    """{"reference_is_same_kernel": whether every row ran ATen's kernel on both sides, "note": why, where
    some did}: CPU runs, and GPU rows whose plan fell back to ATen (tactic "aten")."""
    same = [r for r in results if r.get("same_kernel")]
    facts = {"reference_is_same_kernel": bool(results) and len(same) == len(results)}
    if device == "cpu":
        facts["note"] = same_kernel_note(suite)
    elif same:
        facts["note"] = (f"{len(same)} of {len(results)} rows ran ATen's kernel on both sides (tactic aten: "
                         "ops.gemm.plan() gives the reason): " + ", ".join(f"{r['dtype']} {r['shape']}" for r in same))
    return facts


def report(device, quick, results, out_dir, candidates=(), tuning=None, suite="all", planned=None, aborted=None):
    """Prints the table and writes {stem}.json, {stem}.md (and gemm.png, gemm_candidates.*). planned: the
    number of cases the run set out to measure, when it stopped before measuring them all; aborted: the
    error that stopped it (measure_all). Where both sides ran the same kernel (every CPU run), each output
    says so first: the terminal, the markdown, the JSON ("reference_is_same_kernel", "note") and the plot."""
    headers = ["dtype", "shape", "M", "N", "K", "ops ms", "torch.mm ms", "ops TFLOP/s",
               "torch.mm TFLOP/s", "ratio", "ops err", "torch.mm err", "tactic"]
    rows = [[r["dtype"], r["shape"], r["M"], r["N"], r["K"], f"{r['ops_ms']:.4f}", f"{r['torch_ms']:.4f}",
             f"{r['ops_tflops']:.2f}", f"{r['torch_tflops']:.2f}", f"{r['ratio']:.3f}",
             f"{r['ops_max_rel_err']:.2e}", f"{r['torch_max_rel_err']:.2e}", r["tactic"]] for r in results]
    facts = machine_facts(device)
    same = same_kernel_facts(device, suite, results)
    noisy = [r for r in results if is_noisy(r)]
    summary = {}
    for d in sorted({r["dtype"] for r in results}):
        ratios = [r["ratio"] for r in results if r["dtype"] == d]
        summary[d] = {"geomean_ratio": geomean(ratios), "min_ratio": min(ratios)}
        quiet = [r["ratio"] for r in results if r["dtype"] == d and not is_noisy(r)]
        if len(quiet) < len(ratios):  # the rows whose ratio measures the two sides, not the machine's noise
            summary[d].update(quiet_rows=len(quiet), quiet_geomean_ratio=geomean(quiet) if quiet else None,
                              quiet_min_ratio=min(quiet) if quiet else None)
    if suite == "overhead":  # the binding's share: torch.mm's kernel called as a torch.library op is
        headers.insert(7, "aten.mm.default ms")
        for row, r in zip(rows, results):
            row.insert(7, f"{r['aten_op_ms']:.4f}")
    if any("cpu_spread" in r for r in results):
        at = headers.index("ratio") + 1
        headers[at:at] = ["spread", "CPU wait"]
        for row, r in zip(rows, results):
            row[at:at] = noise_cells(r)
    table = markdown_table(headers, rows)
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    print()
    if "note" in same:
        print(same["note"])
    for row in [headers] + rows:
        print("  ".join(str(c).rjust(w) for c, w in zip(row, widths)))
    print()
    for d, s in summary.items():
        print(f"{d}: geometric-mean ratio (ops / torch.mm speed) {summary_text(s)}")
    noise_note = ""
    if noisy:
        noise_note = (f"{len(noisy)} of {len(results)} rows NOISY (spread above {NOISE:.0%}, or BUSY): their ratios "
                      f"measure the machine, not the two sides. {NOISE_NOTE}")
        print(noise_note)
    os.makedirs(out_dir, exist_ok=True)
    stem = STEMS.get(suite, "gemm")
    payload = {"benchmark": stem, "device": device, "quick": quick, **same, "machine": facts,
               "build": {k: v for k, v in vars(ops.build_info).items() if k.isupper()},
               "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "summary": summary,
               "noisy_rows": [f"{r['dtype']} {r['shape']}" for r in noisy], "results": results}
    if tuning is not None:
        payload["tuning_cache"] = tuning
    interrupted = mark_stopped(payload, len(results), len(results) if planned is None else planned, aborted)
    write_json(os.path.join(out_dir, f"{stem}.json"), payload)
    if candidates:
        report_candidates(candidates, facts, out_dir)
    where = facts.get("gpu", f"CPU ({facts['cpu']}, {facts['cpu_threads']} threads)")
    with replacing(os.path.join(out_dir, f"{stem}.md")) as f:
        f.write(f"# ops.cutlass_gemm vs torch.mm on {where}\n\n")
        if "note" in same:
            f.write(f"**{same['note']}**\n\n")
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
            f.write(f"- {d}: geometric-mean ratio {summary_text(s)}\n")
        if noise_note:
            f.write(f"\n{noise_note}\n")
    if suite == "decode":  # replaces the plain table's gemm_decode.md
        report_decode(results, facts, quick, interrupted, out_dir, same.get("note"))
    if suite in ("overhead", "decode"):
        print(f"\nwrote {out_dir}/{stem}.json, {stem}.md")
        return
    plot(results, where, os.path.join(out_dir, "gemm.png"), same.get("note") if device == "cpu" else None)
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
    with replacing(os.path.join(out_dir, "gemm_candidates.md")) as f:
        f.write(f"# cutlass_gemm tactics per shape on {facts.get('gpu', 'CPU')}\n\n")
        f.write("heuristic / best > 1: the heuristic (cutlass_gemm/core/tactic.cpp) left that much on the table. "
                "wrong results: tactics whose output failed the check against the float64 reference (not timed: "
                "a kernel bug to fix before that tactic can be chosen). All times, and why a tactic has none: "
                "gemm_candidates.json.\n\n")
        f.write(markdown_table(headers, rows) + "\n")
    print(f"wrote {out_dir}/gemm_candidates.json, gemm_candidates.md")


def plot(results, where, path, note=None):
    """gemm.png: both sides' TFLOP/s per shape, one panel per dtype. note (a CPU run: both sides are the same
    call) heads the figure; NOISY rows carry a marker above their bars, rows that ran ATen on both sides on a
    GPU an "(aten)" label."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dtypes = sorted({r["dtype"] for r in results})
    width = max(8, 0.35 * len(results) / len(dtypes) + 4)
    fig, axes = plt.subplots(len(dtypes), 1, figsize=(width, 3.6 * len(dtypes) + (0.8 if note else 0)),
                             squeeze=False)
    for ax, d in zip(axes[:, 0], dtypes):
        rs = [r for r in results if r["dtype"] == d]
        x = range(len(rs))
        ax.bar([i - 0.2 for i in x], [r["ops_tflops"] for r in rs], width=0.4, label="ops.cutlass_gemm")
        ax.bar([i + 0.2 for i in x], [r["torch_tflops"] for r in rs], width=0.4, label="torch.mm")
        noisy = [(i, max(r["ops_tflops"], r["torch_tflops"])) for i, r in enumerate(rs) if is_noisy(r)]
        if noisy:
            top = max(max(r["ops_tflops"], r["torch_tflops"]) for r in rs)
            ax.scatter([i for i, _ in noisy], [h + 0.04 * top for _, h in noisy], marker="v", color="crimson",
                       zorder=3, label=f"NOISY: the ratio measures the machine (spread > {NOISE:.0%} or BUSY)")
            ax.set_ylim(top=1.12 * top)
        ax.set_xticks(list(x))
        ax.set_xticklabels([r["shape"] + (" (aten)" if r.get("same_kernel") and not note else "") for r in rs],
                           rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("TFLOP/s")
        ax.set_title(f"{d} on {where}" + (": both bars time the same call" if note else ""))
        ax.legend(fontsize=8, loc="best", framealpha=0.9)
    if note:
        fig.suptitle("\n".join(textwrap.wrap(note, width=int(width * 14))), fontsize=9, color="crimson")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _model_list(text):
    names = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [n for n in names if n not in MODELS]
    if not names or unknown or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"expected comma-separated names of {', '.join(MODELS)}, got {text!r}")
    return names


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", default=None,
                        help="comma-separated: bf16,fp16,fp32 (TF32 off),tf32 (fp32 with TF32 on),fp64 "
                             "(default: bf16,fp16,fp32,tf32 on GPU; fp32,bf16 on CPU)")
    parser.add_argument("--suite", choices=["all", "models", "square", "overhead", "decode"], default="all")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="fewer token counts and sizes")
    mode.add_argument("--full", action="store_true", help="the full suite even on CPU (slow)")
    parser.add_argument("--cpu", action="store_true", help="run on CPU even if a GPU is present")
    parser.add_argument("--candidates", action="store_true",
                        help="(GPU) also time every candidate tactic per shape: gemm_candidates.{json,md}")
    parser.add_argument("--rounds", type=int, default=1,
                        help="--candidates: interleaved timing rounds over the tactics of a shape (the fastest counts)")
    parser.add_argument("--tokens", type=int_list, default=None,
                        help="comma-separated token counts (M) of the model and decode suites, e.g. 32,64,128,256")
    parser.add_argument("--squares", type=int_list, default=None, help="comma-separated sizes of the square suite")
    parser.add_argument("--models", type=_model_list, default=None,
                        help=f"comma-separated models of the model suite: {', '.join(MODELS)} (default: both)")
    parser.add_argument("--tactic-limit", type=float, default=60.0,
                        help="--candidates: seconds a tactic may take before it is recorded as a hang (0: no watchdog)")
    parser.add_argument(watchdog.WORKER_FLAG, action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--autotune", action="store_true", help="run with ops.gemm.set_autotune(True)")
    parser.add_argument("--out", default=None, help=f"results folder (default {RESULTS}/local)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.rounds > 1 and not args.candidates:
        parser.error("--rounds times the candidate sweep: give --candidates too")
    applies = {"--tokens": ("all", "models", "decode"), "--squares": ("all", "square"), "--models": ("all", "models")}
    for option, suites in applies.items():
        if getattr(args, option[2:]) is not None and args.suite not in suites:
            parser.error(f"{option} does not apply to --suite {args.suite} (only to {', '.join(suites)})")
    if not args.tactic_limit >= 0:  # NaN too
        parser.error(f"--tactic-limit must be a number of seconds >= 0 (0: no watchdog), got {args.tactic_limit}")
    # Before anything is written: a crashed run's partial log in --out stays for reading.
    if args.dtypes is not None:
        dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
        unknown = [d for d in dtypes if d not in DTYPES]
        if unknown or not dtypes:
            parser.error(f"--dtypes: {', '.join(map(repr, unknown)) or 'empty'}; choose from {', '.join(DTYPES)}")
    if args.out is not None and os.path.exists(args.out) and not os.path.isdir(args.out):
        parser.error(f"--out must be a folder, got the file {args.out}")
    return args


def planned_cases(args, device):
    """The (dtype, name, M, N, K, B layout) cases a run with `args` measures on `device`, in order."""
    quick = args.quick or (device == "cpu" and not args.full)
    dtypes = args.dtypes or ("bf16,fp16,fp32,tf32" if device == "cuda" else "fp32,bf16")
    cases = [(d.strip(), *s) for d in dtypes.split(",") if d.strip()
             for s in shapes(args.suite, quick, device, args.tokens, args.squares, args.models)]
    if args.candidates:  # small M (stream-K and swap-AB sweeps: the hang reports' shapes) last
        cases.sort(key=lambda case: case[2] <= 64)
    return cases


def main(argv=None):
    args = parse_args(argv)
    gpu = torch.cuda.is_available() and not args.cpu
    if args.dtypes is None:
        args.dtypes = "bf16,fp16,fp32,tf32" if gpu else "fp32,bf16"
    out_dir = args.out or os.path.join(RESULTS, "local")
    stem = STEMS.get(args.suite, "gemm")
    if args.candidates and gpu and args.tactic_limit > 0 and not args.worker:
        sys.exit(watchdog.supervise("benchmarks.gemm", list(sys.argv[1:] if argv is None else argv),
                                    os.path.join(out_dir, f"{stem}.partial.jsonl"), args.tactic_limit))
    resume = watchdog.ResumeState(os.path.join(out_dir, f"{stem}.partial.jsonl")) if args.worker else None
    log = PartialLog(out_dir, stem, append=args.worker)
    device, quick, results, candidates, tuning, planned, aborted = run(args, log, resume)
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
