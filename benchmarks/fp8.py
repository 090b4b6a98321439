"""FP8: ops.scaled_gemm against torch._scaled_mm (same recipe, same accumulation setting) and bf16 torch.mm,
and the FP8 quantization ops against torch's formula and torch.compile of it, measured in one run.

    python -m benchmarks.fp8 [--quick|--full] [--recipes tensorwise,rowwise,block128] [--fast-accum] [--out DIR]

GEMM rows: Llama-3-8B's projections and DeepSeek-V3's (N, K from 2112 to 18432) at M tokens, and squares:
median time, TFLOP/s (2 M N K / time), ratios (reference time / ops time: above 1 means ops is faster),
and each result's max relative error against the float64 product of the same codes and scales. A reference
torch cannot run (torch._scaled_mm runs no blockwise recipe on CPU) reads "n/a" with its reason.
Quantization rows: GB/s (bytes read and written once, over the time) next to a copy of the same bytes in the
same run. On CPU a quick suite runs by default.
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F

import ops
from benchmarks.common import (RESULTS, CudaTimer, copy_bandwidth, cpu_time, first_line, int_list, machine_facts,
                               markdown_table, max_rel_error, measure_all, write_report)

E4 = torch.float8_e4m3fn
RECIPES = ("tensorwise", "rowwise", "block128")
# (name, N, K) of each projection, as x (M, K) @ W^T (K, N).
SHAPES = {
    "llama3-8b": [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)],
    "deepseek-v3": [("q_a", 2112, 7168), ("q_b", 24576, 1536), ("o", 7168, 16384), ("gate_up", 36864, 7168),
                    ("down", 7168, 18432)],
}


def gemm_cases(device, quick, tokens=None, nk=None):
    """(label, M, N, K) of the GEMM rows; nk: (N, K) pairs replacing the model shapes and squares."""
    if nk:
        return [(f"{n}x{k}", m, n, k) for n, k in nk for m in tokens or [16]]
    if device == "cpu":  # ATen's float32 mm of the dequantized operands: smaller problems
        shapes = [("llama3-8b", "o", 4096, 4096), ("deepseek-v3", "q_a", 2112, 7168)]
        tokens = tokens or ([16, 128] if quick else [1, 16, 128, 512])
        squares = [] if quick else [1024, 2048]
    else:
        shapes = [(model, *s) for model, rows in SHAPES.items() for s in rows]
        tokens = tokens or ([1, 64, 4096] if quick else [1, 16, 64, 128, 512, 2048, 4096, 8192])
        squares = [4096] if quick else [4096, 8192]
    cases = [(f"{model} {name}", m, n, k) for model, name, n, k in shapes for m in tokens]
    cases += [("square", s, s, s) for s in squares]
    return cases


def operands(m, n, k, recipe, device):
    """(A, B, scale_a, scale_b) quantized from N(0, 1) data with ops.quantize_fp8: the recipe's scales;
    B = W^T column-major, as a checkpoint's weight (N, K) gives it."""
    g = torch.Generator(device).manual_seed(m * 7 + n)  # on the device: W is up to 117 M values
    x = torch.randn(m, k, generator=g, device=device)
    w = torch.randn(n, k, generator=g, device=device) / k ** 0.5
    if recipe == "tensorwise":
        (a, sa), (wq, sw) = ops.quantize_fp8(x, "tensor"), ops.quantize_fp8(w, "tensor")
        return a, wq.t(), sa, sw
    if recipe == "rowwise":
        (a, sa), (wq, sw) = ops.quantize_fp8(x, "row"), ops.quantize_fp8(w, "row")
        return a, wq.t(), sa, sw.t()
    (a, sa), (wq, sw) = ops.quantize_fp8(x, "group"), ops.quantize_fp8(w, "block")
    return a, wq.t(), sa, sw.t()


def exact(a, b, sa, sb):
    """The float64 product of the codes times their scales (every recipe)."""
    m, k = a.shape
    n = b.shape[1]
    ea = sa.double().reshape(1, 1) if sa.numel() == 1 else sa.double()
    eb = sb.double().reshape(1, 1) if sb.numel() == 1 else sb.double()
    if ea.shape[1] not in (1, k):
        ea = ea.repeat_interleave(128, 1)[:, :k]
    if eb.shape[0] not in (1, k):
        eb = eb.repeat_interleave(128, 0)[:k]
    if eb.shape[1] not in (1, n):
        eb = eb.repeat_interleave(128, 1)[:, :n]
    return (a.double() * ea) @ (b.double() * eb)


def torch_scaled_mm(a, b, sa, sb, recipe, fast_accum):
    """torch._scaled_mm with the same recipe, or raises (what torch cannot run: blockwise on CPU)."""
    if recipe == "block128":  # torch's blockwise 1x128 x 128x128 takes scale_a outer-dim-major
        sa = sa.t().contiguous().t()
    return torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=fast_accum)


def measure_gemm(case, recipe, device, timed, fast_accum):
    label, m, n, k = case
    a, b, sa, sb = operands(m, n, k, recipe, device)
    ref = exact(a, b, sa, sb)
    flops = 2 * m * n * k
    plan = ops.fp8.plan(a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=fast_accum)
    row = {"case": label, "m": m, "n": n, "k": k, "recipe": recipe, "fast_accum": fast_accum, "path": plan["path"],
           "kernel": plan.get("kernel", "")}
    fn = lambda: ops.scaled_gemm(a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=fast_accum)  # noqa: E731
    t = timed(fn)
    row.update(ops_ms=t * 1e3, ops_tflops=flops / t / 1e12, ops_error=max_rel_error(fn(), ref))
    try:
        torch_scaled_mm(a, b, sa, sb, recipe, fast_accum)
        tt = timed(lambda: torch_scaled_mm(a, b, sa, sb, recipe, fast_accum))
        row.update(torch_ms=tt * 1e3, vs_torch=tt / t,
                   torch_error=max_rel_error(torch_scaled_mm(a, b, sa, sb, recipe, fast_accum), ref))
    except (RuntimeError, NotImplementedError, ValueError) as e:
        row["torch_unavailable"] = first_line(e)
    xb, wb = a.to(torch.bfloat16), b.to(torch.bfloat16)
    tb = timed(lambda: torch.mm(xb, wb))
    row.update(bf16_mm_ms=tb * 1e3, vs_bf16_mm=tb / t)
    return row


def quant_cases(device, quick, tokens=None):
    tokens_default = ([16, 1024] if quick else [1, 16, 128, 1024, 4096]) if device == "cuda" else \
        ([16, 256] if quick else [1, 16, 256, 1024])
    tokens = tokens or tokens_default
    return [(op, t) for t in tokens for op in ("quantize row", "quantize group", "rms_norm_fp8", "silu_and_mul_fp8")]


def _quant_formula(x, granularity):  # torch's own ops: amax, scale, divide, clamp, cast
    xf = x.float()
    if granularity == "row":
        s = xf.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 448
        return (xf / s).clamp(-448, 448).to(E4), s
    g = xf.view(*xf.shape[:-1], -1, 128)
    s = g.abs().amax(-1).clamp(min=1e-12) / 448
    return (g / s.unsqueeze(-1)).clamp(-448, 448).to(E4).view(xf.shape), s


def measure_quant(case, device, timed, compile_refs, dtype=torch.bfloat16, hidden=4096):
    """One quantization row: the op, torch's formula and (compile_refs) that formula under torch.compile."""
    op, t = case
    x = torch.randn(t, hidden, device=device, dtype=dtype)
    w = torch.rand(hidden, device=device, dtype=dtype) + 0.5
    if op.startswith("quantize"):
        gran = op.split()[1]
        fn, formula, args = (lambda: ops.quantize_fp8(x, gran)), (lambda x: _quant_formula(x, gran)), (x,)
        nbytes = x.numel() * (x.element_size() + 1)
    elif op == "rms_norm_fp8":
        fn = lambda: ops.rms_norm_fp8(x, w)  # noqa: E731
        formula, args = (lambda x, w: _quant_formula(F.rms_norm(x, (hidden,), w, 1e-6), "row")), (x, w)
        nbytes = x.numel() * (x.element_size() + 1)
    else:
        x = torch.randn(t, 2 * hidden * 7 // 4, device=device, dtype=dtype)
        d = x.shape[-1] // 2
        fn = lambda: ops.silu_and_mul_fp8(x)  # noqa: E731
        formula, args = (lambda x: _quant_formula(F.silu(x[..., :d]) * x[..., d:], "row")), (x,)
        nbytes = x.numel() * x.element_size() + d * t
    row = {"op": op, "tokens": t, "dtype": str(dtype).replace("torch.", "")}
    time_ops = timed(fn)
    row.update(ops_ms=time_ops * 1e3, ops_GBps=nbytes / time_ops / 1e9,
               formula_ms=timed(lambda: formula(*args)) * 1e3)
    row["vs_formula"] = row["formula_ms"] / row["ops_ms"]
    if compile_refs:
        compiled = torch.compile(formula, dynamic=False)
        compiled(*args)
        row["compiled_ms"] = timed(lambda: compiled(*args)) * 1e3
        row["vs_compiled"] = row["compiled_ms"] / row["ops_ms"]
    return row, nbytes


def _nk_list(text):
    try:
        pairs = [tuple(int(v) for v in item.lower().split("x")) for item in text.split(",") if item.strip()]
    except ValueError:
        pairs = []
    if not pairs or any(len(p) != 2 or p[0] % 16 or p[1] % 16 or min(p) <= 0 for p in pairs):
        raise argparse.ArgumentTypeError(f"expected comma-separated NxK with N and K positive multiples of 16, got {text!r}")
    return pairs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true")
    mode.add_argument("--full", action="store_true")
    parser.add_argument("--recipes", default=",".join(RECIPES), help=f"comma-separated of {', '.join(RECIPES)}")
    parser.add_argument("--tokens", type=int_list, default=None, help="comma-separated M of the GEMM rows")
    parser.add_argument("--nk", type=_nk_list, default=None,
                        help="comma-separated NxK GEMM shapes replacing the model shapes, e.g. 256x512")
    parser.add_argument("--hidden", type=int, default=4096, help="the quantization rows' hidden size")
    parser.add_argument("--fast-accum", action="store_true", help="use_fast_accum=True on both sides")
    parser.add_argument("--no-compile", action="store_true", help="no torch.compile references")
    parser.add_argument("--out", default=os.path.join(RESULTS, "local"))
    args = parser.parse_args(argv)
    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    if not recipes or any(r not in RECIPES for r in recipes):
        parser.error(f"--recipes: expected comma-separated names of {', '.join(RECIPES)}, got {args.recipes!r}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    quick = args.quick or (device == "cpu" and not args.full)
    timer = CudaTimer() if device == "cuda" else None

    def timed(fn):
        return timer(fn) if timer else cpu_time(fn)

    facts = machine_facts(device)
    if device == "cpu":
        print(f"No NVIDIA GPU here: measuring the CPU kernels ({'quick' if quick else 'full'} suite).", flush=True)
    gemm = []

    def measure_row(case):
        gemm.append(measure_gemm(*case, device, timed, args.fast_accum))
        r = gemm[-1]
        print(f"{r['case']} M={r['m']} {r['recipe']}: {r['ops_tflops']:.3g} TFLOP/s, "
              f"x{r.get('vs_torch', float('nan')):.2f} torch._scaled_mm, x{r['vs_bf16_mm']:.2f} bf16 mm", flush=True)

    # Stopped before the last case (Ctrl-C, device_check.sh's `timeout -s INT`, or an error): the GEMM rows
    # measured so far are reported and the quantization rows skipped.
    cases = [(case, recipe) for case in gemm_cases(device, quick, args.tokens, args.nk) for recipe in recipes]
    done, aborted = measure_all(cases, measure_row, "fp8 gemm")
    rows = [[r["case"], r["m"], r["n"], r["k"], r["recipe"], r["path"], f"{r['ops_ms']:.4f}", f"{r['ops_tflops']:.3g}",
             f"{r['vs_torch']:.2f}" if "vs_torch" in r else f"n/a ({r['torch_unavailable'][:60]})",
             f"{r['vs_bf16_mm']:.2f}", f"{r['ops_error']:.1e}",
             f"{r['torch_error']:.1e}" if "torch_error" in r else "-"] for r in gemm]
    table = markdown_table(["case", "M", "N", "K", "recipe", "ops path", "ops ms", "ops TFLOP/s", "torch._scaled_mm / ops",
                            "bf16 torch.mm / ops", "ops error", "torch error"], rows)
    note = (f"torch {facts['torch']}, {facts.get('gpu', facts['cpu'])}, {'quick' if quick else 'full'} suite, "
            f"use_fast_accum={args.fast_accum}; errors: max |out - float64 product| / max |float64 product| "
            "(bf16 output); ops path: ops.fp8.plan()'s (cutlass: an SM90 FP8 kernel, its name in the JSON; "
            "formula: the dequantized ATen formula). Ratios above 1: ops faster.")
    write_report(args.out, "fp8_gemm", {"benchmark": "fp8_gemm", "machine": facts, "results": gemm},
                 "FP8 scaled GEMM", note + "\n\n" + table)
    if done < len(cases):
        return 1 if aborted else 130
    quant = []
    for case in quant_cases(device, quick, args.tokens if args.nk else None):
        row, nbytes = measure_quant(case, device, timed, not args.no_compile, hidden=args.hidden)
        # A copy moving the op's bytes (half read, half written), per case: the ops move different amounts.
        row["copy_GBps"] = copy_bandwidth(nbytes // 2, timed, device)
        quant.append(row)
    rows = [[r["op"], r["tokens"], r["dtype"], f"{r['ops_ms']:.4f}", f"{r['ops_GBps']:.1f}", f"{r['copy_GBps']:.1f}",
             f"{r['vs_formula']:.2f}", f"{r['vs_compiled']:.2f}" if "vs_compiled" in r else "-"] for r in quant]
    table = markdown_table(["op", "tokens", "dtype", "ops ms", "ops GB/s", "copy GB/s", "formula / ops",
                            "torch.compile / ops"], rows)
    write_report(args.out, "fp8_quant", {"benchmark": "fp8_quant", "machine": facts, "results": quant},
                 "FP8 quantization", f"torch {facts['torch']}, {facts.get('gpu', facts['cpu'])}, hidden {args.hidden} "
                 f"(silu_and_mul: 2 x {args.hidden * 7 // 4}); ratios above 1: ops faster.\n\n" + table)
    print(f"wrote {args.out}/fp8_gemm.{{json,md}} and fp8_quant.{{json,md}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
