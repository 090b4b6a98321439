"""Shared helpers of the FP8 tests (test_fp8_numerics.py, test_fp8_recipes.py, op_registry.py): seeded FP8
operands and scales of each recipe, torch._scaled_mm's emulated CPU path, and quantize_fp8's formula."""

import contextlib

import torch

import ops


E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2


OUT_DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def fp8(*shape, dtype=E4, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * 3).to(dtype).to(device)


def scales(*shape, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(100 + seed)
    return (torch.rand(*shape, generator=g) + 0.5).to(device)


def blocks(n):
    return -(-n // 128)


def recipe_scales(recipe, M, K, N, device="cpu"):
    """(scale_a, scale_b) of a recipe, and each expanded to a float64 factor of A's and B's elements."""
    if recipe == "tensorwise":
        sa, sb = scales(1, seed=1, device=device).reshape(()), scales(1, seed=2, device=device).reshape(())
        return sa, sb, sa.double().reshape(1, 1), sb.double().reshape(1, 1)
    if recipe == "rowwise":
        sa, sb = scales(M, 1, seed=1, device=device), scales(1, N, seed=2, device=device)
        return sa, sb, sa.double(), sb.double()
    sa = scales(M, blocks(K), seed=1, device=device)
    ea = sa.double().repeat_interleave(128, 1)[:, :K]
    if recipe == "block128":
        sb = scales(blocks(K), blocks(N), seed=2, device=device)
        eb = sb.double().repeat_interleave(128, 0)[:K].repeat_interleave(128, 1)[:, :N]
    else:  # block1x128
        sb = scales(blocks(K), N, seed=2, device=device)
        eb = sb.double().repeat_interleave(128, 0)[:K]
    return sa, sb, ea, eb


RECIPES = ["tensorwise", "rowwise", "block128", "block1x128"]


# opcheck's test_schema compares tensors with arithmetic FP8 has none of on CPU ("mul_cpu_reduced_float" not
# implemented for 'Float8_e4m3fn'): the other tests.
OPCHECK_UTILS = ("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")


@contextlib.contextmanager
def aten_emulated_scaled_mm():
    """torch._scaled_mm on CPU takes ATen's emulated path inside: float32 dequantization, product, bias, one
    rounding. Without it torch 2.14 sends same-dtype FP8 to oneDNN where the CPU has AMX-INT8, which scales after
    accumulating: last-bit differences. Against float64, ops' results meet the bound of
    test_every_recipe_against_the_dequantized_float64_product whichever path torch takes."""
    enabled = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = enabled


def torch_scaled_mm_on_cpu(A, B, sa, sb, bias, out_dtype):
    """torch._scaled_mm on CPU, ATen's emulated path; where this torch runs only tensorwise scaling there (2.11:
    "only supports per-tensor scaling for CPU backend"), the formula that path computes: float32
    dequantization, product and bias, one rounding (equal to it bit for bit where it runs, torch 2.14)."""
    try:
        with aten_emulated_scaled_mm():
            return torch._scaled_mm(A, B, sa, sb, bias=bias, out_dtype=out_dtype)
    except RuntimeError as e:
        if "only supports per-tensor scaling" not in str(e) or sa.numel() == 1:
            raise
    z = (A.float() * sa).contiguous() @ (B.float() * sb).contiguous()
    return (z if bias is None else z + bias.float()).to(out_dtype)


FP8_MAX = {E4: 448.0, E5: 57344.0}

# Hopper's FP8 tensor cores keep about 14 bits of a partial sum (DeepSeek-V3 technical report, 3.3.2); without
# fast accumulation the partial sums of each 128-deep K step are added into float32 (CUTLASS's promotion, cuBLAS
# alike). So on the tensor-core paths (torch._scaled_mm, the CUTLASS FP8 kernels) an element is within 2^-12 of
# |a| @ |b| of the float64 product, where the float32 formula is within K * 2^-24 of it.
TENSOR_CORE_FP8_ACCUMULATION = 2.0 ** -12


def accumulation_bound(plan, K):
    """The relative accumulation error, of |a| @ |b| per element, of the path ops.fp8.plan says a call takes."""
    return K * 2.0 ** -24 + (0.0 if plan["path"] == "formula" else TENSOR_CORE_FP8_ACCUMULATION)


def quantize_reference(x, granularity, dtype, pow2):
    """The formula, group by group in Python loops over float32 slices."""
    xf, top = x.float(), FP8_MAX[dtype]
    scale = torch.empty(ops.fp8._scale_shape(x.shape, granularity))
    codes = torch.empty(x.shape, dtype=dtype)

    def one(values):
        s = (values.abs().amax() if values.numel() else torch.tensor(0.0)).clamp(min=1e-12) / top
        if pow2:  # the smallest power of two >= s: s = m 2^e with m in [0.5, 1); NaN and inf stay
            m, e = torch.frexp(s)
            s = torch.where((m == 0.5) | ~s.isfinite(), s, torch.ldexp(torch.ones(()), e))
        return s, (values / s).clamp(-top, top).to(dtype)

    if granularity == "block":
        for i in range(scale.shape[0]):
            for j in range(scale.shape[1]):
                rows, cols = slice(128 * i, 128 * (i + 1)), slice(128 * j, 128 * (j + 1))
                scale[i, j], codes[rows, cols] = one(xf[rows, cols])
    elif granularity == "group":
        flat, out, sc = xf.reshape(-1, x.shape[-1]), codes.view(-1, x.shape[-1]), scale.view(-1, scale.shape[-1])
        for r in range(flat.shape[0]):
            for j in range(sc.shape[1]):
                cols = slice(128 * j, 128 * (j + 1))
                sc[r, j], out[r, cols] = one(flat[r, cols])
    elif granularity == "row":
        flat, out, sc = xf.reshape(-1, x.shape[-1]), codes.view(-1, x.shape[-1]), scale.view(-1)
        for r in range(flat.shape[0]):
            sc[r], out[r] = one(flat[r])
    else:
        s, c = one(xf)
        scale.fill_(s)
        codes.copy_(c)
    return codes, scale


def same_bits_but_nan_signs(got, want):
    """FP8 codes equal bit for bit, except that any NaN code stands for a NaN of either sign: CUDA's division
    and FP8 conversion give positive NaNs, as torch's own formula does on CUDA."""
    g, w = got.cpu().view(torch.uint8), want.cpu().view(torch.uint8)
    nan = want.cpu().float().isnan()
    return torch.equal(g[~nan], w[~nan]) and bool(got.cpu().float()[nan].isnan().all())


def same_codes(a, b):
    return torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8)) and torch.equal(a[1], b[1])
