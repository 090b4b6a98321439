"""A small set of op calls for compute-sanitizer (memcheck, racecheck) in device_check.sh, each result
checked against float64: cutlass_gemm for each dtype, row/column-major and misaligned operands and an
out variant; every candidate tactic (split-K, stream-K, swap-AB, SIMT GEMV) of two decode shapes and a
ragged one, and of the fused linear at two M; the fused linear epilogues; rms_norm (one-block-per-row,
register-resident and lanes kernels), fused_add_rms_norm and silu_and_mul at ragged sizes; the FP8
quantization kernels (rows, 1x128 groups with a ragged last group, a given scale) and the fused forms,
each equal to the CPU formula of the unfused op's output bit for bit; scaled_gemm's epilogues (the SM90 FP8
kernels where built, every recipe); grouped_gemm's modes and layouts (the SM90 grouped kernels where built)
with an empty group, a tail and an out-of-range offset; scaled_grouped_gemm's recipes, output dtypes and
modes (the SM90 FP8 grouped kernels where built) and fp8_grouped_mm's forward and backward.

A wrong value or an error does not stop the run: every section runs (a smoke that stops at its first
wrong value leaves every later section unchecked by the sanitizer). Each section prints a line as it
starts and its failures as they happen; the exit status is 1 if anything failed."""

import sys
import traceback

import torch
import torch.nn.functional as F

import ops
from benchmarks.common import first_line

# CUDA normally; on a machine without a GPU the same calls run on CPU (tactics skipped) as a rehearsal.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


FAILURES = []


def check(name, got, ref, tol):
    """Records (and prints) a relative error (2-norm, against the float64 `ref`) of `tol` or more."""
    err = ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    if not err < tol:  # NaN fails too
        FAILURES.append(f"{name}: relative error {err:.3g} >= {tol}")
        print("  WRONG", FAILURES[-1], flush=True)


def gemms(dtype):
    for M, N, K in ((128, 96, 64), (33, 17, 9)):
        A = torch.randn(M, K, device=DEVICE, dtype=dtype)
        B = torch.randn(N, K, device=DEVICE, dtype=dtype).t()
        ref = A.double() @ B.double()
        check(("gemm", dtype, M, N, K), ops.cutlass_gemm(A, B), ref, 1e-2)
        out = torch.empty(N, M, device=DEVICE, dtype=dtype).t()
        ops.cutlass_gemm(A[1:], B, out=out[1:])
        check(("gemm out", dtype, M, N, K), out[1:], ref[1:], 1e-2)


def check_each_tactic(names, label, fn, ref, tol):
    """check(fn()) with each tactic of `names` forced in turn; an error (under the sanitizer a refused
    tactic is a finding too) is recorded and the next tactic runs."""
    for name in names:
        ops.gemm.set_tactic(name)
        try:
            check((label, name), fn(), ref, tol)
        except RuntimeError as e:
            FAILURES.append(f"{(label, name)}: {type(e).__name__}: {first_line(e)}")
            print("  ERROR", FAILURES[-1], flush=True)
        finally:
            ops.gemm.set_tactic(None)


def tactics():
    # decode, ragged decode, ragged, and four waves of 128x128 tiles on 132 SMs (every swizzle x raster)
    for M, N, K in ((4, 4096, 4096), (13, 1000, 1032), (200, 136, 1000), (3072, 3072, 64)):
        A = torch.randn(M, K, device=DEVICE, dtype=torch.bfloat16)
        B = torch.randn(N, K, device=DEVICE, dtype=torch.bfloat16).t()
        check_each_tactic(ops.gemm.plan(A, B)["candidates"], ("tactic", M, N, K), lambda: ops.cutlass_gemm(A, B),
                          A.double() @ B.double(), 1e-2)
    # The fused linear's candidates (128x128, 128x256, stream-K, SIMT GEMV epilogues) at a decode and
    # a ragged M.
    for M in (3, 200):
        x = torch.randn(M, 264, device=DEVICE, dtype=torch.bfloat16)
        w = torch.randn(136, 264, device=DEVICE, dtype=torch.bfloat16) / 264 ** 0.5
        b = torch.randn(136, device=DEVICE, dtype=torch.bfloat16)
        ref = F.gelu(F.linear(x.double(), w.double(), b.double()))
        names = ops._library.gemm_plan_for_target(
            x, w.t(), *torch.cuda.get_device_capability(), ops.build_info.CUDA_ARCH_LIST,
            sm_count=torch.cuda.get_device_properties(0).multi_processor_count, epilogue="gelu")["candidates"]
        check_each_tactic(names, ("linear tactic", M), lambda: ops.linear(x, w, b, "gelu"), ref, 2e-2)


def fused():
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(37, 200, device=DEVICE, dtype=dtype)
        w = torch.randn(136, 200, device=DEVICE, dtype=dtype)
        b = torch.randn(136, device=DEVICE, dtype=dtype)
        z = F.linear(x.double(), w.double(), b.double())
        for act, fn in (("none", lambda t: t), ("relu", F.relu), ("gelu", F.gelu), ("silu", F.silu),
                        ("gelu_tanh", lambda t: F.gelu(t, approximate="tanh"))):
            check(("linear", act, dtype), ops.linear(x, w, b, act), fn(z), 2e-2)
        for rows, hidden in ((1000, 128), (129, 31), (7, 5120), (3, 4099)):  # lanes and block kernels
            h = torch.randn(rows, hidden, device=DEVICE, dtype=dtype)
            g = torch.randn(hidden, device=DEVICE, dtype=dtype)
            hd = h.double()
            ref = hd * torch.rsqrt(hd.pow(2).mean(-1, keepdim=True) + 1e-6) * g.double()
            check(("rms_norm", rows, hidden, dtype), ops.rms_norm(h, g), ref, 2e-2)
            r = torch.randn_like(h)
            inp = h.clone()
            s = r.double() + hd
            ops.fused_add_rms_norm(inp, r, g)
            check(("fused_add_rms_norm", rows, hidden, dtype), r, s, 2e-2)
            u = torch.randn(rows, 2 * hidden, device=DEVICE, dtype=dtype)
            ud = u.double()
            check(("silu_and_mul", rows, hidden, dtype), ops.silu_and_mul(u),
                  F.silu(ud[:, :hidden]) * ud[:, hidden:], 2e-2)


def quantize():
    """quantize_fp8 and silu_and_mul_fp8 (quantize_fp8_kernels.cuh on CUDA) against the CPU formula: the
    same codes and scales, bit for bit."""
    def same(name, got, want):
        for g, w in zip(got, want):
            if not torch.equal(g.cpu().view(torch.uint8), w.view(torch.uint8)):
                FAILURES.append(f"{name}: not the CPU formula's bits")
                print("  WRONG", FAILURES[-1], flush=True)
                return

    for dtype in (torch.bfloat16, torch.float32):
        for rows, k in ((1, 4096), (37, 200), (5, 1032)):
            x = torch.randn(rows, k, dtype=dtype) * 3
            for granularity in ("row", "group"):
                for fp8 in (torch.float8_e4m3fn, torch.float8_e5m2):
                    same(("quantize_fp8", rows, k, granularity, fp8, dtype),
                         ops.quantize_fp8(x.to(DEVICE), granularity, fp8), ops.quantize_fp8(x, granularity, fp8))
            given = torch.rand(rows, 1) + 0.1
            same(("quantize_fp8 given", rows, k, dtype), ops.quantize_fp8(x.to(DEVICE), "row", scale=given.to(DEVICE)),
                 ops.quantize_fp8(x, "row", scale=given))
            u = torch.randn(rows, 2 * k, dtype=dtype)
            for granularity in ("row", "group"):
                ud = u.to(DEVICE)
                same(("silu_and_mul_fp8", rows, k, granularity, dtype), ops.silu_and_mul_fp8(ud, granularity),
                     ops.quantize_fp8(ops.silu_and_mul(ud).cpu(), granularity))
                xd, w = x.to(DEVICE), torch.rand(k, device=DEVICE, dtype=dtype) + 0.5
                same(("rms_norm_fp8", rows, k, granularity, dtype), ops.rms_norm_fp8(xd, w, 1e-6, granularity),
                     ops.quantize_fp8(ops.rms_norm(xd, w, 1e-6).cpu(), granularity))
                r = torch.randn_like(xd)
                expected = r + xd
                got = ops.fused_add_rms_norm_fp8(xd, r, w, 1e-6, granularity)
                same(("fused_add_rms_norm_fp8", rows, k, granularity, dtype), got,
                     ops.quantize_fp8(ops.rms_norm(expected, w, 1e-6).cpu(), granularity))


def scaled():
    """scaled_gemm, every recipe (the SM90 FP8 kernels where built), each epilogue once, a ragged M and a
    copied operand, against the float64 product."""
    e4 = torch.float8_e4m3fn
    for M in (1, 37, 256):
        A = (torch.randn(M, 512, device=DEVICE) * 3).to(e4)
        B = (torch.randn(384, 512, device=DEVICE) * 3).to(e4).t()
        if M == 37:
            B = B.contiguous()  # row-major: copied to the kernel's column-major
        shapes = {"tensorwise": ((), ()), "rowwise": ((M, 1), (1, 384)), "block128": ((M, 4), (4, 3)),
                  "block1x128": ((M, 4), (4, 384))}
        for recipe, (a_shape, b_shape) in shapes.items():
            sa = torch.rand(a_shape, device=DEVICE) + 0.5
            sb = torch.rand(b_shape, device=DEVICE) + 0.5
            bias = torch.randn(384, device=DEVICE).to(torch.bfloat16)
            ea = sa.double().repeat_interleave(128, 1) if recipe.startswith("block") else sa.double()
            eb = sb.double()
            if recipe.startswith("block"):
                eb = eb.repeat_interleave(128, 0)
                if recipe == "block128":
                    eb = eb.repeat_interleave(128, 1)
            z = (A.double() * ea) @ (B.double() * eb) + bias.double()
            for act, fn in (("none", lambda t: t), ("relu", F.relu), ("gelu", F.gelu), ("silu", F.silu),
                            ("gelu_tanh", lambda t: F.gelu(t, approximate="tanh"))):
                check(("scaled_gemm", M, recipe, act), ops.scaled_gemm(A, B, sa, sb, bias, activation=act), fn(z), 2e-2)


def grouped():
    """grouped_gemm in 2D x 3D (B row- and column-major), 2D x 2D (A column-major) and 3D x 3D, an empty group,
    rows past the last end and (CUDA) an offset past the end, against the float64 loop."""
    for dtype in (torch.bfloat16, torch.float16):
        A = torch.randn(300, 256, device=DEVICE, dtype=dtype)
        for B in (torch.randn(4, 256, 136, device=DEVICE, dtype=dtype),
                  torch.randn(4, 136, 256, device=DEVICE, dtype=dtype).transpose(1, 2)):
            # past the end: clamped to 300 on CUDA (checked, and refused, on CPU)
            offs = torch.tensor([0, 100, 250, 900 if DEVICE == "cuda" else 300], device=DEVICE, dtype=torch.int32)
            ends = (0, 100, 250, 300)
            ref = torch.cat([A[s:e].double() @ B[g].double() for g, (s, e) in enumerate(zip((0,) + ends, ends))])
            check(("grouped_gemm 2Dx3D", dtype, B.stride()), ops.grouped_gemm(A, B, offs), ref, 1e-2)
        At = torch.randn(300, 136, device=DEVICE, dtype=dtype).t()  # (136, 300) column-major
        B = torch.randn(300, 72, device=DEVICE, dtype=dtype)
        offs = torch.tensor([120, 120, 290], device=DEVICE, dtype=torch.int32)  # group 1 of no K; 290-299 in none
        ref = torch.stack([At[:, s:e].double() @ B[s:e].double() for s, e in ((0, 120), (120, 120), (120, 290))])
        check(("grouped_gemm 2Dx2D", dtype), ops.grouped_gemm(At, B, offs), ref, 1e-2)
        A3, B3 = torch.randn(3, 40, 64, device=DEVICE, dtype=dtype), torch.randn(3, 64, 24, device=DEVICE, dtype=dtype)
        check(("grouped_gemm 3Dx3D", dtype), ops.grouped_gemm(A3, B3), A3.double() @ B3.double(), 1e-2)


def _dequantized_grouped(A, B, sa, sb, ends, blockwise):
    """2D x 3D in float64: each group's rows of A (dequantized) times its dequantized B; zero past the last end."""
    K, N = A.shape[1], B.shape[2]
    out = torch.zeros(A.shape[0], N, device=A.device, dtype=torch.float64)
    start = 0
    for g, end in enumerate(ends):
        a, b = A[start:end].double(), B[g].double()
        if blockwise:
            a = a * sa[start:end].double().repeat_interleave(128, 1)[:, :K]
            b = b * sb[g].double().repeat_interleave(128, 0)[:K].repeat_interleave(128, 1)[:, :N]
        else:
            a, b = a * sa[start:end].double().unsqueeze(1), b * sb[g].double().unsqueeze(0)
        out[start:end] = a @ b
        start = end
    return out


def scaled_grouped():
    """scaled_grouped_gemm, both recipes and every output dtype (each SM90 FP8 grouped kernel where built), 2D x 3D
    with an empty group, rows past the last end, (CUDA) an offset past the end and B K-major and row-major; 3D x 3D;
    fp8_grouped_mm's forward and backward (its weight gradient 2D x 2D); against float64."""
    e4 = torch.float8_e4m3fn
    M, G, K, N = 300, 4, 384, 272
    A = (torch.randn(M, K, device=DEVICE) * 3).to(e4)
    B = (torch.randn(G, N, K, device=DEVICE) * 3).to(e4).transpose(1, 2)  # (G, K, N), K-major
    ends_list = [(100, 100, 250, 290)] + ([(100, 100, 250, 900)] if DEVICE == "cuda" else [])  # 900: clamped
    for recipe in ("rowwise", "blockwise"):
        blockwise = recipe == "blockwise"
        sa = torch.rand((M, K // 128) if blockwise else (M,), device=DEVICE) + 0.5
        sb = torch.rand((G, K // 128, -(-N // 128)) if blockwise else (G, N), device=DEVICE) + 0.5
        for ends in ends_list:
            offs = torch.tensor(ends, device=DEVICE, dtype=torch.int32)
            ref = _dequantized_grouped(A, B, sa, sb, [min(e, M) for e in ends], blockwise)
            for dtype in (torch.bfloat16, torch.float16, torch.float32):
                got = ops.scaled_grouped_gemm(A, B, sa, sb, offs, out_dtype=dtype)
                check(("scaled_grouped_gemm 2Dx3D", recipe, dtype, ends[-1]), got, ref, 1e-2)
            got = ops.scaled_grouped_gemm(A, B.contiguous(), sa, sb, offs)  # row-major B
            check(("scaled_grouped_gemm 2Dx3D row-major B", recipe, ends[-1]), got, ref, 1e-2)
        A3, B3 = A[:240].reshape(3, 80, K), B[:3]
        sa3 = sa[:240].reshape(3, 80, *sa.shape[1:])
        ref = torch.stack([_dequantized_grouped(A3[g], B3[g:g + 1], sa3[g], sb[g:g + 1], [80], blockwise)
                           for g in range(3)])
        check(("scaled_grouped_gemm 3Dx3D", recipe), ops.scaled_grouped_gemm(A3, B3, sa3, sb[:3]), ref, 1e-2)
    # Training: rows 128-129 in no group; expert 1 of no token.
    offs = torch.tensor([30, 30, 100, 128], device=DEVICE, dtype=torch.int32)
    x = torch.randn(130, 256, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(G, 96, 256, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    y = ops.fp8_grouped_mm(x, w, offs)
    grad = torch.randn_like(y)
    gx, gw = torch.autograd.grad(y, (x, w), grad)
    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    bounds = [0, 30, 30, 100, 128]
    yr = torch.cat([xr[bounds[g]:bounds[g + 1]] @ wr[g].t() for g in range(G)] + [xr.new_zeros(2, 96)])
    gxr, gwr = torch.autograd.grad(yr, (xr, wr), grad.double())
    for name, got, expected in (("forward", y, yr), ("grad x", gx, gxr), ("grad w", gw, gwr)):
        check(("fp8_grouped_mm", name), got, expected.detach(), 2.0 ** -4)


def fused_with_packs(packs):
    """fused() with the register-resident rms_norm kernel of `packs` packs per thread (csrc/fused_kernels.h)."""
    previous = torch.ops.ops._rms_norm_set_packs_per_thread(packs)
    try:
        fused()
    finally:
        torch.ops.ops._rms_norm_set_packs_per_thread(previous)


def main():
    torch.manual_seed(0)
    sections = [(f"gemms {dtype}", lambda dtype=dtype: gemms(dtype))
                for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64)]
    sections.append(("fused", fused))
    sections.append(("fp8 quantization", quantize))
    sections.append(("scaled_gemm", scaled))
    sections.append(("grouped_gemm", grouped))
    sections.append(("scaled_grouped_gemm", scaled_grouped))
    if DEVICE == "cuda":
        sections += [(f"fused, rms_norm packs {p}", lambda p=p: fused_with_packs(p)) for p in (1, 8)]
        # Last: every candidate tactic, the stream-K and swap-AB ones at small M among them (CUTLASS's hang
        # reports), so that a hang or their first instrumented launches cannot cost the other families.
        sections.append(("tactics", tactics))
    for name, section in sections:
        print(f"sanitizer smoke: {name}", flush=True)
        try:
            section()
            if DEVICE == "cuda":
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - recorded; the other sections still run
            traceback.print_exc()
            FAILURES.append(f"{name}: {type(e).__name__}: {first_line(e)}")
            print("  ERROR", FAILURES[-1], flush=True)
    if FAILURES:
        print(f"sanitizer smoke: {len(FAILURES)} FAILED", *FAILURES, sep="\n  ", flush=True)
        return 1
    print("sanitizer smoke: ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
