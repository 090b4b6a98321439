"""The main job: ops.cutlass_gemm against torch.mm, measured in the same run.

    python -m benchmarks.gemm [--dtypes bf16,fp16,fp32,tf32,fp64] [--suite all|models|square]
                              [--quick | --full] [--out DIR]

For each dtype and shape: median time of warmed-up runs (CUDA events, L2 flushed; on CPU
torch.utils.benchmark), TFLOP/s (2*M*N*K / time), the speed ratio ops / torch.mm, and each side's max
relative error against a float64 reference (max |C - C_ref| / max |C_ref|).

Shapes: the GEMMs of all-MiniLM-L6-v2 (hidden 384, intermediate 1536) and of Llama-3-8B projections
(4096x4096, 4096x1024, 4096x14336, 14336x4096) at 1, 16, 128, 1024 and 4096 tokens, as x @ W^T with W
an nn.Linear weight (N, K), so B is a column-major view as in a real model; plus a square sweep
256..8192. Results go to a table on the terminal and to JSON, markdown and a PNG plot in --out.

Without a GPU it runs the same suite (quick by default) on the CPU kernels, which use ATen's BLAS: the
CUTLASS kernels need an NVIDIA GPU (sm80 or newer).
"""

import argparse
import math
import os
import sys
import time

import torch
from tqdm import tqdm

import ops
from benchmarks.common import RESULTS, CudaTimer, cpu_time, machine_facts, markdown_table, write_json

TOKENS = [1, 16, 128, 1024, 4096]
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


def max_rel_error(c, ref):
    return ((c.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def run(args):
    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    quick = args.quick or (device == "cpu" and not args.full)
    if device == "cpu":
        print("No NVIDIA GPU here: the CUTLASS kernels need an NVIDIA GPU (sm80 or newer). On CPU "
              "ops.cutlass_gemm runs ATen's BLAS, so this run compares two CPU BLAS calls "
              f"({'quick' if quick else 'full'} suite).", flush=True)
    timer = CudaTimer() if device == "cuda" else None
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if not dtypes:
        sys.exit(f"--dtypes is empty; choose from {', '.join(DTYPES)}")
    for d in dtypes:
        if d not in DTYPES:
            sys.exit(f"unknown dtype {d!r}; choose from {', '.join(DTYPES)}")
    cases = [(d, *s) for d in dtypes for s in shapes(args.suite, quick, device)]
    results = []
    saved_precision = torch.get_float32_matmul_precision()
    gen = torch.Generator(device=device).manual_seed(0)
    bar = tqdm(cases, desc="gemm", unit="shape", file=sys.stderr, dynamic_ncols=True)
    for dname, name, M, N, K, b_layout in bar:
        bar.set_postfix_str(f"{dname} {name}")
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
        del ref, ours, theirs
        if device == "cuda":
            t_ours = timer(lambda: ops.cutlass_gemm(A, B))
            t_torch = timer(lambda: torch.mm(A, B))
        else:
            t_ours = cpu_time(lambda: ops.cutlass_gemm(A, B))
            t_torch = cpu_time(lambda: torch.mm(A, B))
        flops = 2.0 * M * N * K
        results.append({
            "dtype": dname, "shape": name, "M": M, "N": N, "K": K,
            "ops_ms": t_ours * 1e3, "torch_ms": t_torch * 1e3,
            "ops_tflops": flops / t_ours / 1e12, "torch_tflops": flops / t_torch / 1e12,
            "ratio": t_torch / t_ours,
            "ops_max_rel_err": err_ours, "torch_max_rel_err": err_torch,
        })
    torch.set_float32_matmul_precision(saved_precision)
    return device, quick, results


def geomean(values):
    values = [v for v in values if v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def report(device, quick, results, out_dir):
    headers = ["dtype", "shape", "M", "N", "K", "ops ms", "torch.mm ms", "ops TFLOP/s",
               "torch.mm TFLOP/s", "ratio", "ops err", "torch.mm err"]
    rows = [[r["dtype"], r["shape"], r["M"], r["N"], r["K"], f"{r['ops_ms']:.4f}", f"{r['torch_ms']:.4f}",
             f"{r['ops_tflops']:.2f}", f"{r['torch_tflops']:.2f}", f"{r['ratio']:.3f}",
             f"{r['ops_max_rel_err']:.2e}", f"{r['torch_max_rel_err']:.2e}"] for r in results]
    facts = machine_facts(device)
    summary = {}
    for d in sorted({r["dtype"] for r in results}):
        ratios = [r["ratio"] for r in results if r["dtype"] == d]
        summary[d] = {"geomean_ratio": geomean(ratios), "min_ratio": min(ratios)}
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
    payload = {"benchmark": "gemm", "device": device, "quick": quick, "machine": facts,
               "build": {k: v for k, v in vars(ops.build_info).items() if k.isupper()},
               "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "summary": summary, "results": results}
    write_json(os.path.join(out_dir, "gemm.json"), payload)
    where = facts.get("gpu", f"CPU ({facts['cpu']}, {facts['cpu_threads']} threads)")
    with open(os.path.join(out_dir, "gemm.md"), "w") as f:
        f.write(f"# ops.cutlass_gemm vs torch.mm on {where}\n\n")
        f.write(f"torch {facts['torch']}, CUDA {facts['cuda']}, driver {facts.get('driver', '-')}; "
                f"{'quick' if quick else 'full'} suite; ratio = torch.mm time / ops time (>1: ops faster); "
                "err = max |C - C_fp64| / max |C_fp64|.\n\n")
        f.write(table + "\n\n")
        for d, s in summary.items():
            f.write(f"- {d}: geometric-mean ratio {s['geomean_ratio']:.3f}, lowest {s['min_ratio']:.3f}\n")
    plot(results, where, os.path.join(out_dir, "gemm.png"))
    print(f"\nwrote {out_dir}/gemm.json, gemm.md, gemm.png")


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
    parser.add_argument("--suite", choices=["all", "models", "square"], default="all")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="fewer token counts and sizes")
    mode.add_argument("--full", action="store_true", help="the full suite even on CPU (slow)")
    parser.add_argument("--cpu", action="store_true", help="run on CPU even if a GPU is present")
    parser.add_argument("--out", default=None, help=f"results folder (default {RESULTS}/local)")
    args = parser.parse_args(argv)
    gpu = torch.cuda.is_available() and not args.cpu
    if args.dtypes is None:
        args.dtypes = "bf16,fp16,fp32,tf32" if gpu else "fp32,bf16"
    device, quick, results = run(args)
    report(device, quick, results, args.out or os.path.join(RESULTS, "local"))


if __name__ == "__main__":
    main()
