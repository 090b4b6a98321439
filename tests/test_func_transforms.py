"""cutlass_gemm under torch.func transforms, forward-mode AD and compiled autograd.

Its autograd kernel is written in C++ as an autograd graph node (csrc/autograd.cpp), the way ATen's own
ops are, so that the transforms that support ATen ops support it too: torch.func.grad / vjp / jacrev /
hessian (reverse mode, nested), forward-mode AD (torch.autograd.forward_ad, torch.func.jvp / jacfwd,
checked numerically by gradcheck's forward-AD mode), vmap, and compiled autograd. Each result is
compared with the same function written with torch.mm.
"""

import pytest
import torch
import torch.autograd.forward_ad as fwAD

import ops
from conftest import DEVICES


def inputs(device, M=5, K=7, N=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(M, K, generator=g, dtype=torch.float64).to(device)
    B = torch.randn(K, N, generator=g, dtype=torch.float64).to(device)
    return A, B


def loss(matmul):
    return lambda A, B: matmul(A, B).sin().sum()


OURS, THEIRS = loss(ops.cutlass_gemm), loss(torch.mm)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("transform", ["grad", "jacrev", "jacfwd", "hessian"])
# Forward mode loads torch._decomp.decompositions_for_jvp on first use, which scripts its decompositions.
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_func_transform_matches_torch_mm(device, transform):
    A, B = inputs(device)
    f = {"grad": lambda fn: torch.func.grad(fn, argnums=(0, 1)),
         "jacrev": lambda fn: torch.func.jacrev(fn, argnums=(0, 1)),
         "jacfwd": lambda fn: torch.func.jacfwd(fn, argnums=(0, 1)),
         "hessian": lambda fn: torch.func.hessian(fn, argnums=0)}[transform]
    torch.testing.assert_close(f(OURS)(A, B), f(THEIRS)(A, B))


@pytest.mark.parametrize("device", DEVICES)
def test_vjp_and_jvp(device):
    A, B = inputs(device)
    out, vjp_fn = torch.func.vjp(ops.cutlass_gemm, A, B)
    ref, ref_vjp_fn = torch.func.vjp(torch.mm, A, B)
    cotangent = torch.randn_like(ref)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(vjp_fn(cotangent), ref_vjp_fn(cotangent))
    tangents = (torch.randn_like(A), torch.randn_like(B))
    torch.testing.assert_close(torch.func.jvp(ops.cutlass_gemm, (A, B), tangents),
                               torch.func.jvp(torch.mm, (A, B), tangents))


@pytest.mark.parametrize("device", DEVICES)
def test_forward_ad_dual_tensors(device):
    A, B = inputs(device)
    dA, dB = torch.randn_like(A), torch.randn_like(B)
    with fwAD.dual_level():
        for tA, tB in [(dA, None), (None, dB), (dA, dB)]:
            a = fwAD.make_dual(A, tA) if tA is not None else A
            b = fwAD.make_dual(B, tB) if tB is not None else B
            primal, tangent = fwAD.unpack_dual(ops.cutlass_gemm(a, b))
            expected = sum(t for t in [tA @ B if tA is not None else None,
                                       A @ tB if tB is not None else None] if t is not None)
            torch.testing.assert_close(primal, A @ B)
            torch.testing.assert_close(tangent, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_forward_and_reverse_modes(device):
    A, B = inputs(device)
    A.requires_grad_(True)
    B.requires_grad_(True)
    assert torch.autograd.gradcheck(ops.cutlass_gemm, (A, B), check_forward_ad=True, check_backward_ad=True)
    assert torch.autograd.gradgradcheck(ops.cutlass_gemm, (A, B), check_fwd_over_rev=True)


@pytest.mark.parametrize("device", DEVICES)
def test_vmap_and_vmap_of_grad(device):
    A, B = inputs(device)
    batch = torch.stack([A, 2 * A, -A])
    torch.testing.assert_close(torch.func.vmap(ops.cutlass_gemm, in_dims=(0, None))(batch, B),
                               torch.func.vmap(torch.mm, in_dims=(0, None))(batch, B))
    per_sample = torch.func.vmap(torch.func.grad(OURS), in_dims=(0, None))(batch, B)
    expected = torch.func.vmap(torch.func.grad(THEIRS), in_dims=(0, None))(batch, B)
    torch.testing.assert_close(per_sample, expected)


def compiled_autograd_grads(loss_fn, leaves):
    """Gradients of loss_fn(*leaves) with the backward run by compiled autograd: the forward runs
    eagerly (so the graph holds the ops' own C++ nodes) and `.backward()` is called inside a compiled
    function, which is where compiled autograd takes over. Asserts that it really captured a graph."""
    from torch._dynamo.utils import counters

    leaves = [t.detach().clone().requires_grad_(True) for t in leaves]
    loss = loss_fn(*leaves)
    torch._dynamo.reset()
    counters.clear()
    with torch._dynamo.config.patch(compiled_autograd=True):
        torch.compile(lambda: loss.backward(), backend="aot_eager")()
    assert counters["compiled_autograd"]["captures"] >= 1, dict(counters["compiled_autograd"])
    torch._dynamo.reset()
    return [t.grad for t in leaves]


def eager_grads(loss_fn, leaves):
    leaves = [t.detach().clone().requires_grad_(True) for t in leaves]
    loss_fn(*leaves).backward()
    return [t.grad for t in leaves]


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_autograd(device):
    A, B = inputs(device)
    torch.testing.assert_close(compiled_autograd_grads(OURS, [A, B]), eager_grads(THEIRS, [A, B]))
    # Twice through the op (the second node's inputs come from the first), and double use of A.
    chain = lambda A, B: ops.cutlass_gemm(ops.cutlass_gemm(A, B).t(), A).sum()  # noqa: E731
    chain_ref = lambda A, B: torch.mm(torch.mm(A, B).t(), A).sum()  # noqa: E731
    torch.testing.assert_close(compiled_autograd_grads(chain, [A, B]), eager_grads(chain_ref, [A, B]))


def test_grad_mode_off_records_nothing():
    A, B = inputs("cpu")
    A.requires_grad_(True)
    with torch.no_grad():
        C = ops.cutlass_gemm(A, B)
    assert C.grad_fn is None and not C.requires_grad
    C = ops.cutlass_gemm(A, B)
    assert C.grad_fn.name() == "CutlassGemmBackward"


# ---- linear (same C++ autograd structure, activation derivatives from ATen) ----------------------

ACTS = {"none": lambda z: z, "relu": torch.relu, "gelu": torch.nn.functional.gelu,
        "gelu_tanh": lambda z: torch.nn.functional.gelu(z, approximate="tanh"), "silu": torch.nn.functional.silu}


def linear_inputs(device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 6, generator=g, dtype=torch.float64).to(device)
    w = torch.randn(4, 6, generator=g, dtype=torch.float64).to(device)
    b = torch.randn(4, generator=g, dtype=torch.float64).to(device)
    return x, w, b


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", list(ACTS))
def test_linear_gradcheck_forward_and_reverse_modes(device, activation):
    x, w, b = (t.requires_grad_(True) for t in linear_inputs(device))
    fn = lambda x, w, b: ops.linear(x, w, b, activation)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, w, b), check_forward_ad=True, check_backward_ad=True)
    assert torch.autograd.gradgradcheck(fn, (x, w, b), check_fwd_over_rev=True)
    assert torch.autograd.gradcheck(lambda x, w: ops.linear(x, w, None, activation), (x, w),
                                    check_forward_ad=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", ["none", "gelu"])
def test_linear_func_transforms_and_compiled_autograd(device, activation):
    x, w, b = linear_inputs(device)
    ours = lambda x, w, b: ops.linear(x, w, b, activation).sin().sum()  # noqa: E731
    theirs = lambda x, w, b: ACTS[activation](torch.nn.functional.linear(x, w, b)).sin().sum()  # noqa: E731
    for transform in (torch.func.grad, torch.func.jacrev, torch.func.jacfwd):
        torch.testing.assert_close(transform(ours, argnums=(0, 1, 2))(x, w, b),
                                   transform(theirs, argnums=(0, 1, 2))(x, w, b))
    torch.testing.assert_close(compiled_autograd_grads(ours, [x, w, b]), eager_grads(theirs, [x, w, b]))


# ---- rms_norm, silu_and_mul ----------------------------------------------------------------------

def _rms_norm_ref(x, w, eps=1e-6):
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * w


def _silu_and_mul_ref(x):
    a, b = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(a) * b


@pytest.mark.parametrize("device", DEVICES)
def test_rms_norm_and_silu_and_mul_all_modes(device):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 8, generator=g, dtype=torch.float64).to(device).requires_grad_(True)
    w = torch.randn(8, generator=g, dtype=torch.float64).to(device).requires_grad_(True)
    rms = lambda x, w: ops.rms_norm(x, w, 1e-6)  # noqa: E731
    for fn, args, ref in [(rms, (x, w), _rms_norm_ref), (ops.silu_and_mul, (x,), _silu_and_mul_ref)]:
        assert torch.autograd.gradcheck(fn, args, check_forward_ad=True, check_backward_ad=True)
        assert torch.autograd.gradgradcheck(fn, args, check_fwd_over_rev=True)
        plain = tuple(a.detach() for a in args)
        argnums = tuple(range(len(args)))
        loss_ours = lambda *a: fn(*a).sin().sum()  # noqa: E731
        loss_ref = lambda *a: ref(*a).sin().sum()  # noqa: E731
        for transform in (torch.func.grad, torch.func.jacfwd):
            torch.testing.assert_close(transform(loss_ours, argnums=argnums)(*plain),
                                       transform(loss_ref, argnums=argnums)(*plain))
        torch.testing.assert_close(compiled_autograd_grads(loss_ours, plain), eager_grads(loss_ref, plain))


def test_every_differentiable_op_has_its_autograd_kernel_in_cpp():
    # No Python autograd kernel left on the call path (csrc/autograd.cpp registers them all).
    for name in ("cutlass_gemm", "linear", "rms_norm", "silu_and_mul"):
        table = torch._C._dispatch_dump_table(f"ops::{name}")
        rows = [r for r in table.splitlines() if r.startswith(("AutogradCPU:", "AutogradCUDA:"))]
        assert len(rows) == 2 and all("csrc/autograd.cpp" in r for r in rows), table


def test_zero_sized_feature_dimensions():
    # K = 0 gives act(bias); N = 0 an empty output; a 0-wide rms_norm differentiates to empty grads.
    for x, w, b in [(torch.randn(3, 0), torch.randn(5, 0), torch.randn(5)),
                    (torch.randn(2, 3, 4), torch.randn(0, 4), torch.randn(0))]:
        x, w, b = (t.double().requires_grad_(True) for t in (x, w, b))
        for activation in ("none", "gelu"):
            y = ops.linear(x, w, b, activation)
            ref = ACTS[activation](torch.nn.functional.linear(x, w, b))
            torch.testing.assert_close(y, ref)
            grads = torch.autograd.grad(y.sum(), (x, w, b), allow_unused=True)
            expected = torch.autograd.grad(ref.sum(), (x, w, b), allow_unused=True)
            for g, e in zip(grads, expected):
                torch.testing.assert_close(g if g is not None else torch.zeros_like(e), e)
    x = torch.randn(3, 0, requires_grad=True)
    w = torch.randn(0, requires_grad=True)
    ops.rms_norm(x, w).sum().backward()
    assert x.grad.shape == (3, 0) and w.grad.shape == (0,)


def test_rms_norm_one_dimensional_weight_gradient():
    # A 1-D input has no leading dimension to sum the weight gradient over.
    x = torch.randn(8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: ops.rms_norm(x, w), (x, w))


def _refusal_cases():
    """(op, argument, call(tensors) -> None, tensors, written): every op call that does not differentiate,
    with the argument given a derivative and the tensors the call writes."""
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    x, res, w = r(4, 32), r(4, 32), r(32)
    A, B, codes_b = r(3, 32), r(32, 16), r(32, 16).to(torch.float8_e4m3fn)
    codes_a = A.to(torch.float8_e4m3fn)
    one = torch.tensor(1.0)
    cases = [
        ("fused_add_rms_norm", "residual", lambda t: ops.fused_add_rms_norm(t["input"], t["residual"], t["weight"]),
         {"input": x, "residual": res, "weight": w}, ("input", "residual")),
        ("fused_add_rms_norm", "weight", lambda t: ops.fused_add_rms_norm(t["input"], t["residual"], t["weight"]),
         {"input": x, "residual": res, "weight": w}, ("input", "residual")),
        ("cutlass_gemm", "out", lambda t: ops.cutlass_gemm(t["A"], t["B"], out=t["out"]),
         {"A": A, "B": B, "out": torch.zeros(3, 16)}, ("out",)),
        ("cutlass_gemm", "A", lambda t: ops.cutlass_gemm(t["A"], t["B"], out=t["out"]),
         {"A": A, "B": B, "out": torch.zeros(3, 16)}, ("out",)),
        ("grouped_gemm", "A", lambda t: ops.grouped_gemm(t["A"], t["B"], None, out=t["out"]),
         {"A": r(2, 3, 8), "B": r(2, 8, 5), "out": torch.zeros(2, 3, 5)}, ("out",)),
        ("scaled_gemm", "scale_a", lambda t: ops.scaled_gemm(codes_a, codes_b, t["scale_a"], one, t["bias"],
                                                             out_dtype=torch.float32),
         {"scale_a": one.clone(), "bias": r(16)}, ()),
        ("scaled_gemm", "bias", lambda t: ops.scaled_gemm(codes_a, codes_b, t["scale_a"], one, t["bias"],
                                                          out=t["out"]),
         {"scale_a": one.clone(), "bias": r(16), "out": torch.zeros(3, 16)}, ("out",)),
        ("quantize_fp8", "input", lambda t: ops.quantize_fp8(t["input"]), {"input": x}, ()),
        ("quantize_fp8", "scale", lambda t: ops.quantize_fp8(t["input"], "tensor", scale=t["scale"]),
         {"input": x, "scale": one.clone()}, ()),
        ("rms_norm_fp8", "weight", lambda t: ops.rms_norm_fp8(t["input"], t["weight"]),
         {"input": x, "weight": w}, ()),
        ("fused_add_rms_norm_fp8", "input", lambda t: ops.fused_add_rms_norm_fp8(t["input"], t["residual"],
                                                                                 t["weight"]),
         {"input": x, "residual": res, "weight": w}, ("residual",)),
        ("silu_and_mul_fp8", "input", lambda t: ops.silu_and_mul_fp8(t["input"]), {"input": r(4, 64)}, ()),
        ("_rms_norm_tensor_eps", "eps", lambda t: torch.ops.ops._rms_norm_tensor_eps(t["input"], t["weight"],
                                                                                      t["eps"]),
         {"input": x, "weight": w, "eps": torch.tensor(1e-6, dtype=torch.float64)}, ()),
        ("_fused_add_rms_norm_tensor_eps", "residual",
         lambda t: torch.ops.ops._fused_add_rms_norm_tensor_eps(t["input"], t["residual"], t["weight"], t["eps"]),
         {"input": x, "residual": res, "weight": w, "eps": torch.tensor(1e-6, dtype=torch.float64)},
         ("input", "residual")),
    ]
    return cases


REFUSALS = _refusal_cases()


@pytest.mark.parametrize("case", REFUSALS, ids=[f"{c[0]}-{c[1]}" for c in REFUSALS])
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_ops_that_do_not_differentiate_refuse_a_derivative_by_name_in_both_modes(case):
    # A result that silently lacks a derivative is wrong: reverse mode (grad mode on) and forward mode
    # (any grad mode, as ATen's out= ops) both raise, naming the op and the argument, before writing anything.
    op, name, call, tensors, written = case
    tensors = {k: v.clone() for k, v in tensors.items()}
    before = {k: tensors[k].clone() for k in written}
    with pytest.raises(RuntimeError, match=rf"^{op}: .*, but {name} requires grad\. "):
        call({**tensors, name: tensors[name].clone().requires_grad_()})
    with fwAD.dual_level():
        dual = fwAD.make_dual(tensors[name], torch.ones_like(tensors[name]))
        for grad_mode in (True, False):
            with torch.set_grad_enabled(grad_mode), pytest.raises(
                    NotImplementedError, match=rf"^{op}: .*, but {name} has a forward-mode AD tangent"):
                call({**tensors, name: dual})
    for k in written:
        assert torch.equal(tensors[k], before[k]), k
    with torch.no_grad():  # no derivative asked for: the call runs
        call(tensors)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_jvp_through_an_op_that_does_not_differentiate_raises():
    # torch.func.jvp (functorch's forward mode) reaches the same check.
    w = torch.randn(16)

    def step(x, r):
        x, r = x.clone(), r.clone()
        ops.fused_add_rms_norm(x, r, w)
        return r

    x, r = torch.randn(4, 16), torch.randn(4, 16)
    with pytest.raises(NotImplementedError, match="fused_add_rms_norm: .*, but input has a forward-mode AD tangent"):
        torch.func.jvp(step, (x, r), (torch.ones_like(x), torch.ones_like(r)))
    with pytest.raises(NotImplementedError, match="quantize_fp8: .*, but input has a forward-mode AD tangent"):
        torch.func.jvp(lambda x: ops.quantize_fp8(x)[1], (x,), (torch.ones_like(x),))
