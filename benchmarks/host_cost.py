"""Host cost per call of ops' public GEMM functions beside torch's own ops, on CPU.

    python -m benchmarks.host_cost [--rounds N] [--min-run-time S] [--out FILE]

Every problem is tiny (16x16x16 float32 for cutlass_gemm, e4m3 16x16 @ 16x16 for scaled_gemm, four groups of
8x16 @ 16x16 bfloat16 for grouped_gemm, 16x16 for linear) and runs on one thread (torch.set_num_threads(1)), so
a call's time is its host cost: the Python wrapper, the binding, the dispatcher, the checks, a small kernel.
Each call is a torch.utils.benchmark statement (Timer.blocked_autorange: no function wraps it), all of them
interleaved in --rounds rounds; a row's time is its fastest round's median.

Per function the rows are: the public function (``ops.cutlass_gemm``); torch's own op called through its
resolved overload (``torch.ops.aten.mm.default``), the way every torch.library op is called from Python and
the reference of the "x overload" column; torch's generated binding (``torch.mm``), which no torch.library op
can use; ops' op through its resolved overload (``torch.ops.ops.cutlass_gemm.default``: the C++ op and the
dispatcher alone, so that row against torch's overload row is the C++ side's share) and through its overload
packet (``torch.ops.ops.cutlass_gemm``, which matches the arguments against each overload's schema at every
call). ``ops.linear`` is compared with ``F.relu(F.linear(...))`` and the same two ops through their
overloads. ``torch._grouped_mm`` has no out variant: ``ops.grouped_gemm(..., out=)`` is compared with its
functional overload.

On CPU ops.cutlass_gemm runs ATen's mm, the kernel torch.mm runs, and the other three run torch's own CPU
formulas (bit for bit): every row of a function computes the same values, which is checked before timing.
The JSON (--out) holds each row's rounds, IQR and CPU wait (benchmarks.common.cpu_wait: BUSY above 0.1, when
another process held the cores), and per public function its ratio to torch's overload against GOAL.
"""

import argparse
import os
import time

import torch
import torch.nn.functional as F
from torch.utils.benchmark import Timer

import ops
from benchmarks.common import BUSY, NOISE, RESULTS, cpu_wait, machine_facts, markdown_table, write_json

GOAL = 1.2  # a public function's time at most this multiple of torch's own op through its resolved overload


def _cpu_scaled_mm_takes(A8, B8, sa, sb) -> bool:
    """Whether torch._scaled_mm on CPU takes these scales (torch 2.11: "only supports per-tensor scaling")."""
    try:
        torch._scaled_mm(A8, B8, sa, sb, out_dtype=torch.bfloat16)
        return True
    except RuntimeError as e:
        if "only supports per-tensor scaling" not in str(e):
            raise
        return False


def inputs():
    """The tensors the statements name, from a seeded generator."""
    g = torch.Generator().manual_seed(0)
    A, B = torch.randn(16, 16, generator=g), torch.randn(16, 16, generator=g)
    # scaled_gemm: rowwise recipe (tensorwise where this torch's CPU _scaled_mm takes no other: 2.11), B
    # column-major (an nn.Linear weight (N, K) transposed), bfloat16 out.
    A8 = (torch.randn(16, 16, generator=g) * 8).to(torch.float8_e4m3fn)
    B8 = (torch.randn(16, 16, generator=g) * 8).to(torch.float8_e4m3fn).t()
    sa, sb = torch.rand(16, 1, generator=g) + 0.5, torch.rand(1, 16, generator=g) + 0.5
    if not _cpu_scaled_mm_takes(A8, B8, sa, sb):
        sa, sb = sa[:1, :1].reshape(()), sb[:1, :1].reshape(())
    # grouped_gemm: 2D x 3D (the MoE forward), 4 groups of 8 rows.
    X = torch.randn(32, 16, generator=g).to(torch.bfloat16)
    W = torch.randn(4, 16, 16, generator=g).to(torch.bfloat16)
    return {"A": A, "B": B, "o": torch.empty(16, 16),
            "A8": A8, "B8": B8, "sa": sa, "sb": sb,
            "o8": torch.empty(16, 16, dtype=torch.bfloat16),
            "X": X, "W": W, "offs": torch.tensor([8, 16, 24, 32], dtype=torch.int32),
            "og": torch.empty(32, 16, dtype=torch.bfloat16),
            "x": torch.randn(16, 16, generator=g), "w": torch.randn(16, 16, generator=g),
            "b": torch.randn(16, generator=g)}


_S = "A8, B8, sa, sb, out_dtype=torch.bfloat16"  # scaled_gemm's arguments, as torch._scaled_mm takes them

# (function, out buffer or None, [(role, statement)]). Roles: "ops" the public function, "overload" torch's
# op through its resolved overload (the ratios' reference), "binding" torch's generated binding or formula,
# "op" / "packet" ops' op through its resolved overload / its overload packet.
GROUPS = [
    ("cutlass_gemm", None, [
        ("ops", "ops.cutlass_gemm(A, B)"),
        ("overload", "torch.ops.aten.mm.default(A, B)"),
        ("binding", "torch.mm(A, B)"),
        ("op", "torch.ops.ops.cutlass_gemm.default(A, B)"),
        ("packet", "torch.ops.ops.cutlass_gemm(A, B)")]),
    ("cutlass_gemm out=", "o", [
        ("ops", "ops.cutlass_gemm(A, B, out=o)"),
        ("overload", "torch.ops.aten.mm.out(A, B, out=o)"),
        ("binding", "torch.mm(A, B, out=o)"),
        ("op", "torch.ops.ops.cutlass_gemm.out(A, B, out=o)"),
        ("packet", "torch.ops.ops.cutlass_gemm(A, B, out=o)")]),
    ("scaled_gemm", None, [
        ("ops", f"ops.scaled_gemm({_S})"),
        ("overload", f"torch.ops.aten._scaled_mm.default({_S})"),
        ("binding", f"torch._scaled_mm({_S})"),
        ("op", f"torch.ops.ops.scaled_gemm.default({_S})"),
        ("packet", f"torch.ops.ops.scaled_gemm({_S})")]),
    ("scaled_gemm out=", "o8", [
        ("ops", f"ops.scaled_gemm({_S}, out=o8)"),
        ("overload", f"torch.ops.aten._scaled_mm.out({_S}, out=o8)"),
        ("binding", f"torch._scaled_mm({_S}, out=o8)"),
        ("op", f"torch.ops.ops.scaled_gemm.out({_S}, out=o8)"),
        ("packet", f"torch.ops.ops.scaled_gemm({_S}, out=o8)")]),
    ("grouped_gemm", None, [
        ("ops", "ops.grouped_gemm(X, W, offs)"),
        ("overload", "torch.ops.aten._grouped_mm.default(X, W, offs)"),
        ("binding", "torch._grouped_mm(X, W, offs)"),
        ("op", "torch.ops.ops.grouped_gemm.default(X, W, offs)"),
        ("packet", "torch.ops.ops.grouped_gemm(X, W, offs)")]),
    ("grouped_gemm out=", "og", [  # torch._grouped_mm has no out variant: its functional overload is the reference
        ("ops", "ops.grouped_gemm(X, W, offs, out=og)"),
        ("overload", "torch.ops.aten._grouped_mm.default(X, W, offs)"),
        ("op", "torch.ops.ops.grouped_gemm.out(X, W, offs, out=og)"),
        ("packet", "torch.ops.ops.grouped_gemm(X, W, offs, out=og)")]),
    ("linear relu", None, [
        ("ops", 'ops.linear(x, w, b, "relu")'),
        ("overload", "torch.ops.aten.relu.default(torch.ops.aten.linear.default(x, w, b))"),
        ("binding", "F.relu(F.linear(x, w, b))"),
        ("op", 'torch.ops.ops.linear.default(x, w, b, "relu")'),
        ("packet", 'torch.ops.ops.linear(x, w, b, "relu")')]),
]


def check_agreement(env):
    """Runs every statement once: each row of a function must compute its reference row's values exactly
    (the same CPU kernels), so that the timings compare calls, not computations."""
    for name, out, rows in GROUPS:
        values = []
        for _, stmt in rows:
            writes = out is not None and f"out={out}" in stmt
            if writes:
                env[out].fill_(float("nan"))
            value = eval(stmt, env)
            values.append((stmt, env[out].clone() if writes else value))
        reference = values[[role for role, _ in rows].index("overload")][1]
        for stmt, value in values:
            if not torch.equal(value, reference):
                raise RuntimeError(f"benchmarks.host_cost: {stmt} computes other values than the reference of "
                                   f"{name} (max difference {(value.float() - reference.float()).abs().max()})")


def measure(statements, env, rounds, min_run_time):
    """{statement: {"rounds": [median s], "iqr": [IQR / median], "wait": [cpu_wait]}}, interleaved."""
    runs = {stmt: {"rounds": [], "iqr": [], "wait": []} for stmt in statements}
    for _ in range(rounds):
        for stmt in statements:
            m, wait = cpu_wait(lambda: Timer(stmt, globals=env, num_threads=1).blocked_autorange(
                min_run_time=min_run_time))
            runs[stmt]["rounds"].append(m.median)
            runs[stmt]["iqr"].append(m.iqr / m.median)
            runs[stmt]["wait"].append(wait)
    return runs


def report(runs):
    """(table rows, JSON rows, public functions' ratios to torch's overloads)."""
    table, records, goals = [], [], {}
    for name, _, rows in GROUPS:
        stmts = dict((role, stmt) for role, stmt in rows)
        ref = min(runs[stmts["overload"]]["rounds"])
        for role, stmt in rows:
            r = runs[stmt]
            best = min(r["rounds"])
            i = r["rounds"].index(best)
            spread = max(r["iqr"] + [(max(r["rounds"]) - best) / best])
            wait = r["wait"][i]
            busy = wait is not None and wait > BUSY
            ratio = best / ref
            verdict = ""
            if role == "ops":
                goals[name] = ratio
                verdict = "ok" if ratio <= GOAL else f"over {GOAL}x"
            noise = ("BUSY" if busy else "NOISY" if spread > NOISE else "")
            table.append([name, role, f"`{stmt}`", f"{best * 1e6:.2f}", f"{ratio:.2f}", verdict,
                          f"{spread:.0%}", "-" if wait is None else f"{wait:.2f}", noise])
            records.append({"function": name, "role": role, "statement": stmt, "us": best * 1e6,
                            "x_overload": ratio, "rounds_us": [t * 1e6 for t in r["rounds"]],
                            "iqr_over_median": r["iqr"], "cpu_wait": r["wait"], "spread": spread,
                            "noisy": busy or spread > NOISE})
    return table, records, goals


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; a row's time is its fastest")
    parser.add_argument("--min-run-time", type=float, default=0.2, help="seconds per measurement (blocked_autorange)")
    parser.add_argument("--out", default=os.path.join(RESULTS, "local", "host_cost.json"), help="JSON file to write")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.min_run_time <= 0:
        parser.error(f"expected --rounds >= 1 and --min-run-time > 0, got {args.rounds} and {args.min_run_time}")
    torch.set_num_threads(1)
    # torch._scaled_mm's emulated CPU path, the formula ops' CPU kernel computes: where the CPU has AMX-INT8,
    # torch 2.14 sends FP8 to oneDNN, which scales after accumulating (other last bits).
    mkldnn = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        env = {"ops": ops, "torch": torch, "F": F, **inputs()}
        check_agreement(env)
        statements = list(dict.fromkeys(stmt for _, _, rows in GROUPS for _, stmt in rows))
        runs = measure(statements, env, args.rounds, args.min_run_time)
    finally:
        torch.backends.mkldnn.enabled = mkldnn
    table, records, goals = report(runs)
    headers = ["function", "role", "call", "us", "x overload", f"goal {GOAL}x", "spread", "CPU wait", "noise"]
    print(markdown_table(headers, table))
    worst = max(goals, key=goals.get)
    print(f"\nworst public function: {worst}, {goals[worst]:.2f}x torch's op through its resolved overload "
          f"(goal {GOAL}x)")
    write_json(args.out, {"benchmark": "host_cost", "machine": machine_facts("cpu"),
                          "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "rounds": args.rounds,
                          "min_run_time": args.min_run_time, "goal": GOAL,
                          "scaled_gemm scales": "rowwise" if env["sa"].dim() else "tensorwise",
                          "x_overload": goals, "rows": records})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
