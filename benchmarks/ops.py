"""Each fused op against its PyTorch reference, measured in the same run.

    python -m benchmarks.ops [--dtypes bf16,fp32] [--quick|--full] [--out DIR]

rms_norm vs F.rms_norm; fused_add_rms_norm vs (x + r, F.rms_norm); silu_and_mul vs F.silu(a) * b;
linear (bias + activation) vs F.linear + activation and, where it applies, torch._addmm_activation
(cuBLASLt's fused bias + ReLU or tanh GELU: against linear[relu] and linear[gelu_tanh]). Reports median
time, the ratio (reference time / ops time: above 1 means ops is faster) and, for the memory-bound ops,
the achieved bandwidth in GB/s (bytes each op must read and write once, over its time) next to a
device-to-device copy of the same bytes measured in the same run (the bandwidth ceiling: "ops / copy"). On CPU it runs a quick suite by default.
"""

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

import ops
from benchmarks import watchdog
from benchmarks.common import (ACT, RESULTS, CudaTimer, DeviceUnusable, PartialLog, copy_bandwidth, cpu_time,
                               cuda_kernels, fastest, int_list, machine_facts, mark_stopped, markdown_table,
                               max_rel_error, measure_all, output_check, sweep_order, sweep_tactics,
                               warn_without_candidate_kernels, write_report, wrong_results)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def compiled(formula, *args):
    """The reference a user would pick under torch.compile: `formula` compiled by Inductor (static
    shapes), called on `args`; compiled here, before it is timed. Dynamo first forgets the earlier cases' graphs:
    the formulas are lambdas sharing a code object, which past torch._dynamo.config.recompile_limit (8) would
    run eagerly; each case is timed before the next one is built."""
    torch._dynamo.reset()
    fn = torch.compile(formula, dynamic=False)
    fn(*args)
    return lambda: fn(*args)


def _add_norm(x, r, w, eps):
    s = x + r
    return F.rms_norm(s, (x.shape[-1],), w, eps), s


def cases(device, quick, compile_refs=True, hidden=4096, only=None, tokens=None, acts=None):
    """(op, shape description, build(dtype) -> (ops_fn, [(reference name, fn)], bytes moved or None)).
    compile_refs: each formula under torch.compile as a second reference. hidden: the norms' row length
    (silu_and_mul's d is 3.5x it, as Llama's intermediate size). only: op names to keep. tokens: the
    token counts of every op (default: the suite's); acts: the fused linear's activations."""
    def references(name, formula, *args):
        """[(name, formula on args)], then the same formula under torch.compile where asked."""
        return [(name, lambda: formula(*args))] + ([("torch.compile", compiled(formula, *args))] if compile_refs else [])

    explicit_tokens = tokens
    tokens = [16, 1024] if quick else [1, 16, 128, 1024, 4096]
    if device == "cpu":
        tokens = [16, 256] if quick else [1, 16, 128, 1024]
    tokens = explicit_tokens or tokens
    inter = hidden * 7 // 2
    out = []
    for t in tokens:
        def rms(dtype, t=t):
            x = torch.randn(t, hidden, device=device, dtype=dtype)
            w = torch.randn(hidden, device=device, dtype=dtype)
            nbytes = 2 * x.numel() * x.element_size() + w.numel() * w.element_size()
            refs = references("F.rms_norm", lambda x, w: F.rms_norm(x, (hidden,), w, 1e-5), x, w)
            return (lambda: ops.rms_norm(x, w, 1e-5)), refs, nbytes

        def add_rms(dtype, t=t):
            x = torch.randn(t, hidden, device=device, dtype=dtype)
            r = torch.randn(t, hidden, device=device, dtype=dtype)
            w = torch.randn(hidden, device=device, dtype=dtype)
            nbytes = 4 * x.numel() * x.element_size() + w.numel() * w.element_size()

            # In place on scratch copies would add a copy to the timing, so it runs in place on the same
            # buffers, which each call changes: the residual grows with every call (float16 reached 6.4e4,
            # then inf, within the ~300 calls of one case's GPU timings). `restore`
            # (called by `timed` before each timing, outside it) puts the random data back, so a GPU
            # timing (61 calls) stays finite; a CPU timing (thousands of calls) can still saturate
            # float16, which does not change the CPU kernels' speed.
            x0, r0 = x.clone(), r.clone()

            def fused_add():
                ops.fused_add_rms_norm(x, r, w, 1e-5)
            fused_add.restore = lambda: (x.copy_(x0), r.copy_(r0))
            return fused_add, references("x + r; F.rms_norm", _add_norm, x, r, w, 1e-5), nbytes

        def silu(dtype, t=t):
            x = torch.randn(t, 2 * inter, device=device, dtype=dtype)
            nbytes = (x.numel() + x.numel() // 2) * x.element_size()
            refs = references("F.silu(a) * b", lambda x: F.silu(x[:, :inter]) * x[:, inter:], x)
            return (lambda: ops.silu_and_mul(x)), refs, nbytes

        out += [("rms_norm", f"T={t} x {hidden}", rms), ("fused_add_rms_norm", f"T={t} x {hidden}", add_rms),
                ("silu_and_mul", f"T={t} x 2*{inter}", silu)]
    # Per-head q/k norms (Qwen3, Gemma3: rms_norm over head_dim = 128 of every head): short rows, the
    # CUDA lane-group kernel's case. Llama-3-8B's 32 query heads at T tokens.
    for t in explicit_tokens or ([1024] if quick else [16, 1024, 4096]):
        def head_rms(dtype, t=t, heads=32, head_dim=128):
            x = torch.randn(t, heads, head_dim, device=device, dtype=dtype)
            w = torch.randn(head_dim, device=device, dtype=dtype)
            nbytes = 2 * x.numel() * x.element_size() + w.numel() * w.element_size()
            refs = references("F.rms_norm", lambda x, w: F.rms_norm(x, (head_dim,), w, 1e-6), x, w)
            return (lambda: ops.rms_norm(x, w, 1e-6)), refs, nbytes
        out.append(("rms_norm", f"q/k norm T={t} x 32 heads x 128", head_rms))
    lin_tokens = [16, 1024] if quick else [1, 16, 128, 1024, 4096]
    if device == "cpu":
        lin_tokens = [16, 128] if quick else [1, 16, 128]
    for t in explicit_tokens or lin_tokens:
        for act in acts or (("gelu", "relu") if quick else ("relu", "gelu", "gelu_tanh", "silu")):
            def lin(dtype, t=t, act=act, k=1024 if device == "cpu" else 4096, n=4096):
                # Weights scaled as a trained layer's are (nn.Linear's init: std ~ 1/sqrt(K)), so the
                # pre-activations are O(1) as in a model, not std ~64: the tails of silu and gelu_tanh
                # would otherwise dominate their epilogue's cost (cutlass_common.cuh, logistic_quotient).
                x = torch.randn(t, k, device=device, dtype=dtype)
                w = torch.randn(n, k, device=device, dtype=dtype) / k ** 0.5
                b = torch.randn(n, device=device, dtype=dtype)
                refs = references("F.linear + act", lambda x, w, b: ACT[act](F.linear(x, w, b)), x, w, b)
                if act in ("relu", "gelu_tanh") and device == "cuda":  # its CUDA GELU is the tanh form (cuBLASLt)
                    refs.append(("torch._addmm_activation",
                                 lambda: torch._addmm_activation(b, x, w.t(), use_gelu=act == "gelu_tanh")))
                return (lambda: ops.linear(x, w, b, act)), refs, None, (x, w, b, act)
            out.append((f"linear[{act}]", f"T={t} x {4096 if device == 'cuda' else 1024} -> 4096", lin))
    return [case for case in out if only is None or case[0].split("[")[0] in only]


def _act_list(text):
    names = [v.strip() for v in text.split(",") if v.strip()]
    if not names or any(n not in ACT for n in names) or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"expected distinct comma-separated names of {', '.join(ACT)}, got {text!r}")
    return names


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", default=None, help="comma-separated of bf16, fp16, fp32")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true")
    mode.add_argument("--full", action="store_true")
    parser.add_argument("--out", default=os.path.join(RESULTS, "local"))
    parser.add_argument("--no-compile", action="store_true", help="no torch.compile references")
    parser.add_argument("--hidden", type=int, default=4096, help="the norms' hidden size (default 4096)")
    parser.add_argument("--ops", default=None, help="comma-separated op names to run (default: all)")
    parser.add_argument("--tokens", type=int_list, default=None,
                        help="comma-separated token counts of every op (default: the suite's)")
    parser.add_argument("--acts", type=_act_list, default=None,
                        help=f"comma-separated activations of the fused linear: {', '.join(ACT)}")
    parser.add_argument("--candidates", action="store_true",
                        help="(GPU) also time every candidate tactic of the fused linear cases "
                             "(ops_linear_candidates.{json,md}) and each rms_norm kernel variant on long rows "
                             "(ops_rms_kernels.{json,md})")
    parser.add_argument("--tactic-limit", type=float, default=60.0,
                        help="--candidates: seconds a tactic may take before it is recorded as a hang (0: no watchdog)")
    parser.add_argument(watchdog.WORKER_FLAG, action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.tactic_limit >= 0:  # NaN too
        parser.error(f"--tactic-limit must be a number of seconds >= 0 (0: no watchdog), got {args.tactic_limit}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    quick = args.quick or (device == "cpu" and not args.full)
    dtypes = [d.strip() for d in (args.dtypes or ("bf16,fp16" if device == "cuda" else "fp32,bf16")).split(",")
              if d.strip()]
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown or not dtypes:  # before anything is measured or written: --out keeps its previous report
        parser.error(f"--dtypes: {', '.join(map(repr, unknown)) or 'empty'}; choose from {', '.join(DTYPES)}")
    if device == "cpu":
        print(f"No NVIDIA GPU here: measuring the CPU kernels ({'quick' if quick else 'full'} suite, "
              f"{torch.get_num_threads()} threads).", flush=True)
    timer = CudaTimer() if device == "cuda" else None
    if args.candidates and timer:
        warn_without_candidate_kernels("SIMT GEMV")
    partial = os.path.join(args.out, "ops.partial.jsonl")
    if args.candidates and timer and args.tactic_limit > 0 and not args.worker:
        # Each tactic under the watchdog (benchmarks/watchdog.py): a hang or crash is a row, not the stage.
        return watchdog.supervise("benchmarks.ops", list(sys.argv[1:] if argv is None else argv), partial,
                                  args.tactic_limit)
    only = set(args.ops.split(",")) if args.ops else None
    known = {c[0].split("[")[0] for c in cases("cpu", True, compile_refs=False)}
    if only is not None and not only <= known:  # before anything is written: --out keeps its report
        parser.error(f"--ops: {', '.join(sorted(only - known))}; choose from {', '.join(sorted(known))}")
    todo = [(d, c) for d in dtypes for c in cases(device, quick, compile_refs=not args.no_compile, hidden=args.hidden,
                                                  only=only, tokens=args.tokens, acts=args.acts)]
    planned = len(todo)
    resume = watchdog.ResumeState(partial, kinds=("result", "linear_candidates", "rms_kernels", "case_done")) \
        if args.worker else None
    finished = {r["case"] for r in resume.of("case_done")} if resume else set()

    def label(case):
        return f"{case[1][0]} {case[1][1]} {case[0]}"

    def of_finished(kind):  # an earlier worker's records of the cases it finished
        return [r for r in resume.of(kind) if f"{r['op']} {r['shape']} {r['dtype']}" in finished] if resume else []

    results, sweeps, rms_sweeps = of_finished("result"), of_finished("linear_candidates"), of_finished("rms_kernels")
    todo = [case for case in todo if label(case) not in finished]
    log = PartialLog(args.out, "ops", append=args.worker)
    progress = watchdog.Progress(log, supervised=args.worker) if args.candidates and timer else None

    def timed(fn):
        """Seconds per call of fn (CudaTimer, or cpu_time on CPU), after fn.restore() where fn has one."""
        if hasattr(fn, "restore"):
            fn.restore()
        return timer(fn) if timer else cpu_time(fn)

    flush_check = compare_l2_flushes() if timer else None
    if flush_check:
        print(flush_check["note"], flush=True)

    def measure(case):
        dname, (op, shape, build) = case
        fn, refs, nbytes, *linear_args = build(DTYPES[dname])
        skip = resume.skips.get(label(case), {}) if resume else {}
        if "heuristic" in skip:  # an earlier worker hung in this case's own kernel: nothing to time
            log.write("case_done", {"case": label(case)})
            return
        if progress is not None and linear_args:  # the heuristic's GEMM, watched like the candidates
            progress.start(label(case), "heuristic")
        t_ops = timed(fn)
        if progress is not None and linear_args:
            progress.end(label(case), "heuristic")
        # The ceiling: a device-to-device copy moving the same bytes (half read, half written).
        copy_GBps = copy_bandwidth(nbytes // 2, timed, device) if nbytes else None
        if args.candidates and timer:
            try:
                if op in ("rms_norm", "fused_add_rms_norm") and "q/k" not in shape:
                    rms_sweeps.append(sweep_rms_kernels(op, shape, dname, fn, timed, t_ops, nbytes, copy_GBps))
                    log.write("rms_kernels", rms_sweeps[-1])
                if linear_args:
                    sweeps.append(sweep_linear_tactics(
                        op, shape, dname, fn, *linear_args[0], timer, t_ops, torch.cuda.get_device_capability(),
                        torch.cuda.get_device_properties(0).multi_processor_count, progress, label(case), skip))
                    log.write("linear_candidates", sweeps[-1])
            except DeviceUnusable:
                raise  # nothing after it can run: measure_all reports it
            except Exception as e:  # noqa: BLE001 - the sweeps are extra data: never lose the main table
                print(f"  sweep of {op} {shape} {dname} failed: {e!r}", file=sys.stderr)
        ops_GBps = nbytes / t_ops / 1e9 if nbytes else None
        for ref_name, ref in refs:
            t_ref = timed(ref)
            results.append({"op": op, "shape": shape, "dtype": dname, "reference": ref_name,
                            "ops_ms": t_ops * 1e3, "ref_ms": t_ref * 1e3, "ratio": t_ref / t_ops,
                            "ops_GBps": ops_GBps, "ref_GBps": nbytes / t_ref / 1e9 if nbytes else None,
                            "copy_GBps": copy_GBps, "ops_of_copy": ops_GBps / copy_GBps if nbytes else None})
            if timer and linear_args:  # the cuBLAS(Lt) kernels the reference ran: what a loss lost to
                results[-1]["ref_kernels"] = cuda_kernels(ref)
            log.write("result", results[-1])
        log.write("case_done", {"case": label(case)})

    done, aborted = measure_all(todo, measure, "ops", label=label)
    done += len(finished)
    headers = ["op", "shape", "dtype", "reference", "ops ms", "ref ms", "ratio", "ops GB/s", "ref GB/s",
               "copy GB/s", "ops / copy"]
    rows = [[r["op"], r["shape"], r["dtype"], r["reference"], f"{r['ops_ms']:.4f}", f"{r['ref_ms']:.4f}",
             f"{r['ratio']:.2f}", f"{r['ops_GBps']:.1f}" if r["ops_GBps"] else "-",
             f"{r['ref_GBps']:.1f}" if r["ref_GBps"] else "-",
             f"{r['copy_GBps']:.1f}" if r["copy_GBps"] else "-",
             f"{r['ops_of_copy']:.0%}" if r["ops_of_copy"] else "-"] for r in results]
    table = markdown_table(headers, rows)
    print(table)
    facts = machine_facts(device)
    payload = {"benchmark": "ops", "device": device, "quick": quick, "machine": facts, "results": results,
               "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if flush_check:
        payload["l2_flush_check"] = flush_check
        table += "\n\n" + flush_check["note"]
    title = f"Fused ops vs PyTorch on {facts.get('gpu', 'CPU')}" + mark_stopped(payload, done, planned, aborted)
    write_report(args.out, "ops", payload, title, table)
    if sweeps:
        report_linear_tactics(sweeps, facts, args.out)
    if rms_sweeps:
        report_rms_kernels(rms_sweeps, facts, args.out)
    log.finish()
    return 0 if done == planned else 3


def compare_l2_flushes(nbytes=32 * 1024 * 1024):
    """A device-to-device copy of `nbytes` (the size of a Llama-3-8B q_proj weight in bf16) timed with
    CudaTimer's read flush (what every timing here uses) and with a write flush (zero_(): L2 left full of
    dirty lines, whose write-back the timed copy would pay): how much the flush itself moves a memory-bound
    timing. Returns {"copy_bytes", "read_flush_ms", "write_flush_ms", "read_flush_GBps", "write_flush_GBps",
    "note"}; GB/s counts the bytes read and written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    times = {mode: CudaTimer(flush=mode)(lambda: dst.copy_(src)) for mode in ("read", "write")}
    check = {"copy_bytes": nbytes, **{f"{m}_flush_ms": t * 1e3 for m, t in times.items()},
             **{f"{m}_flush_GBps": 2 * nbytes / t / 1e9 for m, t in times.items()}}
    check["note"] = (f"L2 flush check: a {nbytes >> 20} MiB copy takes {check['read_flush_ms'] * 1e3:.1f} us "
                     f"({check['read_flush_GBps']:.0f} GB/s) after the read flush these timings use, "
                     f"{check['write_flush_ms'] * 1e3:.1f} us ({check['write_flush_GBps']:.0f} GB/s) after a "
                     "write flush (zero_(), L2 left dirty).")
    return check


def sweep_linear_tactics(op, shape, dname, fn, x, w, b, act, timer, t_heuristic, cc, sm_count, progress=None,
                         case="", skip=None):
    """Times ops.linear (`fn`: act(x @ w^T + b)) under every candidate tactic of its GEMM on a device of
    compute capability `cc` with `sm_count` SMs, forced with ops.gemm.set_tactic, each tactic's output
    first checked against a float64 reference (output_check, at the scale of F.linear + act's own error):
    the data for fitting the fused linear's tactic choice (cutlass_gemm/core/tactic.cpp). Times in ms."""
    plan = ops._library.gemm_plan_for_target(x, w.t(), *cc, ops.build_info.CUDA_ARCH_LIST,
                                             allow_tf32=ops._library.allow_tf32(), sm_count=sm_count,
                                             epilogue=act)
    reference = ACT[act](F.linear(x.double(), w.double(), b.double()))
    torch_error = max_rel_error(ACT[act](F.linear(x, w, b)), reference)
    times, problems = sweep_tactics(fn, sweep_order(plan["candidates"]), timer,
                                    check=output_check(reference, x.dtype, [torch_error]), progress=progress,
                                    case=case, skip=skip)
    # The heuristic's tactic is one of the candidates: its time from this sweep, like the others', so that
    # heuristic / best compares two timings of one sweep (the main table's timing is another measurement).
    heuristic = plan["tactic"]["name"]
    t_heuristic = times.get(heuristic) or t_heuristic
    return {"op": op, "shape": shape, "dtype": dname, "heuristic": heuristic,
            "heuristic_ms": t_heuristic * 1e3, "best": fastest(times),
            "times_ms": {name: (t * 1e3 if t is not None else None) for name, t in times.items()},
            "problems": problems}


RMS_PACKS = (0, 1, 2, 4, 8)  # csrc/fused_kernels.h: 0 the default kernel, else packs per thread in registers


def sweep_rms_kernels(op, shape, dname, fn, timer, t_default, nbytes, copy_GBps):
    """Times `fn` (rms_norm or fused_add_rms_norm on long rows) with each CUDA kernel variant of
    RMS_PACKS, selected with the private op ops::_rms_norm_set_packs_per_thread: which one to make the
    default. Times in ms; GB/s = the op's bytes over its time; "of copy" against a same-bytes copy."""
    times = {0: t_default}
    for packs in RMS_PACKS[1:]:
        previous = torch.ops.ops._rms_norm_set_packs_per_thread(packs)
        try:
            times[packs] = timer(fn)
        finally:
            torch.ops.ops._rms_norm_set_packs_per_thread(previous)
    return {"op": op, "shape": shape, "dtype": dname, "copy_GBps": copy_GBps,
            "times_ms": {str(p): t * 1e3 for p, t in times.items()},
            "GBps": {str(p): nbytes / t / 1e9 for p, t in times.items()}}


def report_rms_kernels(sweeps, facts, out_dir):
    """ops_rms_kernels.{json,md}: each rms_norm kernel variant's time and bandwidth per case."""
    headers = ["op", "shape", "dtype", "copy GB/s"] + [f"packs {p} GB/s" if p else "default GB/s" for p in RMS_PACKS]
    rows = [[c["op"], c["shape"], c["dtype"], f"{c['copy_GBps']:.0f}"] +
            [f"{c['GBps'][str(p)]:.0f}" for p in RMS_PACKS] for c in sweeps]
    write_report(out_dir, "ops_rms_kernels", {"benchmark": "ops_rms_kernels", "machine": facts, "results": sweeps},
                 f"rms_norm kernels for long rows on {facts.get('gpu', '?')}", markdown_table(headers, rows))


def report_linear_tactics(sweeps, facts, out_dir):
    """ops_linear_candidates.{json,md}: every tactic's time per fused-linear case, the fastest, the heuristic's."""
    rows = []
    for c in sweeps:
        best = c["times_ms"].get(c["best"]) if c["best"] else None
        rows.append([c["op"], c["shape"], c["dtype"], c["heuristic"], f"{c['heuristic_ms']:.4f}", c["best"] or "-",
                     f"{best:.4f}" if best else "-", f"{c['heuristic_ms'] / best:.2f}" if best else "-",
                     ", ".join(wrong_results(c["problems"])) or "-"])
    table = markdown_table(["op", "shape", "dtype", "heuristic", "heuristic ms", "best", "best ms",
                            "heuristic / best", "wrong results (not timed)"], rows)
    write_report(out_dir, "ops_linear_candidates",
                 {"benchmark": "ops_linear_candidates", "machine": facts, "results": sweeps},
                 f"Fused linear: every candidate tactic on {facts.get('gpu', '?')}", table)


if __name__ == "__main__":
    sys.exit(main())
