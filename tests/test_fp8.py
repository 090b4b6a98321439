"""FP8. ops.scaled_gemm: equal to torch._scaled_mm on CPU for the recipes torch runs there (tensorwise,
rowwise), and to a float64 dequantized reference for every recipe; bad inputs give the op's error, the same
from the fake kernel; opcheck, torch.compile, torch.export and TorchScript; not differentiable.
ops.quantize_fp8: codes and scales equal the formula's for every granularity, and feed scaled_gemm."""

import contextlib
import functools

import pytest
import torch
import torch.nn.functional as F

import ops
from conftest import DEVICES
from ops.linear import ACTIVATION_FUNCTIONS

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
    # float32 products and sums: per element at most K roundings of |a| @ |b| (2^-24 each), then the output's.
    bound = (a.abs() @ b.abs()) * K * 2.0 ** -24
    for out_dtype, eps in ((torch.float32, 2.0 ** -24), (torch.bfloat16, 2.0 ** -8), (torch.float16, 2.0 ** -11)):
        got = ops.scaled_gemm(A, B, sa, sb, out_dtype=out_dtype).double()
        assert ((got - reference).abs() <= bound + eps * reference.abs() + 1e-30).all(), (recipe, out_dtype)


def test_recipes_are_told_apart_by_scale_shapes():
    # A 128x128 block scale of B differs from a 1x128 one only in its columns; each gives its own product.
    M, K, N = 8, 256, 256
    A, B = fp8(M, K), fp8(K, N, seed=1)
    sa = scales(M, 2, seed=1)
    s128, s1x128 = scales(2, 2, seed=2), scales(2, N, seed=3)
    y128 = ops.scaled_gemm(A, B, sa, s128, out_dtype=torch.float32)
    y1x128 = ops.scaled_gemm(A, B, sa, s1x128, out_dtype=torch.float32)
    torch.testing.assert_close(y128, ops.scaled_gemm(A, B, sa, s128.repeat_interleave(128, 1), out_dtype=torch.float32))
    assert not torch.allclose(y128, y1x128)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_problems_and_the_default_out_dtype(device):
    one = torch.ones((), device=device)
    y = ops.scaled_gemm(fp8(0, 32, device=device), fp8(32, 16, device=device), one, one)
    assert y.shape == (0, 16) and y.dtype == torch.bfloat16
    bias = torch.randn(16, device=device, dtype=torch.bfloat16)
    y = ops.scaled_gemm(fp8(3, 0, device=device), fp8(0, 16, device=device), one, one, bias, activation="relu")
    assert torch.equal(y, F.relu(bias).expand(3, 16))
    assert ops.scaled_gemm(fp8(3, 32, device=device), fp8(32, 0, device=device), one, one).shape == (3, 0)


def _args(**change):
    args = dict(A=fp8(4, 32), B=fp8(32, 16, seed=1), scale_a=torch.tensor(1.0), scale_b=torch.tensor(1.0),
                bias=None, out_dtype=None, activation="none")
    args.update(change)
    return args


BAD = [
    ("A float32", _args(A=torch.randn(4, 32)), RuntimeError,
     r"scaled_gemm: expected A and B to be torch.float8_e4m3fn or torch.float8_e5m2, got A torch.float32 and B "
     r"torch.float8_e4m3fn"),
    ("both e5m2", _args(A=fp8(4, 32, dtype=E5), B=fp8(32, 16, dtype=E5)), RuntimeError,
     r"scaled_gemm: A and B cannot both be torch.float8_e5m2"),
    ("1-d A", _args(A=fp8(32)), RuntimeError, r"scaled_gemm: expected A to be a 2-D matrix \(M, K\)"),
    ("K mismatch", _args(B=fp8(48, 16)), RuntimeError, r"scaled_gemm: A \(M, K\) and B \(K, N\) must agree on K"),
    ("K % 16", _args(A=fp8(4, 24), B=fp8(24, 16)), RuntimeError,
     r"scaled_gemm: expected K and N to be multiples of 16 .*got K = 24 and N = 16"),
    ("N % 16", _args(B=fp8(32, 8)), RuntimeError, r"got K = 32 and N = 8"),
    ("scale dtype", _args(scale_a=torch.tensor(1.0, dtype=torch.float64)), RuntimeError,
     r"scaled_gemm: expected scale_a and scale_b to be torch.float32, got torch.float64 and torch.float32"),
    ("tensorwise x rowwise", _args(scale_b=torch.ones(1, 16)), RuntimeError,
     r"scaled_gemm: scale_a of shape \[\] and scale_b of shape \[1, 16\] are no recipe for A \(M, K\) = \(4, 32\)"),
    ("rowwise transposed", _args(scale_a=torch.ones(1, 4), scale_b=torch.ones(16, 1)), RuntimeError,
     r"expected tensorwise: one element each; rowwise: \(M, 1\) = \(4, 1\) and \(1, N\) = \(1, 16\)"),
    ("out_dtype", _args(out_dtype=torch.float64), RuntimeError,
     r"scaled_gemm: expected out_dtype to be torch.bfloat16, torch.float16 or torch.float32, got torch.float64"),
    ("bias shape", _args(bias=torch.ones(8, dtype=torch.bfloat16)), RuntimeError,
     r"scaled_gemm: expected bias of shape \(N,\) = \(16,\), got \[8\]"),
    ("bias dtype", _args(bias=torch.ones(16)), RuntimeError,
     r"scaled_gemm: expected bias's dtype to be torch.bfloat16 \(out_dtype\), got torch.float32"),
    ("out's dtype", _args(out=torch.empty(4, 16, dtype=torch.float64)), RuntimeError,  # no out_dtype: out's decides
     r"scaled_gemm: expected out's dtype to be torch.bfloat16, torch.float16 or torch.float32, got torch.float64"),
    ("bias dtype with out", _args(bias=torch.ones(16), out=torch.empty(4, 16, dtype=torch.float16)), RuntimeError,
     r"scaled_gemm: expected bias's dtype to be torch.float16 \(out's dtype\), got torch.float32"),
    ("activation", _args(activation="tanh"), ValueError,
     r'scaled_gemm: expected activation to be one of "none", "relu", "gelu", "gelu_tanh", "silu", got "tanh"'),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_inputs_and_the_fake_kernel_says_the_same(case):
    _, args, error, pattern = case
    messages = []
    for device in ("cpu", "meta"):
        moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in args.items()}
        with pytest.raises(error, match=pattern) as info:
            ops.scaled_gemm(**moved)
        messages.append(str(info.value).splitlines()[0])
    assert messages[0] == messages[1]


def test_scales_on_another_device():
    with pytest.raises(RuntimeError, match=r"scaled_gemm: expected scale_b on cpu \(A's device\), got meta"):
        ops.scaled_gemm(**_args(scale_b=torch.tensor(1.0, device="meta")))


def test_out_variant():
    A, B = fp8(6, 32), fp8(32, 16, seed=1)
    sa, sb = scales(6, 1), scales(1, 16)
    expected = ops.scaled_gemm(A, B, sa, sb, out_dtype=torch.float32, activation="gelu")
    for out in (torch.empty(6, 16), torch.empty(16, 6).t(), torch.empty(6, 32)[:, ::2]):
        assert ops.scaled_gemm(A, B, sa, sb, activation="gelu", out=out) is out  # out_dtype: out's
        assert torch.equal(out, expected)
    with pytest.raises(RuntimeError, match=r"scaled_gemm: expected out's dtype to be torch.bfloat16 \(out_dtype\), "
                                           r"got torch.float32"):
        ops.scaled_gemm(A, B, sa, sb, out_dtype=torch.bfloat16, out=torch.empty(6, 16))
    with pytest.raises(RuntimeError, match=r"scaled_gemm: expected out of shape \(M, N\) = \(6, 16\)"):
        ops.scaled_gemm(A, B, sa, sb, out=torch.empty(16, 6))


def test_out_with_internal_overlap_is_refused():
    A, B = fp8(4, 32), fp8(32, 16, seed=1)
    with pytest.raises(RuntimeError, match="scaled_gemm: out"):
        ops.scaled_gemm(A, B, torch.tensor(1.0), torch.tensor(1.0), out=torch.zeros(1, 16).expand(4, 16))


@pytest.mark.parametrize("device", DEVICES)
def test_out_overlapping_a_scale_or_the_bias_is_refused(device):
    # The kernels' epilogue reads the scales and the bias while it writes out.
    A, B, sa = fp8(4, 32, device=device), fp8(32, 16, seed=1, device=device), scales(4, 1, device=device)
    out = torch.zeros(4, 16, device=device)
    with pytest.raises(RuntimeError, match="scaled_gemm: out overlaps scale_b in memory"):
        ops.scaled_gemm(A, B, sa, out[1:2], out=out)
    with pytest.raises(RuntimeError, match="scaled_gemm: out overlaps bias in memory"):
        ops.scaled_gemm(A, B, sa, scales(1, 16, device=device), bias=out[2], out=out)
    # Views of one buffer whose overlap ATen cannot decide: computed into a temporary first.
    buf = torch.zeros(4, 32, device=device)
    bias = buf[0, 16:].copy_(torch.randn(16))
    before = bias.clone()
    expected = ops.scaled_gemm(A, B, sa, scales(1, 16, device=device), bias=before, out_dtype=torch.float32)
    ops.scaled_gemm(A, B, sa, scales(1, 16, device=device), bias=bias, out=buf[:, :16])
    assert torch.equal(buf[:, :16], expected) and torch.equal(buf[0, 16:], before)


def test_not_differentiable():
    A, B = fp8(4, 32), fp8(32, 16, seed=1)
    for requires in ("scale_a", "bias"):
        sa, bias = torch.tensor(1.0), torch.zeros(16)
        {"scale_a": sa, "bias": bias}[requires].requires_grad_()
        with pytest.raises(RuntimeError, match=r"scaled_gemm: not differentiable \(FP8 operands have no gradient\)"):
            ops.scaled_gemm(A, B, sa, torch.tensor(1.0), bias, out_dtype=torch.float32)
        with torch.no_grad():
            y = ops.scaled_gemm(A, B, sa, torch.tensor(1.0), bias, out_dtype=torch.float32)
        assert not y.requires_grad
        with pytest.raises(RuntimeError, match="not differentiable"):
            ops.scaled_gemm(A, B, sa, torch.tensor(1.0), bias, out=torch.empty(4, 16))


SAMPLES = [
    ("tensorwise", lambda: (fp8(5, 32), fp8(16, 32, seed=1).t(), torch.tensor(0.5), torch.tensor(2.0)), {}),
    ("rowwise bias silu", lambda: (fp8(5, 32), fp8(32, 16, seed=1), scales(5, 1), scales(1, 16)),
     {"bias": torch.randn(16), "out_dtype": torch.float32, "activation": "silu"}),
    ("block128", lambda: (fp8(3, 160), fp8(160, 32, seed=1), scales(3, 2), scales(2, 1)),
     {"out_dtype": torch.float16}),
    ("block1x128 sliced", lambda: (fp8(6, 320)[::2, :160], fp8(160, 32, seed=1), scales(3, 2), scales(2, 32)), {}),
]


@pytest.mark.parametrize("sample", SAMPLES, ids=[s[0] for s in SAMPLES])
def test_opcheck(sample):
    _, make, kwargs = sample
    args = make()
    # The schema's claim that no input is written, which opcheck's test_schema cannot check (OPCHECK_UTILS).
    before = [a.view(torch.uint8).clone() if a.dtype in (E4, E5) else a.clone() for a in args]
    torch.library.opcheck(torch.ops.ops.scaled_gemm.default, args, kwargs, test_utils=OPCHECK_UTILS)
    out_dtype = kwargs.get("out_dtype") or torch.bfloat16
    out = torch.empty(args[0].shape[0], args[1].shape[1], dtype=out_dtype)
    torch.library.opcheck(torch.ops.ops.scaled_gemm.out, args, {**kwargs, "out": out}, test_utils=OPCHECK_UTILS)
    after = [a.view(torch.uint8) if a.dtype in (E4, E5) else a for a in args]
    assert all(torch.equal(x, y) for x, y in zip(before, after))


class Fp8Projection(torch.nn.Module):
    """x -> act(x W^T + b) with W quantized once per output channel and x per row at each call."""

    def __init__(self, d_in=32, d_out=16):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        w = torch.randn(d_out, d_in, generator=g)
        w_scale = w.abs().amax(1, keepdim=True) / 448
        self.register_buffer("w", (w / w_scale).to(E4))
        self.register_buffer("w_scale", w_scale.t().contiguous())  # (1, N)
        self.register_buffer("b", torch.randn(d_out, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_scale = x.abs().amax(1, keepdim=True).clamp(min=1e-12) / 448
        xq = (x / x_scale).to(torch.float8_e4m3fn)
        return torch.ops.ops.scaled_gemm(xq, self.w.t(), x_scale, self.w_scale, self.b, torch.float32, "gelu")


def test_compile_fullgraph_dynamic_and_export():
    model = Fp8Projection()
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(torch.randn(8, 32))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for n in (3, 8, 17):
        x = torch.randn(n, 32)
        torch.testing.assert_close(compiled(x), model(x))
    batch = torch.export.Dim("batch")
    exported = torch.export.export(model, (torch.randn(8, 32),), dynamic_shapes=({0: batch},))
    assert any(n.target == torch.ops.ops.scaled_gemm.default for n in exported.graph.nodes)
    x = torch.randn(11, 32)
    torch.testing.assert_close(exported.module()(x), model(x))


def test_torchscript():
    scripted = torch.jit.script(Fp8Projection())
    x = torch.randn(4, 32)
    torch.testing.assert_close(scripted(x), Fp8Projection()(x))

    @torch.jit.script
    def f(a: torch.Tensor, b: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return torch.ops.ops.scaled_gemm(a, b, s, s, None, None, "relu", False)

    A, B = fp8(4, 32), fp8(32, 16, seed=1)
    one = torch.tensor(1.0)
    assert torch.equal(f(A, B, one), ops.scaled_gemm(A, B, one, one, activation="relu"))
    for recipe in ops.nn.Fp8Linear.RECIPES:
        module = ops.nn.Fp8Linear.from_linear(torch.nn.Linear(32, 16), recipe, activation="gelu")
        x = torch.randn(2, 3, 32)
        with torch.no_grad():
            assert torch.equal(torch.jit.script(module)(x), module(x))


# ---- ops.quantize_fp8 ----------------------------------------------------------------------------

FP8_MAX = {E4: 448.0, E5: 57344.0}


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


def same_bits_but_nan_signs(got, want):
    """FP8 codes equal bit for bit, except that any NaN code stands for a NaN of either sign: CUDA's division
    and FP8 conversion give positive NaNs, as torch's own formula does on CUDA."""
    g, w = got.cpu().view(torch.uint8), want.cpu().view(torch.uint8)
    nan = want.cpu().float().isnan()
    return torch.equal(g[~nan], w[~nan]) and bool(got.cpu().float()[nan].isnan().all())


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


QUANTIZE_BAD = [
    ("integer", (torch.ones(4, 8, dtype=torch.int32),), {}, RuntimeError,
     r"quantize_fp8: expected input's dtype to be float16, bfloat16, float32 or float64, got torch.int32"),
    ("0-d", (torch.tensor(1.0),), {}, RuntimeError, r"quantize_fp8: expected input of shape \(\.\.\., K\), got a 0-D"),
    ("granularity", (torch.ones(4, 8), "channel"), {}, ValueError,
     r'quantize_fp8: expected granularity to be one of "tensor", "row", "group" \(1x128\), "block" \(128x128\), '
     r'got "channel"'),
    ("block of 3-d", (torch.ones(2, 4, 8), "block"), {}, RuntimeError, r'granularity "block" \(128x128\) takes a 2-D'),
    ("dtype", (torch.ones(4, 8),), {"dtype": torch.bfloat16}, RuntimeError,
     r"quantize_fp8: expected dtype to be torch.float8_e4m3fn or torch.float8_e5m2, got torch.bfloat16"),
    ("scale shape", (torch.ones(4, 8), "row"), {"scale": torch.ones(4)}, RuntimeError,
     r'quantize_fp8: expected scale of shape \[4, 1\] for granularity "row" and input of shape \[4, 8\], got \[4\]'),
    ("scale and pow2", (torch.ones(4, 8), "tensor"), {"scale": torch.tensor(1.0), "pow2_scale": True}, RuntimeError,
     r"quantize_fp8: pow2_scale rounds computed scales"),
]


@pytest.mark.parametrize("case", QUANTIZE_BAD, ids=[c[0] for c in QUANTIZE_BAD])
def test_quantize_bad_inputs_and_the_fake_kernel_says_the_same(case):
    _, args, kwargs, error, pattern = case
    messages = []
    for device in ("cpu", "meta"):
        moved = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
        kw = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        with pytest.raises(error, match=pattern) as info:
            ops.quantize_fp8(*moved, **kw)
        messages.append(str(info.value).splitlines()[0])
    assert messages[0] == messages[1]


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


def test_quantize_opcheck_compile_and_no_grad():
    # Codes come row-major from every path (the kernel's and the formula's), as the fake kernel says: also
    # for transposed input, float64 (the formula) and per tensor or block (the formula).
    for x in (torch.randn(5, 200), torch.randn(200, 5).t(), torch.randn(200, 5, dtype=torch.float64).t(),
              torch.randn(32, 6, 4).transpose(0, 2)):
        for granularity in ("tensor", "row", "group", "block")[:4 if x.dim() == 2 else 3]:
            torch.library.opcheck(torch.ops.ops.quantize_fp8.default, (x, granularity), test_utils=OPCHECK_UTILS)
    torch.library.opcheck(torch.ops.ops.quantize_fp8.default, (torch.randn(3, 16), "row"),
                          {"scale": torch.ones(3, 1)}, test_utils=OPCHECK_UTILS)

    def f(x):
        q, s = ops.quantize_fp8(x, "group", pow2_scale=True)
        return q.float() * s.repeat_interleave(128, -1)[..., :x.shape[-1]]

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    for n in (3, 9):
        x = torch.randn(n, 200)
        torch.testing.assert_close(compiled(x), f(x))
    with pytest.raises(RuntimeError, match=r"quantize_fp8: not differentiable"):
        ops.quantize_fp8(torch.randn(2, 16, requires_grad=True))
    with torch.no_grad():
        ops.quantize_fp8(torch.randn(2, 16, requires_grad=True))


# ---- the fused forms -----------------------------------------------------------------------------

FUSED_GRANULARITIES = ["tensor", "row", "group"]


def same_codes(a, b):
    return torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8)) and torch.equal(a[1], b[1])


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


def test_fused_forms_static_scale_errors_and_modes():
    x, w = torch.randn(4, 32), torch.ones(32)
    s = torch.tensor(0.01)
    assert same_codes(ops.rms_norm_fp8(x, w, granularity="tensor", scale=s),
                      ops.quantize_fp8(ops.rms_norm(x, w), "tensor", scale=s))
    for fn, args, pattern in [
        (ops.rms_norm_fp8, (x, torch.ones(16)), r"rms_norm_fp8: expected weight of shape \(hidden,\) = \(32,\)"),
        (ops.rms_norm_fp8, (x, w, 1e-6, "channel"), r'rms_norm_fp8: expected granularity to be one of "tensor"'),
        (ops.fused_add_rms_norm_fp8, (x, torch.randn(4, 16), w), r"fused_add_rms_norm_fp8: expected residual of "
                                                                  r"input's shape \[4, 32\], got \[4, 16\]"),
        (ops.fused_add_rms_norm_fp8, (x, x, w), r"fused_add_rms_norm_fp8: .*residual.*input"),
        (ops.silu_and_mul_fp8, (torch.randn(4, 31),), r"silu_and_mul_fp8: expected input's last dimension to be even"),
    ]:
        messages = []
        for device in ("cpu", "meta"):
            moved = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
            if fn is ops.fused_add_rms_norm_fp8 and args[1] is x:
                moved[1] = moved[0]
            with pytest.raises((RuntimeError, ValueError), match=pattern) as info:
                fn(*moved)
            messages.append(str(info.value).splitlines()[0])
        assert messages[0] == messages[1], messages
    with pytest.raises(RuntimeError, match="rms_norm_fp8: not differentiable"):
        ops.rms_norm_fp8(x, w.clone().requires_grad_())
    opcheck = functools.partial(torch.library.opcheck, test_utils=OPCHECK_UTILS)
    opcheck(torch.ops.ops.rms_norm_fp8.default, (x, w), {"granularity": "group"})
    opcheck(torch.ops.ops.fused_add_rms_norm_fp8.default, (x, torch.randn(4, 32), w))
    opcheck(torch.ops.ops.silu_and_mul_fp8.default, (torch.randn(4, 64),))

    def block(x, r, w):  # a pre-norm step feeding an FP8 projection
        codes, scale = ops.fused_add_rms_norm_fp8(x, r, w)
        return codes.float() * scale, r

    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, dynamic=True)
    for n in (3, 7):
        x, r = torch.randn(n, 32), torch.randn(n, 32)
        r1, r2 = r.clone(), r.clone()
        torch.testing.assert_close(compiled(x, r1, w), block(x, r2, w))
        assert torch.equal(r1, r2)


def _fp8_calls():
    """(op name, its tensor arguments, a call taking them) for every FP8 op."""
    x, w = torch.randn(4, 32), torch.ones(32)
    codes, scale = ops.quantize_fp8(x, "tensor")
    return [
        ("quantize_fp8", ["input"], (x,), lambda a: ops.quantize_fp8(a)),
        ("rms_norm_fp8", ["input", "weight"], (x, w), lambda a, b: ops.rms_norm_fp8(a, b)),
        ("fused_add_rms_norm_fp8", ["input", "residual", "weight"], (x, x.clone(), w),
         lambda a, b, c: ops.fused_add_rms_norm_fp8(a, b, c)),
        ("silu_and_mul_fp8", ["input"], (x,), lambda a: ops.silu_and_mul_fp8(a)),
        ("scaled_gemm", ["A", "B"], (codes, codes.t()), lambda a, b: ops.scaled_gemm(a, b, scale, scale)),
    ]


def test_fp8_ops_name_a_missing_tensor():
    # Every tensor None: nothing to dispatch on but the Autograd kernel (grad mode), which names the first.
    for op, names, args, call in _fp8_calls():
        with pytest.raises(RuntimeError, match=rf"^{op}: {names[0]} must be a defined tensor, got None"):
            call(*[None] * len(args)) if op != "scaled_gemm" else ops.scaled_gemm(None, None, None, None)


@pytest.mark.parametrize("layout", ["sparse_coo", "nested", "nested_jagged"])
@pytest.mark.filterwarnings("ignore:.*(beta|prototype|deprecated).*:UserWarning")  # making the inputs
def test_fp8_ops_name_a_non_strided_argument(layout):
    convert = {"sparse_coo": lambda t: t.to_sparse(), "nested": lambda t: torch.nested.nested_tensor([t, t]),
               "nested_jagged": lambda t: torch.nested.nested_tensor([t, t], layout=torch.jagged)}[layout]
    for op, names, args, call in _fp8_calls():
        for i, name in enumerate(names):
            if args[i].dtype.itemsize == 1:
                continue  # torch makes no sparse or nested FP8 tensors
            bad = list(args)
            bad[i] = convert(args[i])
            with pytest.raises(RuntimeError, match=rf"^{op}: expected {name} to be a dense \(strided\) tensor"):
                call(*bad)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kwargs, pattern", [
    ({"granularity": "channel"}, "expected granularity"),
    ({"dtype": torch.float16}, "expected dtype"),
    ({"granularity": "tensor", "scale": torch.ones(3)}, "expected scale"),
    ({"granularity": "tensor", "scale": torch.ones(()), "pow2_scale": True}, "pow2_scale"),
    ({"granularity": "block"}, "block"),  # a 3-D input
])
def test_fused_add_rms_norm_fp8_leaves_residual_as_it_was_when_it_raises(device, kwargs, pattern):
    x, w = torch.randn(2, 4, 32, device=device), torch.ones(32, device=device)
    residual = torch.randn(2, 4, 32, device=device)
    before = residual.clone()
    kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    with pytest.raises((RuntimeError, ValueError), match=f"fused_add_rms_norm_fp8: .*{pattern}"):
        ops.fused_add_rms_norm_fp8(x, residual, w, **kwargs)
    assert torch.equal(residual, before) and residual._version == 0


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
    eps = {torch.float32: 2.0 ** -20, torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10}[out_dtype]
    scale = reference.abs().max()
    assert (ours - reference).abs().max() <= eps * scale and (theirs - reference).abs().max() <= eps * scale


def test_plan_names_the_path_on_cpu():
    A, B = fp8(8, 32), fp8(32, 16, seed=1)
    sa, sb, _, _ = recipe_scales("rowwise", 8, 32, 16)
    assert ops.fp8.plan(A, B, sa, sb, activation="silu") == {
        "recipe": "rowwise", "path": "formula", "reason": "the CPU runs the dequantized formula in ATen"}
    with pytest.raises(RuntimeError, match=r"scaled_gemm: expected K and N to be multiples of 16"):
        ops.fp8.plan(fp8(8, 24), fp8(24, 16, seed=1), sa, sb)
    with pytest.raises(ValueError, match=r"scaled_gemm: .*activation"):
        ops.fp8.plan(A, B, sa, sb, activation="tanh")


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
def test_the_sm90_kernels_against_the_float64_product(recipe, out_dtype, fast_accum):
    # Where the SM90 FP8 kernels are built and run (plan() says so), every epilogue, with and without a
    # bias, with operands read in place and through copies, and ragged M (37: blockwise scale_a rows padded
    # to 16 bytes); elsewhere torch._scaled_mm or the formula.
    A0, B0 = fp8(200, 512, device="cuda"), fp8(384, 512, seed=1, device="cuda").t()
    plan = ops.fp8.plan(A0, B0, *recipe_scales(recipe, 200, 512, 384, device="cuda")[:2], out_dtype=out_dtype,
                        use_fast_accum=fast_accum)
    capability = torch.cuda.get_device_capability()
    if capability == (9, 0) and ops.build_info.CANDIDATE_KERNELS:
        assert plan["path"] == "cutlass" and plan["kernel"].startswith("sm90_e4m3_"), plan
        # M = 1 below: every recipe runs swapped (D^T = B^T A^T on 128x32 tiles)
        small = ops.fp8.plan(A0[:1], B0, *recipe_scales(recipe, 1, 512, 384, device="cuda")[:2], out_dtype=out_dtype,
                             use_fast_accum=fast_accum)
        assert small["swap_ab"] and not plan["swap_ab"], small
    else:  # torch._scaled_mm for tensorwise and rowwise, unless torch has refused such a call here
        expected = "formula" if recipe.startswith("block") else "torch._scaled_mm"
        assert plan["path"] == expected or "torch._scaled_mm refused" in plan["reason"], plan
    eps = {torch.float32: 2.0 ** -20, torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10}[out_dtype]
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
                scale = z.abs().max()
                assert (got - reference).abs().max() <= eps * scale, (M, layout, act, bias is None)


@pytest.mark.cuda
@pytest.mark.parametrize("recipe", RECIPES)
def test_the_sm90_kernels_follow_a_forced_tactic(recipe):
    if torch.cuda.get_device_capability() != (9, 0) or not ops.build_info.CANDIDATE_KERNELS:
        pytest.skip("the SM90 FP8 kernels run on sm_90a in a build with OPS_CANDIDATE_KERNELS=1")
    A, B = fp8(200, 512, device="cuda"), fp8(384, 512, seed=1, device="cuda").t()
    sa, sb, ea, eb = recipe_scales(recipe, 200, 512, 384, device="cuda")
    plan = ops.fp8.plan(A, B, sa, sb)
    assert plan["tactic_source"] == "heuristic" and len(plan["candidates"]) == 2 and not plan["swap_ab"]
    assert set(plan["candidates"]) <= {k["name"] for k in ops.kernels("scaled_gemm")}
    z = (A.double() * ea) @ (B.double() * eb)
    try:
        for name in plan["candidates"]:  # unswapped (the heuristic's at M = 200), then swapped
            ops.gemm.set_tactic(name)
            assert ops.fp8.plan(A, B, sa, sb)["kernel"] == name
            assert (ops.scaled_gemm(A, B, sa, sb).double() - z).abs().max() <= 2.0 ** -7 * z.abs().max()
        ops.gemm.set_tactic(plan["candidates"][0] + "/dp")
        with pytest.raises(RuntimeError, match="scaled_gemm: the forced tactic .* cannot run this call"):
            ops.scaled_gemm(A, B, sa, sb)
    finally:
        ops.gemm.set_tactic(None)


@pytest.mark.cuda
def test_the_sm90_kernels_autotune_into_the_tuning_cache():
    if torch.cuda.get_device_capability() != (9, 0) or not ops.build_info.CANDIDATE_KERNELS:
        pytest.skip("the SM90 FP8 kernels run on sm_90a in a build with OPS_CANDIDATE_KERNELS=1")
    A, B = fp8(16, 512, device="cuda"), fp8(384, 512, seed=1, device="cuda").t()
    sa, sb, ea, eb = recipe_scales("rowwise", 16, 512, 384, device="cuda")
    z = (A.double() * ea) @ (B.double() * eb)
    ops.gemm.clear_tuning_cache()
    ops.gemm.set_autotune(True)
    try:
        plan = ops.fp8.plan(A, B, sa, sb)
        assert plan["tactic_source"] == "heuristic" and plan["swap_ab"]
        assert (ops.scaled_gemm(A, B, sa, sb).double() - z).abs().max() <= 2.0 ** -7 * z.abs().max()
        entry = next(e for e in ops.gemm.tuning_cache() if e["key"] == plan["tuning_key"])
        assert set(entry["timings_ms"]) == set(plan["candidates"]) and entry["best"] in plan["candidates"], entry
        tuned = ops.fp8.plan(A, B, sa, sb)
        assert tuned["tactic_source"] == "tuned" and tuned["kernel"] == entry["best"]
        assert (ops.scaled_gemm(A, B, sa, sb).double() - z).abs().max() <= 2.0 ** -7 * z.abs().max()
    finally:
        ops.gemm.set_autotune(False)
        ops.gemm.clear_tuning_cache()


@pytest.mark.parametrize("recipe", RECIPES)
def test_vmap_equals_a_loop_over_samples(recipe):
    batch, M, K, N = 3, 5, 256, 32
    A = torch.stack([fp8(M, K, seed=s) for s in range(batch)])
    B = fp8(K, N, seed=9)
    samples = [recipe_scales(recipe, M, K, N)[:2] for _ in range(batch)]
    sa = torch.stack([s[0] * (i + 1) for i, s in enumerate(samples)])
    sb = samples[0][1]

    def loop(As, sas, Bs=None, sbs=None):
        return torch.stack([ops.scaled_gemm(As[i], B if Bs is None else Bs[i], sas[i], sb if sbs is None else sbs[i],
                                            out_dtype=torch.float32) for i in range(batch)])

    f = lambda a, s: ops.scaled_gemm(a, B, s, sb, out_dtype=torch.float32)  # noqa: E731
    # One GEMM of batch * M rows: BLAS may sum in another order than for M rows.
    torch.testing.assert_close(torch.vmap(f)(A, sa), loop(A, sa), rtol=1e-4, atol=1e-3)
    # batched B and scale_b, batch dimension last: one call per sample
    Bs = torch.stack([fp8(K, N, seed=20 + i) for i in range(batch)], -1)
    sbs = torch.stack([sb] * batch, -1)
    g = lambda b, s: ops.scaled_gemm(A[0], b, sa[0], s, out_dtype=torch.float32)  # noqa: E731
    expected = torch.stack([ops.scaled_gemm(A[0], Bs[..., i], sa[0], sbs[..., i], out_dtype=torch.float32)
                            for i in range(batch)])
    assert torch.equal(torch.vmap(g, in_dims=(-1, -1))(Bs, sbs), expected)
    empty = torch.vmap(f)(A[:0], sa[:0])
    assert empty.shape == (0, M, N) and empty.dtype == torch.float32


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


def test_a_call_torch_scaled_mm_refuses_takes_the_formula_and_its_kind_is_not_asked_again():
    # torch._scaled_mm's CPU kernel replaced by one that refuses (as torch does on a GPU without FP8, or for a
    # dtype it lacks): the path says no, naming torch's message, and asks torch no more for that kind of call.
    from conftest import REPO, run_python

    code = r"""
import torch, ops
calls = []
def refuse(*args, **kwargs):
    calls.append(1)
    raise RuntimeError("this device has no FP8 GEMM")
lib = torch.library.Library("aten", "IMPL")
lib.impl("_scaled_mm", refuse, "CPU")
A = torch.randn(16, 64).to(torch.float8_e4m3fn)
B = torch.randn(32, 64).to(torch.float8_e4m3fn).t()
s = torch.tensor(0.5)
for _ in range(2):
    try:
        torch.ops.ops._scaled_gemm_torch_path(A, B, s, s)
        raise SystemExit("taken")
    except RuntimeError as e:
        assert "torch._scaled_mm refused cpu tensorwise Float8_e4m3fn x Float8_e4m3fn -> BFloat16" in str(e), e
        assert "this device has no FP8 GEMM" in str(e), e
assert len(calls) == 1, calls
try:
    torch.ops.ops._scaled_gemm_torch_path(A, B, s, s, out_dtype=torch.float32)  # another kind: asked again
    raise SystemExit("taken")
except RuntimeError as e:
    assert "-> Float: " in str(e), e
assert len(calls) == 2
try:
    torch.ops.ops._scaled_gemm_torch_path(A, B, s, s, use_fast_accum=True)  # fast accumulation: another kind
    raise SystemExit("taken")
except RuntimeError as e:
    assert "BFloat16 fast accumulation: " in str(e), e
assert len(calls) == 3
plan = ops.fp8.plan(A, B, s, s)  # CPU: the formula, whatever torch does
assert plan["path"] == "formula", plan
print("ok")
"""
    result = run_python(code, cwd=REPO)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
