"""FP8 recipes and API. ops.scaled_gemm: recipes told apart by scale shapes, bad inputs (the fake kernel says the
same), the out variant, not differentiable, plan() and tactics; the FP8 ops' errors for missing and non-strided
tensors, and their modes (opcheck, torch.compile, torch.export, TorchScript, vmap)."""

import functools

import pytest
import torch

import ops
from conftest import DEVICES
from fp8_support import E4, E5, OPCHECK_UTILS, RECIPES, fp8, recipe_scales, same_codes, scales


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


def test_plan_names_the_path_on_cpu():
    A, B = fp8(8, 32), fp8(32, 16, seed=1)
    sa, sb, _, _ = recipe_scales("rowwise", 8, 32, 16)
    assert ops.fp8.plan(A, B, sa, sb, activation="silu") == {
        "recipe": "rowwise", "path": "formula", "reason": "the CPU runs the dequantized formula in ATen"}
    with pytest.raises(RuntimeError, match=r"scaled_gemm: expected K and N to be multiples of 16"):
        ops.fp8.plan(fp8(8, 24), fp8(24, 16, seed=1), sa, sb)
    with pytest.raises(ValueError, match=r"scaled_gemm: .*activation"):
        ops.fp8.plan(A, B, sa, sb, activation="tanh")


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
