"""FP8 values. ops.scaled_gemm: equal to torch._scaled_mm on CPU for the recipes torch runs there (tensorwise,
rowwise), within the float64 bound for every recipe, the SM90 launch replayed on CPU and the GPU kernels against the
float64 product, the torch._scaled_mm path equal to the formula. ops.quantize_fp8 and the fused forms: codes and
scales equal the formula's for every granularity, bit for bit, non-finite values and code boundaries included."""

import pytest
import torch
import torch.nn.functional as F

import ops
from conftest import DEVICES
from fp8_support import (E4, E5, FP8_MAX, OUT_DTYPES, RECIPES, TENSOR_CORE_FP8_ACCUMULATION, accumulation_bound,
                         aten_emulated_scaled_mm, fp8, quantize_reference, recipe_scales, same_bits_but_nan_signs,
                         same_codes, torch_scaled_mm_on_cpu)
from ops.linear import ACTIVATION_FUNCTIONS


@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
@pytest.mark.parametrize("dtypes", [(E4, E4), (E4, E5), (E5, E4)], ids=["e4m3", "e4m3xe5m2", "e5m2xe4m3"])
@pytest.mark.parametrize("layout", ["B col-major", "B row-major", "A col-major"])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("M", [37, 2])  # M <= 3: ATen's mm sums a column-major B in another order
def test_equals_torch_scaled_mm_on_cpu(out_dtype, recipe, dtypes, layout, with_bias, M):
    K, N = 272, 48
    A = fp8(M, K, dtype=dtypes[0])
    B = fp8(N, K, dtype=dtypes[1], seed=1).t()  # column-major (the weight layout)
    if layout == "B row-major":
        B = B.contiguous()
    elif layout == "A col-major":
        A = A.t().contiguous().t()
    sa, sb, _, _ = recipe_scales(recipe, M, K, N)
    bias = torch.randn(N, generator=torch.Generator().manual_seed(3)).to(out_dtype) if with_bias else None
    expected = torch_scaled_mm_on_cpu(A, B, sa, sb, bias, out_dtype)
    assert torch.equal(ops.scaled_gemm(A, B, sa, sb, bias, out_dtype=out_dtype), expected)
    # The activation in float32 before the one rounding: act of torch's float32 result, rounded.
    z = torch_scaled_mm_on_cpu(A, B, sa, sb, None if bias is None else bias.float(), torch.float32)
    for name, fn in ACTIVATION_FUNCTIONS.items():
        got = ops.scaled_gemm(A, B, sa, sb, bias, out_dtype=out_dtype, activation=name)
        assert torch.equal(got, fn(z).to(out_dtype)), name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("shape", [(1, 128, 16), (5, 16, 144), (70, 400, 272), (130, 384, 256)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtypes", [(E4, E4), (E4, E5), (E5, E4)], ids=["e4m3", "e4m3xe5m2", "e5m2xe4m3"])
def test_every_recipe_against_the_dequantized_float64_product(device, recipe, shape, dtypes):
    M, K, N = shape
    A, B = fp8(M, K, dtype=dtypes[0], device=device), fp8(K, N, dtype=dtypes[1], seed=1, device=device)
    sa, sb, ea, eb = recipe_scales(recipe, M, K, N, device=device)
    a, b = A.double() * ea, B.double() * eb
    reference = a @ b
    # float32 products and sums: per element at most K roundings of |a| @ |b| (2^-24 each), then the output's;
    # FP8 tensor cores (CUDA): their accumulation's bound (fp8_support.accumulation_bound).
    for out_dtype, eps in ((torch.float32, 2.0 ** -24), (torch.bfloat16, 2.0 ** -8), (torch.float16, 2.0 ** -11)):
        bound = (a.abs() @ b.abs()) * accumulation_bound(ops.fp8.plan(A, B, sa, sb, out_dtype=out_dtype), K)
        got = ops.scaled_gemm(A, B, sa, sb, out_dtype=out_dtype).double()
        assert ((got - reference).abs() <= bound + eps * reference.abs() + 1e-30).all(), (recipe, out_dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_problems_and_the_default_out_dtype(device):
    one = torch.ones((), device=device)
    y = ops.scaled_gemm(fp8(0, 32, device=device), fp8(32, 16, device=device), one, one)
    assert y.shape == (0, 16) and y.dtype == torch.bfloat16
    bias = torch.randn(16, device=device, dtype=torch.bfloat16)
    y = ops.scaled_gemm(fp8(3, 0, device=device), fp8(0, 16, device=device), one, one, bias, activation="relu")
    assert torch.equal(y, F.relu(bias).expand(3, 16))
    assert ops.scaled_gemm(fp8(3, 32, device=device), fp8(32, 0, device=device), one, one).shape == (3, 0)


@pytest.mark.parametrize("granularity", ["tensor", "row", "group", "block"])
@pytest.mark.parametrize("dtype", [E4, E5])
@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("input_dtype", [torch.float32, torch.bfloat16])
def test_quantize_equals_the_formula(granularity, dtype, pow2, input_dtype):
    shape = (130, 300) if granularity == "block" else (2, 3, 300)
    x = (torch.randn(shape) * torch.logspace(-3, 3, shape[-1])).to(input_dtype)
    x[..., 5] = 0  # a zero column; in "row" a zero row too
    if granularity != "block":
        x[0, 1] = 0
    x = x.transpose(-1, -2).contiguous().transpose(-1, -2)  # column-major: any strides
    q, s = ops.quantize_fp8(x, granularity, dtype, pow2_scale=pow2)
    rq, rs = quantize_reference(x, granularity, dtype, pow2)
    assert torch.equal(s, rs)
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8))
    # Dequantized within half an FP8 ulp of each value (3 mantissa bits for e4m3, 2 for e5m2), or its
    # subnormal spacing.
    expanded = s  # tensor, row: broadcasts
    if granularity == "group":
        expanded = s.repeat_interleave(128, -1)[..., :300]
    elif granularity == "block":
        expanded = s.repeat_interleave(128, 0)[:130].repeat_interleave(128, 1)[:, :300]
    values = q.float() * expanded
    mantissa = 3 if dtype == E4 else 2
    subnormal = 2.0 ** (-9 if dtype == E4 else -16)
    assert ((values - x.float()).abs() <= x.float().abs() * 2.0 ** -(mantissa + 1) + expanded * subnormal).all()


def fp8_code_boundaries(dtype):
    """Every finite code of `dtype`, the midpoints between neighbours and the floats either side of each
    (where rounding to nearest even decides), non-finite values, zeros of both signs, values past the
    largest code, and random values over the range and among the subnormals."""
    codes = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    v = codes[codes.isfinite()].unique()
    mids = (v[1:] + v[:-1]) / 2
    g = torch.Generator().manual_seed(0)
    return torch.cat([v, mids, torch.nextafter(mids, torch.tensor(float("inf"))),
                      torch.nextafter(mids, torch.tensor(-float("inf"))),
                      torch.tensor([float("nan"), -float("nan"), float("inf"), -float("inf"), 0.0, -0.0,
                                    FP8_MAX[dtype] * 1.01, -FP8_MAX[dtype] * 3, 1e-30, -1e-30]),
                      (torch.rand(50000, generator=g) - 0.5) * 2.2 * FP8_MAX[dtype],
                      torch.randn(50000, generator=g) * 2.0 ** -12])


@pytest.mark.parametrize("dtype", [E4, E5])
def test_quantize_cpu_kernel_rounds_every_code_boundary_as_aten(dtype):
    # A given scale of 1 and of 2 (on doubled values): the codes are ATen's own clamp and conversion, bit for
    # bit (the AVX-512 build converts 16 at a time, the others one by one).
    x = fp8_code_boundaries(dtype)
    want = x.clamp(-FP8_MAX[dtype], FP8_MAX[dtype]).to(dtype).view(torch.uint8)
    for scale in (1.0, 2.0):
        got, s = ops.quantize_fp8((x * scale).view(1, -1), "tensor", dtype, scale=torch.tensor(scale))
        assert torch.equal(got.view(torch.uint8).flatten(), want) and s.item() == scale
    rows = x[: x.numel() // 128 * 128].view(-1, 128)
    got, _ = ops.quantize_fp8(rows, "row", dtype, scale=torch.ones(rows.shape[0], 1))
    assert torch.equal(got.view(torch.uint8).flatten(), want[: rows.numel()])


@pytest.mark.parametrize("granularity", ["row", "group"])
@pytest.mark.parametrize("dtype", [E4, E5])
@pytest.mark.parametrize("input_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("pow2", [False, True])
def test_quantize_cpu_kernel_on_non_finite_values(granularity, dtype, input_dtype, pow2):
    # NaN (either sign) and infinities in some rows and groups: the formula's NaN and infinite scales and
    # their codes, bit for bit, the sign of each NaN included; the other groups untouched by them.
    x = (torch.randn(6, 300, generator=torch.Generator().manual_seed(1)) * 10).to(input_dtype)
    x[0, 7], x[1, 200], x[2, 5], x[3, 130], x[4] = float("nan"), -float("nan"), float("inf"), -float("inf"), 0
    q, s = ops.quantize_fp8(x, granularity, dtype, pow2_scale=pow2)
    rq, rs = quantize_reference(x, granularity, dtype, pow2)
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8))
    assert torch.equal(s.view(torch.int32), rs.view(torch.int32))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [E4, E5])
def test_cuda_quantization_rounds_every_code_boundary_as_the_cpu(dtype):
    # The CUDA kernels convert with __nv_cvt_float_to_fp8 (the hardware conversion on sm_89+): every code, the
    # midpoints where rounding to nearest even decides, saturation, zeros of both signs and non-finite values,
    # in rows of 16-byte packs (the kernels' path), as the CPU kernel (test above: ATen's conversion) gives them.
    x = fp8_code_boundaries(dtype)
    x = x[: x.numel() // 128 * 128]  # the non-finite values come before the random tail cut here
    for scale in (1.0, 2.0):
        args = ((x * scale).view(1, -1), "tensor", dtype)
        got = ops.quantize_fp8(args[0].cuda(), *args[1:], scale=torch.tensor(scale, device="cuda"))
        want = ops.quantize_fp8(*args, scale=torch.tensor(scale))
        assert same_bits_but_nan_signs(got[0], want[0]), scale
    rows = x.view(-1, 128)
    for kw in (dict(scale=torch.ones(rows.shape[0], 1)), {}, dict(pow2_scale=True)):
        got = ops.quantize_fp8(rows.cuda(), "row", dtype, **{k: v.cuda() if isinstance(v, torch.Tensor) else v
                                                              for k, v in kw.items()})
        want = ops.quantize_fp8(rows, "row", dtype, **kw)
        assert same_bits_but_nan_signs(got[0], want[0]), kw
        torch.testing.assert_close(got[1].cpu(), want[1], rtol=0, atol=0, equal_nan=True)


def test_nan_sign_insensitive_code_comparison():
    codes = torch.tensor([1.0, float("nan"), -2.0]).to(E4)
    flipped = torch.tensor([1.0, -float("nan"), -2.0]).to(E4)
    assert not torch.equal(codes.view(torch.uint8), flipped.view(torch.uint8))
    assert same_bits_but_nan_signs(codes, flipped)
    assert not same_bits_but_nan_signs(codes, torch.tensor([1.0, float("nan"), 2.0]).to(E4))
    assert not same_bits_but_nan_signs(codes, torch.tensor([1.0, 3.0, -2.0]).to(E4))


def test_static_scale_and_the_gemm_it_feeds():
    x, w = torch.randn(6, 320), torch.randn(48, 320)
    s = torch.tensor(0.01)
    q, s_out = ops.quantize_fp8(x, "tensor", scale=s)
    assert torch.equal(s_out, s) and s_out.data_ptr() != s.data_ptr()
    assert torch.equal(q.view(torch.uint8), (x / s).clamp(-448, 448).to(E4).view(torch.uint8))
    cosine = torch.nn.functional.cosine_similarity
    xq, xs = ops.quantize_fp8(x, "row")
    wq, ws = ops.quantize_fp8(w, "row")
    y = ops.scaled_gemm(xq, wq.t(), xs, ws.t(), out_dtype=torch.float32)
    assert cosine(y.flatten(), (x @ w.t()).flatten(), dim=0) > 0.999
    xq, xs = ops.quantize_fp8(x, "group")
    wq, ws = ops.quantize_fp8(w, "block")  # W (N, K): its scales' transpose is scale_b for B = W^T
    y = ops.scaled_gemm(xq, wq.t(), xs, ws.t(), out_dtype=torch.float32)
    assert cosine(y.flatten(), (x @ w.t()).flatten(), dim=0) > 0.999


def test_pow2_scales_are_the_power_of_two_at_or_above_the_scale():
    # amax / 448 = 2^e (1 + 2^-21), exact in float32: float32 exp2(ceil(log2(s))) gives 2^e for |e| >= 16,
    # a scale below s that clamps the row's largest code.
    e = torch.arange(-44, 100, 5, dtype=torch.float32)
    s = torch.exp2(e) * (1 + 2.0**-21)
    x = torch.stack([s * 448, -s * 7], dim=1)  # one row per scale
    assert torch.equal(ops.quantize_fp8(x, "row")[1].squeeze(1), s)  # the unrounded scale is s itself
    q, scale = ops.quantize_fp8(x, "row", pow2_scale=True)
    assert torch.equal(scale.squeeze(1), torch.exp2(e + 1))
    assert torch.all(q.float().abs() < 448)  # never clamped
    exact = ops.quantize_fp8(torch.exp2(e).unsqueeze(1) * 448, "row", pow2_scale=True)[1]
    assert torch.equal(exact.squeeze(1), torch.exp2(e))  # a power of two stays


FUSED_GRANULARITIES = ["tensor", "row", "group"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("granularity", FUSED_GRANULARITIES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("pow2", [False, True])
def test_fused_forms_equal_the_unfused_formula(device, granularity, dtype, pow2):
    # On CUDA each fused form is a kernel of its own (fused_kernels.cu, quantize_fp8_kernels.cuh) and must
    # still equal the op's kernel followed by quantize_fp8's. Row lengths reach the lane kernels (one or two
    # groups), a block per row and (100 in 2-byte types) rows not in 16-byte packs.
    torch.manual_seed(0)
    kw = dict(granularity=granularity, pow2_scale=pow2)
    for hidden in (320, 128, 200, 4096, 100):
        x = torch.randn(3, 5, hidden, device=device).to(dtype)
        r = torch.randn(3, 5, hidden, device=device).to(dtype)
        w = (torch.rand(hidden, device=device) + 0.5).to(dtype)
        assert same_codes(ops.rms_norm_fp8(x, w, 1e-5, **kw), ops.quantize_fp8(ops.rms_norm(x, w, 1e-5), **kw))
        residual, expected_residual = r.clone(), r.clone()
        got = ops.fused_add_rms_norm_fp8(x, residual, w, 1e-5, **kw)
        expected_residual += x
        assert torch.equal(residual, expected_residual)
        assert same_codes(got, ops.quantize_fp8(ops.rms_norm(expected_residual, w, 1e-5), **kw))
    for d in (320, 4096, 300):  # 300: not in 16-byte packs of 2-byte types (the formula on CUDA)
        gate_up = (torch.randn(3, 5, 2 * d, device=device) * 4).to(dtype)
        assert same_codes(ops.silu_and_mul_fp8(gate_up, **kw), ops.quantize_fp8(ops.silu_and_mul(gate_up), **kw))


@pytest.mark.cuda
@pytest.mark.parametrize("granularity", ["tensor", "row", "group", "block"])
@pytest.mark.parametrize("dtype", [E4, E5])
@pytest.mark.parametrize("input_dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_cuda_quantization_equals_the_cpu_formula(granularity, dtype, input_dtype):
    # Rows and groups of 2- and 4-byte types run quantize_fp8_kernels.cuh; the rest the same formula.
    g = torch.Generator().manual_seed(0)
    for shape in ((1, 4096), (2, 37, 1032), (130, 300), (9, 4)):
        if granularity == "block" and len(shape) != 2:
            continue
        x = (torch.randn(shape, generator=g) * torch.logspace(-3, 3, shape[-1])).to(input_dtype)
        x.view(-1, shape[-1])[0, 1] = float("nan")
        x.view(-1, shape[-1])[-1] = 0
        for pow2 in (False, True):
            got = ops.quantize_fp8(x.cuda(), granularity, dtype, pow2_scale=pow2)
            want = ops.quantize_fp8(x, granularity, dtype, pow2_scale=pow2)
            torch.testing.assert_close(got[1].cpu(), want[1], rtol=0, atol=0, equal_nan=True)
            torch.testing.assert_close(got[0].cpu().float(), want[0].float(), rtol=0, atol=0, equal_nan=True)
        given = torch.rand(ops.fp8._scale_shape(x.shape, granularity), generator=g) + 1e-3
        got = ops.quantize_fp8(x.cuda().transpose(0, -1).contiguous().transpose(0, -1), granularity, dtype,
                               scale=given.cuda())
        want = ops.quantize_fp8(x, granularity, dtype, scale=given)
        torch.testing.assert_close(got[0].cpu().float(), want[0].float(), rtol=0, atol=0, equal_nan=True)
        assert torch.equal(got[1].cpu(), want[1]) and got[1].is_contiguous()


@pytest.mark.cuda
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
def test_agrees_with_torch_scaled_mm_on_the_gpu(recipe, out_dtype):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("torch._scaled_mm needs sm89+")
    M, K, N = 64, 512, 256
    A, B = fp8(M, K, device="cuda"), fp8(N, K, seed=1, device="cuda").t()  # B column-major, as cuBLAS takes it
    sa, sb, ea, eb = recipe_scales(recipe, M, K, N, device="cuda")
    bias = torch.randn(N, device="cuda").to(out_dtype) if out_dtype != torch.float32 else None
    ours = ops.scaled_gemm(A, B, sa, sb, bias, out_dtype=out_dtype).double()
    theirs = torch._scaled_mm(A, B, sa, sb, bias=bias, out_dtype=out_dtype).double()
    reference = (A.double() * ea) @ (B.double() * eb) + (0 if bias is None else bias.double())
    # Both on FP8 tensor cores: float32 out within their accumulation (fp8_support), |a| @ |b| <= K max|a||b|.
    eps = {torch.float32: TENSOR_CORE_FP8_ACCUMULATION, torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10}[out_dtype]
    scale = ((A.double() * ea).abs() @ (B.double() * eb).abs()).max()
    assert (ours - reference).abs().max() <= eps * scale and (theirs - reference).abs().max() <= eps * scale


def scaled_kernel_candidates(recipe, out_dtype, act):
    """The unswapped and the swapped SM90 kernel of a call (ops.kernels), two-level accumulation."""
    names = {"tensorwise": "tensorwise", "rowwise": "rowwise", "block128": "blockwise 1x128 x 128x128",
             "block1x128": "blockwise 1x128 x 1x128"}
    dtype = str(out_dtype).removeprefix("torch.")
    found = sorted((k["swap_ab"], k["name"]) for k in ops.kernels("scaled_gemm")
                   if names[recipe] in k["recipes"] and k["out_dtype"] == dtype and k["activation"] == act
                   and k["accumulation"] != "fast")
    assert [swap for swap, _ in found] == [False, True], found
    return [name for _, name in found]


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "block128", "block1x128"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_the_sm90_launch_replayed_on_cpu_equals_the_formula(recipe, out_dtype):
    # The CUDA path's launch (prepare_scaled_launch: operands in the kernel's layouts, blockwise scale_a
    # M-major in padded rows, scales and bias aligned) replayed from its raw pointers and leading
    # dimensions (torch.ops.ops._scaled_gemm_emulate); a wrong pointer, stride or scale layout shows.
    eps = {torch.float32: 2.0 ** -20, torch.bfloat16: 2.0 ** -7}[out_dtype]
    for M, K, N, layout in ((37, 528, 256, "tn"), (1, 256, 128, "tn"), (64, 384, 384, "nt"), (5, 256, 160, "views"),
                            (9, 256, 64, "padded"), (1, 256, 128, "column")):
        A, B = fp8(M, K), fp8(N, K, seed=1).t()
        if layout == "column":  # (1, K) of a (K, 1) column: strides (1, 1), contiguous for torch
            A = fp8(K, 1).t()
        if layout == "padded":  # leading dimensions past K, read in place
            A, B = fp8(M, K + 32)[:, :K], fp8(N, K + 16, seed=1)[:, :K].t()
        if layout == "nt":  # A column-major, B row-major: copied
            A, B = A.t().contiguous().t(), B.contiguous()
        sa, sb, _, _ = recipe_scales(recipe, M, K, N)
        bias = torch.randn(N).to(out_dtype)
        if layout == "views":  # scales and bias from addresses that are not 16-byte aligned
            bias = torch.randn(N + 1).to(out_dtype)[1:]
            sa = torch.cat([torch.zeros(1), sa.reshape(-1)])[1:].reshape(sa.shape)
            sb = torch.cat([torch.zeros(1), sb.reshape(-1)])[1:].reshape(sb.shape)
        for act in ("none", "gelu_tanh"):
            want = ops.scaled_gemm(A, B, sa, sb, bias, out_dtype=out_dtype, activation=act).double()
            got = torch.ops.ops._scaled_gemm_emulate(A, B, sa, sb, bias, out_dtype, act).double()
            assert (got - want).abs().max() <= 2 * eps * want.abs().max(), (M, K, N, layout, act)
            # Each kernel variant forced, the swapped one (D^T = B^T A^T) at every M too.
            for name in scaled_kernel_candidates(recipe, out_dtype, act):
                ops.gemm.set_tactic(name)
                try:
                    got = torch.ops.ops._scaled_gemm_emulate(A, B, sa, sb, bias, out_dtype, act).double()
                finally:
                    ops.gemm.set_tactic(None)
                assert (got - want).abs().max() <= 2 * eps * want.abs().max(), (M, K, N, layout, act, name)
    A, B = fp8(8, 64), fp8(32, 64, seed=1).t()
    sa, sb, _, _ = recipe_scales(recipe, 8, 64, 32)
    got = torch.ops.ops._scaled_gemm_emulate(A, B, sa, sb)
    torch.testing.assert_close(got.float(), ops.scaled_gemm(A, B, sa, sb).float(), rtol=2 ** -7, atol=1e-3)
    with pytest.raises(RuntimeError, match="_scaled_gemm_emulate: the FP8 kernels take float8_e4m3fn"):
        torch.ops.ops._scaled_gemm_emulate(fp8(8, 64, dtype=torch.float8_e5m2), B, sa, sb)


ACTIVATIONS = {"none": lambda z: z, "relu": torch.relu, "gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu,
               "gelu_tanh": lambda z: torch.nn.functional.gelu(z, approximate="tanh")}


@pytest.mark.cuda
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "block128", "block1x128"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("fast_accum", [False, True])
def test_the_sm90_kernels_against_the_float64_product(recipe, out_dtype, fast_accum, candidate_kernels):
    # Where the SM90 FP8 kernels are built and run (plan() says so), every epilogue, with and without a
    # bias, with operands read in place and through copies, and ragged M (37: blockwise scale_a rows padded
    # to 16 bytes); elsewhere torch._scaled_mm or the formula.
    A0, B0 = fp8(200, 512, device="cuda"), fp8(384, 512, seed=1, device="cuda").t()
    plan = ops.fp8.plan(A0, B0, *recipe_scales(recipe, 200, 512, 384, device="cuda")[:2], out_dtype=out_dtype,
                        use_fast_accum=fast_accum)
    capability = torch.cuda.get_device_capability()
    if capability == (9, 0) and ops.build_info.CANDIDATE_KERNELS and candidate_kernels:
        assert plan["path"] == "cutlass" and plan["kernel"].startswith("sm90_e4m3_"), plan
        # M = 1 below: every recipe runs swapped (D^T = B^T A^T on 128x32 tiles)
        small = ops.fp8.plan(A0[:1], B0, *recipe_scales(recipe, 1, 512, 384, device="cuda")[:2], out_dtype=out_dtype,
                             use_fast_accum=fast_accum)
        assert small["swap_ab"] and not plan["swap_ab"], small
    else:  # torch._scaled_mm for tensorwise and rowwise, unless torch has refused such a call here
        expected = "formula" if recipe.startswith("block") else "torch._scaled_mm"
        assert plan["path"] == expected or "torch._scaled_mm refused" in plan["reason"], plan
    eps = {torch.float32: 2.0 ** -20, torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10}[out_dtype]
    if plan["path"] != "formula":
        eps = max(eps, TENSOR_CORE_FP8_ACCUMULATION)  # of max |a| @ |b| (fp8_support)
    if fast_accum and recipe in ("tensorwise", "rowwise"):
        eps = max(eps, 2.0 ** -9)  # the tensor cores' fast FP8 accumulation drops low bits
    for M, layout in ((200, "tn"), (1, "tn"), (37, "nt")):
        A, B = A0[:M], B0
        if layout == "nt":  # A column-major, B row-major: copied to the kernel's layouts
            A, B = A.t().contiguous().t(), B.contiguous()
        sa, sb, ea, eb = recipe_scales(recipe, M, 512, 384, device="cuda")
        for act, fn in ACTIVATIONS.items():
            # a bias from a 16-byte aligned address and one from a view that is not (copied for the epilogue)
            for bias in (None, torch.randn(384, device="cuda").to(out_dtype), torch.randn(385, device="cuda").to(out_dtype)[1:]):
                got = ops.scaled_gemm(A, B, sa, sb, bias, out_dtype=out_dtype, activation=act,
                                      use_fast_accum=fast_accum).double()
                z = (A.double() * ea) @ (B.double() * eb) + (0 if bias is None else bias.double())
                reference = fn(z)
                scale = ((A.double() * ea).abs() @ (B.double() * eb).abs()).max() + (
                    0 if bias is None else bias.double().abs().max())
                assert (got - reference).abs().max() <= eps * scale, (M, layout, act, bias is None)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_the_torch_scaled_mm_path_equals_the_formula(recipe, out_dtype):
    # CUDA's path where no CUTLASS kernel takes the call: torch._scaled_mm, torch adding the bias without an
    # activation, else its float32 product with the bias and activation added after and one rounding. On CPU
    # ATen's emulated product is the formula's, so the two agree bit for bit; B of either layout, e5m2 for one side.
    with aten_emulated_scaled_mm():
        for M in (24, 3):
            check_the_torch_scaled_mm_path(recipe, out_dtype, M, 160, 48)


def check_the_torch_scaled_mm_path(recipe, out_dtype, M, K, N):
    sa, sb, _, _ = recipe_scales(recipe, M, K, N)
    A = fp8(M, K)
    try:
        torch._scaled_mm(A, fp8(N, K, seed=1).t(), sa, sb, out_dtype=out_dtype)
    except RuntimeError as e:
        # torch 2.11's CPU kernel takes tensorwise scales only: the path says so instead of answering.
        assert "only supports per-tensor scaling" in str(e) and recipe == "rowwise", e
        with pytest.raises(RuntimeError, match="not taken: torch._scaled_mm refused cpu rowwise"):
            torch.ops.ops._scaled_gemm_torch_path(A, fp8(N, K, seed=1).t(), sa, sb, None, out_dtype, "none")
        pytest.skip(f"torch {torch.__version__}'s CPU _scaled_mm refuses rowwise scales")
    for B in (fp8(N, K, seed=1).t(), fp8(K, N, seed=1), fp8(N, K, dtype=torch.float8_e5m2, seed=1).t()):
        for act in ("none", "relu", "gelu_tanh", "silu"):
            g = torch.Generator().manual_seed(4)
            for bias in (None, torch.randn(N, generator=g).to(out_dtype),
                         torch.randn(N + 1, generator=g).to(out_dtype)[1:]):  # misaligned
                got = torch.ops.ops._scaled_gemm_torch_path(A, B, sa, sb, bias, out_dtype, act)
                expected = ops.scaled_gemm(A, B, sa, sb, bias=bias, out_dtype=out_dtype, activation=act)
                assert got.dtype == out_dtype and torch.equal(got, expected), (B.dtype, act, bias is None)


def test_the_torch_scaled_mm_path_takes_no_blockwise_scales():
    sa, sb, _, _ = recipe_scales("block128", 16, 256, 128)
    with pytest.raises(RuntimeError, match="not taken: blockwise scales are not given to torch._scaled_mm"):
        torch.ops.ops._scaled_gemm_torch_path(fp8(16, 256), fp8(128, 256, seed=1).t(), sa, sb)
