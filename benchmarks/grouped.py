"""Grouped GEMM: ops.grouped_gemm against torch._grouped_mm and a Python loop of torch.mm on the experts of
MoE models, forward and backward, and a MoE layer end to end against transformers' "grouped_mm" experts.

    python -m benchmarks.grouped [--quick|--full] [--models qwen3-30b-a3b,mixtral-8x7b,deepseek-v3]
                                 [--tokens 1,64,1024] [--candidates] [--fp8] [--out DIR]

Expert rows: each model's up (gate_up: N = 2 * width, K = hidden) and down (N = hidden, K = width)
projection over T tokens routed to their top-k experts, balanced (every expert gets T * k / E rows, the
remainder spread) or skewed (experts drawn with probability 1 / (rank + 1)): median time, TFLOP/s
(2 * T * k * N * K / time; backward: twice that, the input and the weight gradient), and ratios
(reference time / ops time: above 1 means ops is faster). The loop reads the group sizes on the host, as
a user's loop would. Layer rows: transformers' sparse MoE block of the model (router, experts, combine)
with its experts implementation "grouped_mm" and "ops". On CPU a quick suite of the models whose weights
fit in memory runs by default; deepseek-v3's experts (256 x 4096 x 7168 in bfloat16, 15 GB) run on a GPU.
--candidates (CUDA, where the SM90 grouped kernels run) also times each forward with every candidate kernel
of its plan (ops.grouped.plan(...)["candidates"]: unswapped and swapped, forced with ops.gemm.set_tactic),
each output first checked against the float64 product, and writes grouped_candidates.{json,md}: which kernel
wins at which rows per group (what grouped_swap_ab is fitted to). --fp8 also times each forward row in FP8,
rowwise and (where K is whole 128-blocks) blockwise: ops.scaled_grouped_gemm against torch._scaled_grouped_mm
(CUDA only, rowwise only) on the same codes and bf16 ops.grouped_gemm, written to grouped_fp8.{json,md}.
"""

import argparse
import os
import sys

import torch

import ops
from benchmarks.common import RESULTS, CudaTimer, cpu_time, fastest, first_line, int_list, machine_facts, \
    markdown_table, measure_all, output_check, sweep_tactics, wrong_results, write_report

# experts, top-k, hidden, expert width (REFERENCES.md: Qwen3-30B-A3B, Mixtral-8x7B, DeepSeek-V3).
MODELS = {"qwen3-30b-a3b": (128, 8, 2048, 768), "mixtral-8x7b": (8, 2, 4096, 14336), "deepseek-v3": (256, 8, 7168, 2048),
          "tiny": (8, 2, 64, 32)}  # tiny: for the tests; run only when named
DEFAULT_MODELS = ("qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3")
CPU_MODELS = ("qwen3-30b-a3b", "mixtral-8x7b")


def group_sizes(tokens, experts, k, routing, seed=0):
    """Rows per expert for T tokens' top-k picks (each token picks k distinct experts)."""
    if routing == "balanced":
        base, extra = divmod(tokens * k, experts)
        return torch.tensor([base + (e < extra) for e in range(experts)])
    g = torch.Generator().manual_seed(seed)
    weights = 1.0 / torch.arange(1, experts + 1, dtype=torch.float64)
    picks = torch.stack([torch.multinomial(weights, k, generator=g) for _ in range(tokens)])
    return torch.bincount(picks.reshape(-1), minlength=experts)


def loop_mm(x, w, sizes):
    """The Python loop a user writes: one torch.mm per expert with rows (the sizes read on the host), then
    one concatenation; differentiable. The experts come from one unbind (indexing w[e] in the loop would
    materialize a full-size weight gradient per expert in the backward)."""
    parts, start = [], 0
    for e, (n, we) in enumerate(zip(sizes.tolist(), w.unbind(0))):
        if n:
            parts.append(torch.mm(x[start:start + n], we))
        start += n
    return torch.cat(parts) if parts else x.new_zeros(0, w.shape[2])


_WEIGHTS = {}


def tokens_of(sizes, kdim, seed, device, dtype):
    """The routed tokens' activations (sum(sizes), kdim), drawn on the device."""
    g = torch.Generator(device).manual_seed(seed)
    return torch.randn(int(sizes.sum()), kdim, generator=g, device=device, dtype=dtype)


def expert_weights(experts, n, kdim, device, dtype):
    """(E, N, K) weights as transformers' experts hold them, passed transposed; made once per shape."""
    key = (experts, n, kdim, device, dtype)
    if key not in _WEIGHTS:
        _WEIGHTS.clear()  # one model's projection at a time: the largest are gigabytes
        # Drawn on the device: DeepSeek-V3's up projection is 3.8 G values, a minute of one CPU core.
        g = torch.Generator(device).manual_seed(n + kdim)
        _WEIGHTS[key] = torch.randn(experts, n, kdim, generator=g, device=device, dtype=dtype) / kdim ** 0.5
    return _WEIGHTS[key].transpose(1, 2)


def measure_experts(case, device, timed, dtype):
    model, proj, tokens, routing, direction = case
    experts, k, hidden, width = MODELS[model]
    n, kdim = (2 * width, hidden) if proj == "up" else (hidden, width)
    sizes = group_sizes(tokens, experts, k, routing)
    offs = sizes.cumsum(0).to(torch.int32).to(device)
    x = tokens_of(sizes, kdim, tokens, device, dtype)
    w = expert_weights(experts, n, kdim, device, dtype)
    flops = 2 * x.shape[0] * n * kdim * (2 if direction == "backward" else 1)
    plan = ops.grouped.plan(x, w, offs)  # the forward's path: the CUTLASS kernel's name, torch's or the loop
    row = {"model": model, "proj": proj, "tokens": tokens, "rows": x.shape[0], "n": n, "k": kdim,
           "routing": routing, "direction": direction, "largest_group": int(sizes.max()),
           "ops_path": plan.get("kernel") or plan["path"]}
    impls = {"ops": lambda a, b: ops.grouped_gemm(a, b, offs), "torch": lambda a, b: torch._grouped_mm(a, b, offs),
             "loop": lambda a, b: loop_mm(a, b, sizes)}
    def call_of(fn):
        if direction == "forward":
            return lambda: fn(x, w)
        xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()
        out = fn(xg, wg)
        grad = torch.randn_like(out)
        return lambda: torch.autograd.grad(out, (xg, wg), grad, retain_graph=True)

    return _timed_row(row, {name: (lambda fn=fn: call_of(fn)) for name, fn in impls.items()}, flops, timed,
                      prepared=True)


def _timed_row(row, impls, flops, timed, prepared=False):
    """row with each implementation's time and TFLOP/s (or why it is unavailable) and, against "ops", the ratios
    (its time / ops's). prepared: each entry returns the call to time (built inside the error handling)."""
    for name, fn in impls.items():
        try:
            call = fn() if prepared else fn
            call()
            t = timed(call)
            row[f"{name}_ms"], row[f"{name}_tflops"] = t * 1e3, flops / t / 1e12
        except (RuntimeError, NotImplementedError) as e:
            row[f"{name}_unavailable"] = first_line(e)
    for name in impls:
        if name != "ops" and f"{name}_ms" in row and "ops_ms" in row:
            row[f"vs_{name}"] = row[f"{name}_ms"] / row["ops_ms"]
    return row


def measure_fp8(case, device, timed, recipe="rowwise"):
    """One forward row in FP8: ops.scaled_grouped_gemm against torch._scaled_grouped_mm on the same codes and
    scales (rowwise: tokens per row, weights per expert and output channel; torch has no grouped blockwise
    recipe), and bf16 ops.grouped_gemm on the weights. Blockwise: tokens per 1x128 group, weights per 128x128
    block (DeepSeek-V3's); None where K is not whole 128-blocks."""
    model, proj, tokens, routing = case
    experts, k, hidden, width = MODELS[model]
    n, kdim = (2 * width, hidden) if proj == "up" else (hidden, width)
    if recipe == "blockwise" and kdim % 128:
        return None
    sizes = group_sizes(tokens, experts, k, routing)
    offs = sizes.cumsum(0).to(torch.int32).to(device)
    x = tokens_of(sizes, kdim, tokens, device, torch.bfloat16)
    w = expert_weights(experts, n, kdim, device, torch.bfloat16)  # (E, K, N), a view of (E, N, K)
    if recipe == "rowwise":
        xq, xs = ops.quantize_fp8(x, "row")
        xs = xs.reshape(-1)
        ws = w.abs().amax(1).float().clamp(min=1e-12) / 448  # (E, N)
        # One expert at a time: a float32 copy of DeepSeek-V3's up projection would be 28 GiB.
        wq = torch.stack([(w[e].float() / ws[e]).to(torch.float8_e4m3fn).t().contiguous() for e in range(experts)])
        wq = wq.transpose(1, 2)  # (E, K, N), K-major
    else:
        xq, xs = ops.quantize_fp8(x, "group")  # (M, K/128)
        codes, scale_inv = zip(*(ops.quantize_fp8(w[e].t(), "block") for e in range(experts)))
        wq, ws = torch.stack(codes).transpose(1, 2), torch.stack(scale_inv).transpose(1, 2)  # (E, K, N), (E, K/128, N/128)
    flops = 2 * x.shape[0] * n * kdim
    row = {"model": model, "proj": proj, "tokens": tokens, "rows": x.shape[0], "n": n, "k": kdim, "routing": routing,
           "recipe": recipe, "ops_path": ops.fp8.grouped_plan(xq, wq, xs, ws, offs)["path"]}
    impls = {"ops": lambda: ops.scaled_grouped_gemm(xq, wq, xs, ws, offs),
             "bf16": lambda: ops.grouped_gemm(x, w, offs)}
    if recipe == "rowwise":
        impls["torch"] = lambda: torch._scaled_grouped_mm(xq, wq, xs, ws, offs=offs, out_dtype=torch.bfloat16)
    else:
        row["torch_unavailable"] = "torch._scaled_grouped_mm has no 128x128 blockwise recipe"
    return _timed_row(row, impls, flops, timed)


def sweep_candidates(case, device, timed, dtype):
    """Every candidate kernel of one forward row's plan, timed (None on CPU or where the plan has one)."""
    model, proj, tokens, routing, _ = case
    experts, k, hidden, width = MODELS[model]
    n, kdim = (2 * width, hidden) if proj == "up" else (hidden, width)
    sizes = group_sizes(tokens, experts, k, routing)
    offs = sizes.cumsum(0).to(torch.int32).to(device)
    x = tokens_of(sizes, kdim, tokens, device, dtype)
    w = expert_weights(experts, n, kdim, device, dtype)
    names = ops.grouped.plan(x, w, offs).get("candidates", [])
    if len(names) < 2:
        return None
    reference = ops.grouped_gemm(x.double(), w.double(), offs)
    times, problems = sweep_tactics(lambda: ops.grouped_gemm(x, w, offs), names, timed, output_check(reference, dtype))
    return {"model": model, "proj": proj, "tokens": tokens, "routing": routing, "rows_per_group": x.shape[0] / experts,
            "heuristic": ops.grouped.plan(x, w, offs)["kernel"], "best": fastest(times),
            "times_ms": {name: t * 1e3 if t else None for name, t in times.items()},
            "wrong_results": wrong_results(problems), "problems": problems}


def measure_layer(model, tokens, device, timed, dtype):
    """transformers' Qwen3-MoE sparse block at `model`'s sizes (qwen3-30b-a3b, tiny), experts "grouped_mm" vs "ops"."""
    import transformers

    experts, k, hidden, width = MODELS[model]
    if model not in ("qwen3-30b-a3b", "tiny"):
        return None
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    config = transformers.Qwen3MoeConfig(hidden_size=hidden, moe_intermediate_size=width, num_experts=experts,
                                         num_experts_per_tok=k)
    torch.manual_seed(0)
    block = Qwen3MoeSparseMoeBlock(config).to(device=device, dtype=dtype).eval()
    torch.nn.init.normal_(block.experts.gate_up_proj, std=hidden ** -0.5)
    torch.nn.init.normal_(block.experts.down_proj, std=width ** -0.5)
    x = torch.randn(1, tokens, hidden, device=device, dtype=dtype)
    ops.moe.register()
    row = {"model": model, "tokens": tokens}
    results = {}
    for name in ("grouped_mm", "ops"):
        config._experts_implementation = name
        with torch.no_grad():
            results[name] = block(x)
            row[f"{name}_ms"] = timed(lambda: block(x)) * 1e3
    row["vs_grouped_mm"] = row["grouped_mm_ms"] / row["ops_ms"]
    row["max_diff"] = (results["ops"].float() - results["grouped_mm"].float()).abs().max().item()
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true")
    mode.add_argument("--full", action="store_true")
    parser.add_argument("--models", default=None, help=f"comma-separated of {', '.join(MODELS)}")
    parser.add_argument("--tokens", type=int_list, default=None, help="comma-separated token counts")
    parser.add_argument("--candidates", action="store_true", help="also time every candidate kernel (CUDA)")
    parser.add_argument("--fp8", action="store_true", help="also the forward rows in FP8 (rowwise, blockwise): "
                        "ops.scaled_grouped_gemm vs torch._scaled_grouped_mm (rowwise) and bf16 grouped_gemm")
    parser.add_argument("--out", default=os.path.join(RESULTS, "local"))
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    quick = args.quick or (device == "cpu" and not args.full)
    models = [m.strip() for m in args.models.split(",")] if args.models else list(
        CPU_MODELS if device == "cpu" else DEFAULT_MODELS)
    if any(m not in MODELS for m in models):
        parser.error(f"--models: expected comma-separated names of {', '.join(MODELS)}, got {args.models!r}")
    if args.tokens:
        tokens = {m: args.tokens for m in models}
    elif device == "cpu":
        tokens = {m: ([1, 16, 128] if m == "qwen3-30b-a3b" else [1, 16]) if quick else [1, 16, 128, 512]
                  for m in models}
    else:
        tokens = {m: [1, 64, 1024, 8192] if quick else [1, 16, 64, 256, 1024, 4096, 8192] for m in models}
    timer = CudaTimer() if device == "cuda" else None

    def timed(fn):
        return timer(fn) if timer else cpu_time(fn)

    facts = machine_facts(device)
    dtype = torch.bfloat16
    if device == "cpu":
        print(f"No NVIDIA GPU here: measuring the CPU kernels ({'quick' if quick else 'full'} suite).", flush=True)
    # Why a section ended before its last case (interrupted: Ctrl-C or device_check.sh's `timeout -s INT`; or the
    # error that stopped it): its rows are reported and the sections after it skipped.
    stopped = []

    def measure_each(cases, measure, desc):
        """measure(case) for each case (measure_all), unless a section before it stopped."""
        if not stopped:
            done, aborted = measure_all(cases, measure, desc)
            if done < len(cases):
                stopped.append(aborted or "interrupted")

    rows = []

    def measure_row(case):
        r = measure_experts(case, device, timed, dtype)
        rows.append(r)
        model, proj, t, routing, direction = case
        print(f"{model} {proj} T={t} {routing} {direction}: {r.get('ops_tflops', float('nan')):.3g} TFLOP/s, "
              f"x{r.get('vs_torch', float('nan')):.2f} torch._grouped_mm, x{r.get('vs_loop', float('nan')):.2f} loop",
              flush=True)

    # (model, projection, tokens, routing) of every row
    shapes = [(m, p, t, r) for m in models for p in ("up", "down") for t in tokens[m] for r in ("balanced", "skewed")]
    measure_each([(*s, d) for s in shapes for d in ("forward", "backward")], measure_row, "grouped")

    def ratio(r, name):
        return f"{r[f'vs_{name}']:.2f}" if f"vs_{name}" in r else f"n/a ({r.get(f'{name}_unavailable', '')[:50]})"

    table = markdown_table(
        ["model", "proj", "tokens", "rows", "N", "K", "routing", "largest group", "pass", "ops ms", "ops TFLOP/s",
         "torch._grouped_mm / ops", "loop of mm / ops", "ops path"],
        [[r["model"], r["proj"], r["tokens"], r["rows"], r["n"], r["k"], r["routing"], r["largest_group"],
          r["direction"], f"{r['ops_ms']:.3f}", f"{r['ops_tflops']:.3g}", ratio(r, "torch"), ratio(r, "loop"),
          r["ops_path"]] for r in rows])
    note = (f"torch {facts['torch']}, {facts.get('gpu', facts['cpu'])}, bfloat16, {'quick' if quick else 'full'} "
            "suite. Ratios above 1: ops faster.")
    _WEIGHTS.clear()
    layers, no_layers = [], []

    def measure_layer_row(case):
        if no_layers:
            return
        try:
            r = measure_layer(*case, device, timed, dtype)
        except ImportError as e:
            no_layers.append(e)
            print(f"no layer rows: {first_line(e)}", flush=True)
            return
        if r is not None:
            layers.append(r)
            print(f"{case[0]} layer T={case[1]}: x{r['vs_grouped_mm']:.2f} transformers grouped_mm", flush=True)

    measure_each([(m, t) for m in models for t in tokens[m]], measure_layer_row, "MoE layers")
    if layers:
        table += "\n\nMoE layer (transformers' Qwen3MoeSparseMoeBlock, forward, no grad):\n\n" + markdown_table(
            ["model", "tokens", "grouped_mm ms", "ops ms", "grouped_mm / ops", "max |ops - grouped_mm|"],
            [[r["model"], r["tokens"], f"{r['grouped_mm_ms']:.3f}", f"{r['ops_ms']:.3f}", f"{r['vs_grouped_mm']:.2f}",
              f"{r['max_diff']:.2e}"] for r in layers])
    write_report(args.out, "grouped_gemm", {"benchmark": "grouped_gemm", "machine": facts, "results": rows,
                                            "layers": layers}, "Grouped GEMM", note + "\n\n" + table)
    print(f"wrote {args.out}/grouped_gemm.{{json,md}}")
    if args.fp8 and not stopped:
        fp8_rows = []

        def measure_fp8_row(case):
            r = measure_fp8(case[:4], device, timed, case[4])
            if r is not None:
                fp8_rows.append(r)

        measure_each([(*s, recipe) for s in shapes for recipe in ("rowwise", "blockwise")], measure_fp8_row, "FP8")
        table = markdown_table(
            ["model", "proj", "tokens", "rows", "N", "K", "routing", "recipe", "ops ms", "ops TFLOP/s",
             "torch._scaled_grouped_mm / ops", "bf16 grouped_gemm / ops", "ops path"],
            [[r["model"], r["proj"], r["tokens"], r["rows"], r["n"], r["k"], r["routing"], r["recipe"],
              f"{r['ops_ms']:.3f}", f"{r['ops_tflops']:.3g}", ratio(r, "torch"), ratio(r, "bf16"), r["ops_path"]]
             for r in fp8_rows])
        write_report(args.out, "grouped_fp8", {"benchmark": "grouped_fp8", "machine": facts, "results": fp8_rows},
                     "FP8 grouped GEMM (rowwise and blockwise), forward",
                     note.replace("bfloat16", "e4m3 in, bfloat16 out") + "\n\n" + table)
        print(f"wrote {args.out}/grouped_fp8.{{json,md}}")
        _WEIGHTS.clear()
    if args.candidates and not stopped:
        sweeps = [r for r in (sweep_candidates((*shape, "forward"), device, timed, dtype) for shape in shapes)
                  if r is not None]
        if not sweeps:
            print("--candidates: no call here has more than one candidate kernel (the SM90 grouped kernels run on "
                  "sm_90a in a build with OPS_CANDIDATE_KERNELS=1)", flush=True)
            return 0
        names = sorted({name for r in sweeps for name in r["times_ms"]})
        table = markdown_table(
            ["model", "proj", "tokens", "routing", "rows / group", *names, "best", "heuristic / best", "wrong"],
            [[r["model"], r["proj"], r["tokens"], r["routing"], f"{r['rows_per_group']:.1f}",
              *[f"{r['times_ms'][n]:.3f}" if r["times_ms"].get(n) else "-" for n in names], r["best"] or "-",
              f"{r['times_ms'][r['heuristic']] / r['times_ms'][r['best']]:.2f}"
              if r["best"] and r["times_ms"].get(r["heuristic"]) else "-", ", ".join(r["wrong_results"]) or "-"]
             for r in sweeps])
        write_report(args.out, "grouped_candidates", {"benchmark": "grouped_candidates", "machine": facts,
                                                      "results": sweeps}, "Grouped GEMM candidate kernels",
                     note + " Forward, ms per call.\n\n" + table)
        print(f"wrote {args.out}/grouped_candidates.{{json,md}}")
    return 0 if not stopped else 130 if stopped[0] == "interrupted" else 1


if __name__ == "__main__":
    sys.exit(main())
