"""FP8 recipes and API. ops.scaled_gemm: recipes told apart by scale shapes, scales on another device, the out
variant's rules, plan() and tactics, TorchScript with None options, vmap of every recipe; the FP8 ops' errors for
missing tensors and aliased or left-unwritten residuals. Values: test_fp8_numerics.py. The modes of every op
(values, bad inputs, autograd's refusal, opcheck, torch.compile, torch.export, TorchScript, vmap): test_modes.py
and test_vmap.py over tests/op_registry.py."""

import pytest
import torch

import ops
from conftest import DEVICES
from fp8_support import RECIPES, fp8, recipe_scales, scales
from op_registry import scaled_gemm_args


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


def test_scales_on_another_device():
    with pytest.raises(RuntimeError, match=r"scaled_gemm: expected scale_b on cpu \(A's device\), got meta"):
        ops.scaled_gemm(**scaled_gemm_args(scale_b=torch.tensor(1.0, device="meta")))


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


def test_torchscript_takes_none_options_and_scripts_fp8_linear():
    # Every argument positional with None for bias and out_dtype (the registry's model passes both), and
    # ops.nn.Fp8Linear of each recipe scripted.
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


def test_fused_add_rms_norm_fp8_refuses_its_input_as_residual():
    # The residual it writes may not be the input it reads; the fake kernel says the same.
    x, w = torch.randn(4, 32), torch.ones(32)
    messages = []
    for device in ("cpu", "meta"):
        t = x.to(device)
        with pytest.raises(RuntimeError, match=r"fused_add_rms_norm_fp8: .*residual.*input") as info:
            ops.fused_add_rms_norm_fp8(t, t, w.to(device))
        messages.append(str(info.value).splitlines()[0])
    assert messages[0] == messages[1], messages


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
        "kind": "scaled", "path": "formula", "kernel": None, "recipe": "rowwise",
        "reason": "the CPU runs the dequantized formula in ATen"}
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
