"""Multi-threaded stress test of the ops library on CPU (no GPU needed).

8 Python threads call every op many times on their own inputs (and on weights shared by all threads),
while a controller thread flips the process-wide GEMM tactic controls (autotune on/off, tuning-cache
entries added / cleared / read) that the emulated CUDA host path (ops._library.gemm_emulate: planner,
thread-local plan cache, tactic selection, copies, padding, copy-back) consults on every call. Every
result is compared with one computed single-threaded beforehand.

torch.ops calls release the GIL, so the C++ host code really runs concurrently; at::parallel_for runs
the fused CPU kernels on the intra-op pool as well.

Run from the repository root:  python tests/thread_stress.py [--seconds 30] [--threads 8]
Exit status 0: no mismatch, no unexpected exception. tests/test_threads.py runs it for 10 s.
"""

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
import ops  # noqa: E402

HOPPER = (9, 0, "8.0;9.0a")
SMS = 132
ACTS = ("none", "relu", "gelu", "gelu_tanh", "silu")


def tol(dtype):
    return {torch.float64: (1e-10, 1e-10), torch.float32: (2e-5, 2e-5),
            torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}[dtype]


def close(a, b):
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    rtol, atol = tol(a.dtype)
    return torch.allclose(a.double(), b.double(), rtol=rtol, atol=atol, equal_nan=False)


def make_cases(seed, shared):
    """A list of (name, fn) where fn() returns a tuple of tensors; inputs are created here once."""
    g = torch.Generator().manual_seed(seed)
    rnd = random.Random(seed)
    cases = []

    def randn(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)

    for i in range(6):
        dtype = rnd.choice([torch.float32, torch.float64, torch.bfloat16])
        M, K, N = rnd.randint(1, 48), rnd.randint(1, 48), rnd.randint(1, 48)
        A, B = randn(M, K, dtype=dtype), randn(K, N, dtype=dtype)
        layout = rnd.choice(["row", "col", "strided"])

        def gemm_out(A=A, B=B, layout=layout, M=M, N=N):
            if layout == "row":
                out = torch.full((M, N), float("nan"), dtype=A.dtype)
            elif layout == "col":
                out = torch.full((N, M), float("nan"), dtype=A.dtype).t()
            else:
                out = torch.full((M, 2 * N), float("nan"), dtype=A.dtype)[:, ::2]
            ops.cutlass_gemm(A, B, out=out)
            return (out.clone(), ops.cutlass_gemm(A, B))
        cases.append((f"gemm{i}", gemm_out))

    for i in range(4):
        dtype = rnd.choice([torch.float32, torch.float64])
        act = ACTS[i % len(ACTS)] if i < 4 else rnd.choice(ACTS)
        W, b = shared["W"].to(dtype), shared["b"].to(dtype)
        x = randn(rnd.randint(1, 5), rnd.randint(1, 9), W.shape[1], dtype=dtype)

        def lin(x=x, W=W, b=b, act=act):
            xr = x.clone().requires_grad_()
            Wr = W.clone().requires_grad_()
            br = b.clone().requires_grad_()
            y = ops.linear(xr, Wr, br, act)
            gx, gW, gb = torch.autograd.grad((y * y).sum(), (xr, Wr, br))
            return (y.detach(), gx, gW, gb)
        cases.append((f"linear_{act}{i}", lin))

    for i in range(3):
        dtype = rnd.choice([torch.float32, torch.float64, torch.bfloat16])
        d = rnd.choice([8, 64, 200])
        rows = rnd.choice([3, 700, 1500])  # enough rows for several at::parallel_for tasks
        x = randn(rows, d, dtype=dtype)
        w = shared["norm_w"][:d].to(dtype)

        def rms(x=x, w=w):
            xr = x.clone().requires_grad_(x.dtype != torch.bfloat16)
            y = ops.rms_norm(xr, w, 1e-6)
            if xr.requires_grad:
                (gx,) = torch.autograd.grad(y.sum(), (xr,))
                return (y.detach(), gx)
            return (y,)
        cases.append((f"rms_norm{i}", rms))

        res0 = randn(rows, d, dtype=dtype)

        def fadd(x=x, res0=res0, w=w):
            inp, res = x.clone(), res0.clone()
            if rnd.random() < 0.3:  # non-contiguous: the copy-in / copy-back path
                inp = inp.t().contiguous().t()
            with torch.no_grad():
                ops.fused_add_rms_norm(inp, res, w, 1e-5)
            return (inp.contiguous(), res)
        cases.append((f"fused_add{i}", fadd))

        x2 = randn(rows, 2 * d, dtype=dtype)

        def silu(x2=x2):
            xr = x2.clone().requires_grad_(x2.dtype != torch.bfloat16)
            y = ops.silu_and_mul(xr)
            if xr.requires_grad:
                (gx,) = torch.autograd.grad((y * 3).sum(), (xr,))
                return (y.detach(), gx)
            return (y,)
        cases.append((f"silu{i}", silu))

    # The CUDA wrapper's host path on CPU (planner + plan cache + tactic selection + copies).
    for i in range(8):
        dtype = rnd.choice([torch.bfloat16, torch.float16, torch.float32])
        M, K, N = rnd.randint(1, 300), rnd.choice([7, 8, 16, 64, 136]), rnd.choice([5, 8, 24, 264])
        A = randn(M, K, dtype=dtype)
        B = randn(N, K, dtype=dtype).t() if rnd.random() < 0.6 else randn(K, N, dtype=dtype)
        if rnd.random() < 0.3:  # misaligned address: copy path
            buf = randn(M * K + 1, dtype=dtype)
            A = buf[1:].view(M, K)
        allow_tf32 = dtype == torch.float32 and rnd.random() < 0.5

        def emu(A=A, B=B, allow_tf32=allow_tf32):
            out = torch.full((A.shape[0], B.shape[1]), float("nan"), dtype=A.dtype)
            plan = ops._library.gemm_emulate(A, B, out, *HOPPER, allow_tf32, True, None, "plain", SMS)
            name = plan["tactic"]["name"]
            if plan["kernel"] != "aten" and name not in plan["candidates"]:
                raise AssertionError(f"tactic {name} not among candidates {plan['candidates']}")
            return (out,)
        cases.append((f"emulate{i}", emu))

    for i in range(3):
        act = rnd.choice(ACTS[1:])
        dtype = rnd.choice([torch.bfloat16, torch.float16])
        x = randn(rnd.randint(1, 40), 64, dtype=dtype)
        w = randn(rnd.choice([8, 24, 136]), 64, dtype=dtype)
        b = randn(w.shape[0], dtype=dtype)

        def emu_lin(x=x, w=w, b=b, act=act):
            out = torch.full((x.shape[0], w.shape[0]), float("nan"), dtype=x.dtype)
            ops._library.gemm_emulate(x, w.t(), out, *HOPPER, False, True, b, act, SMS)
            return (out,)
        cases.append((f"emulate_linear_{act}{i}", emu_lin))
    return cases


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--threads", type=int, default=8)
    args = p.parse_args()
    sys.setswitchinterval(1e-5)  # switch Python threads often

    g = torch.Generator().manual_seed(0)
    shared = {"W": torch.randn(24, 40, generator=g, dtype=torch.float64),
              "b": torch.randn(24, generator=g, dtype=torch.float64),
              "norm_w": torch.randn(200, generator=g, dtype=torch.float64)}
    per_thread = [make_cases(1000 + t, shared) for t in range(args.threads)]

    # Single-threaded references, with the controls in their default state.
    ops.gemm.set_tactic(None)
    ops.gemm.set_autotune(False)
    ops.gemm.clear_tuning_cache()
    t0 = time.time()
    expected = [[fn() for _, fn in cases] for cases in per_thread]
    print(f"references: {sum(map(len, per_thread))} cases in {time.time() - t0:.1f}s", flush=True)

    stop = threading.Event()
    errors, counts = [], [0] * args.threads
    lock = threading.Lock()

    def worker(t):
        rnd = random.Random(t)
        cases = per_thread[t]
        try:
            while not stop.is_set():
                j = rnd.randrange(len(cases))
                name, fn = cases[j]
                got = fn()
                for a, b in zip(got, expected[t][j]):
                    if not close(a, b):
                        with lock:
                            errors.append(f"thread {t} {name}: mismatch, max abs diff "
                                          f"{(a.double() - b.double()).abs().max().item():.3g}")
                        break
                counts[t] += 1
        except Exception:  # noqa: BLE001
            with lock:
                errors.append(f"thread {t}: {traceback.format_exc()}")
            stop.set()

    def controller():
        """Flips the process-wide tactic controls while the workers run: autotune on/off (no effect on the
        emulated launch beyond select_tactic), tuning-cache entries (valid tactics for the emulated plans),
        reads and clears."""
        rnd = random.Random(99)
        keys = []
        # Tuning keys of some emulated bf16 GEMMs, and a valid tactic of each (its last candidate).
        A = torch.randn(33, 64).bfloat16()
        B = torch.randn(136, 64).bfloat16().t()
        plan = ops._library.gemm_plan_for_target(A, B, *HOPPER, False, SMS)
        keys.append((plan["tuning_key"], plan["candidates"]))
        path = os.path.join(tempfile.mkdtemp(prefix="ops-thread-stress-"), "tuning.json")
        try:
            while not stop.is_set():
                r = rnd.random()
                if r < 0.25:
                    ops.gemm.set_autotune(rnd.random() < 0.5)
                elif r < 0.5:
                    key, cands = rnd.choice(keys)
                    payload = {"format": "ops.gemm tuning cache", "version": 2,
                               "entries": [{"key": key, "best": rnd.choice(cands), "timings_ms": {}},
                                           {"key": f"bogus {rnd.random()}", "best": "x", "timings_ms": {}}]}
                    with open(path, "w") as f:
                        json.dump(payload, f)
                    ops.gemm.load_tuning_cache(path)
                elif r < 0.7:
                    ops.gemm.tuning_cache()
                elif r < 0.8:
                    ops.gemm.clear_tuning_cache()
                else:
                    ops.gemm.get_tactic()
                time.sleep(0.0005)
        except Exception:  # noqa: BLE001
            with lock:
                errors.append(f"controller: {traceback.format_exc()}")
            stop.set()

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(args.threads)]
    threads.append(threading.Thread(target=controller))
    t0 = time.time()
    for th in threads:
        th.start()
    while time.time() - t0 < args.seconds and not stop.is_set():
        time.sleep(0.2)
    stop.set()
    for th in threads:
        th.join()
    ops.gemm.set_autotune(False)
    ops.gemm.clear_tuning_cache()
    print(f"threaded: {sum(counts)} op-cases in {time.time() - t0:.1f}s over {args.threads} threads "
          f"(per thread {counts}); intra-op threads {torch.get_num_threads()}")
    if errors:
        print(f"FAIL: {len(errors)} problems")
        for e in errors[:20]:
            print(e)
        return 1
    print("OK: every threaded result equals the single-threaded reference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
