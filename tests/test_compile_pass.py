"""The torch.compile pass (ops.compile): which formulas it rewrites into the ops, in inference and
training graphs, that the results stay those of the uncompiled code, and what it leaves alone. CI runs
this file on two torch versions (.ci/run)."""

import functools

import pytest
import torch
import torch.nn.functional as F

import ops


@pytest.fixture(autouse=True)
def fresh_compiles():
    """Every compile here runs the pass: Inductor's caches would serve graphs compiled by an earlier test
    or process without running it again."""
    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False):
        yield
    torch._dynamo.reset()


def compiled(fn, patterns=ops.compile.PATTERNS, **kwargs):
    backend = ops.compile.backend(patterns)
    return torch.compile(fn, backend=backend, fullgraph=True, **kwargs), backend


def only(counts, **expected):
    return {name: counts[name] for name in ops.compile.PATTERNS} == {name: expected.get(name, 0)
                                                                       for name in ops.compile.PATTERNS}


def hf_norm(x, w, eps=1e-6):
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


ACTS = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": functools.partial(F.gelu, approximate="tanh"), "silu": F.silu}


@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(5, 16), (2, 5, 16)], ids=["2d", "3d"])
def test_linear_act_becomes_ops_linear(act, bias, shape):
    torch.manual_seed(0)
    x, w = torch.randn(shape), torch.randn(24, 16)
    b = torch.randn(24) if bias else None

    def f(x, w, b):
        return ACTS[act](F.linear(x, w, b))

    fn, backend = compiled(f)
    torch.testing.assert_close(fn(x, w, b), f(x, w, b))
    assert only(backend.counts, linear_act=1), backend.counts


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("formula", ["F.rms_norm", "hand-written"])
def test_rms_norm_formulas_become_ops_rms_norm(dtype, formula):
    torch.manual_seed(0)
    x, w = torch.randn(3, 7, 64, dtype=dtype), torch.rand(64, dtype=dtype) + 0.5
    f = (lambda x, w: F.rms_norm(x, (64,), w, 1e-5)) if formula == "F.rms_norm" else (lambda x, w: hf_norm(x, w, 1e-5))
    fn, backend = compiled(f)
    # Half types: the formula rounds x_hat before the weight multiply, ops.rms_norm rounds once. The
    # hand-written norm computes float64 input in float32 (Inductor's code rounds unlike eager there).
    tol = {torch.bfloat16: 1e-2, torch.float16: 2e-3}.get(dtype)
    if dtype == torch.float64 and formula == "hand-written":
        tol = 1e-5
    torch.testing.assert_close(fn(x, w), f(x, w), atol=tol, rtol=tol)
    # The hand-written norm computes float64 input in float32: replacing it would change its rounding.
    rewrites = 0 if (dtype == torch.float64 and formula == "hand-written") else 1
    assert only(backend.counts, rms_norm=rewrites), backend.counts


def test_residual_add_and_norm_become_fused_add_rms_norm():
    torch.manual_seed(0)
    x, r, w = torch.randn(4, 32), torch.randn(4, 32), torch.rand(32) + 0.5

    def layer(x, r, w):
        h = r + x
        return hf_norm(h, w) * 2, h + 1  # the sum is used again, as a decoder's residual stream is

    fn, backend = compiled(layer)
    x0, r0 = x.clone(), r.clone()
    got, expected = fn(x, r, w), layer(x, r, w)
    torch.testing.assert_close(got, expected)
    assert torch.equal(x, x0) and torch.equal(r, r0)  # the in-place op works on copies of graph inputs
    assert only(backend.counts, fused_add_rms_norm=1), backend.counts


@pytest.mark.parametrize("halves", ["chunk", "slices"])
@pytest.mark.parametrize("order", ["silu(a) * b", "b * silu(a)"])
def test_silu_times_mul_of_halves_becomes_silu_and_mul(halves, order):
    x = torch.randn(3, 5, 48)

    def f(x):
        a, b = x.chunk(2, dim=-1) if halves == "chunk" else (x[..., :24], x[..., 24:])
        return F.silu(a) * b if order == "silu(a) * b" else b * F.silu(a)

    fn, backend = compiled(f)
    torch.testing.assert_close(fn(x), f(x))
    assert only(backend.counts, silu_and_mul=1), backend.counts


def test_what_does_not_compute_the_same_is_left_alone():
    torch.manual_seed(0)
    x, w = torch.randn(6, 32), torch.rand(32) + 0.5

    def f(x, w):
        xf = x.float()
        over_rows = w * (xf * torch.rsqrt(xf.pow(2).mean(0, keepdim=True) + 1e-6))  # the mean over dim 0
        fourth = w * (xf * torch.rsqrt(xf.pow(4).mean(-1, keepdim=True) + 1e-6))
        a, b = x.chunk(2, dim=0)  # halves of the first dimension
        return over_rows, fourth, F.silu(a) * b, F.gelu(F.linear(x, x) + 1)  # + 1 between GEMM and act

    # Left alone means the graph Inductor compiles without the pass: the same values, bit for bit.
    stock = torch.compile(f, fullgraph=True)
    fn, backend = compiled(f)
    for got, expected in zip(fn(x, w), stock(x, w)):
        assert torch.equal(got, expected)
    assert only(backend.counts), backend.counts
    # A weight of another dtype (promotes the product): not ops.rms_norm's contract.
    g, backend = compiled(lambda x, w: hf_norm(x, w))
    assert torch.equal(g(x.bfloat16(), w), torch.compile(lambda x, w: hf_norm(x, w))(x.bfloat16(), w))
    assert only(backend.counts), backend.counts


def test_a_graph_with_nothing_to_match_is_unchanged():
    def f(x):
        return torch.tanh(x) @ x.t() + 1

    x = torch.randn(8, 8)
    fn, backend = compiled(f)
    torch.testing.assert_close(fn(x), f(x))
    assert only(backend.counts)


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm_weight = torch.nn.Parameter(torch.rand(32) + 0.5)
        self.fc = torch.nn.Linear(32, 64)
        self.gate_up = torch.nn.Linear(32, 128)

    def forward(self, x):
        h = hf_norm(x, self.norm_weight)
        a, b = self.gate_up(h).chunk(2, dim=-1)
        return F.gelu(self.fc(h)) + F.silu(a) * b


def test_training_graphs_use_the_ops_autograd():
    torch.manual_seed(0)
    model = _Block()
    x = torch.randn(4, 7, 32, requires_grad=True)
    fn, backend = compiled(model)
    got = fn(x)
    got.sum().backward()
    grads = [x.grad] + [p.grad for p in model.parameters()]
    x.grad = None
    model.zero_grad()
    expected = model(x)
    expected.sum().backward()
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    for g, e in zip(grads, [x.grad] + [p.grad for p in model.parameters()]):
        torch.testing.assert_close(g, e, atol=1e-4, rtol=1e-4)
    assert only(backend.counts, rms_norm=1, silu_and_mul=1, linear_act=1), backend.counts


def test_default_rules_per_device_and_the_users_own_inductor_config():
    x, w, small = torch.randn(4, 4096), torch.randn(48, 4096), torch.randn(4, 128)

    def f(x, w, small):
        return (F.gelu(F.linear(x, w)), hf_norm(x, w[0]), F.silu(x[:, :2048]) * x[:, 2048:],
                hf_norm(small, small[0]))  # a row of 128: not measured faster on CPU

    fusion = ops.compile.FusionPass()  # the measured rules: on CPU no linear_act, norms from hidden 512
    with torch._inductor.config.patch(joint_custom_pre_pass=fusion):
        fn = torch.compile(f, fullgraph=True)
        for got, expected in zip(fn(x, w, small), f(x, w, small)):
            torch.testing.assert_close(got, expected)
    assert only(fusion.counts, rms_norm=1, silu_and_mul=1), fusion.counts
    assert set(ops.compile.RULES["cpu"]) == {"rms_norm", "fused_add_rms_norm", "silu_and_mul"}


def test_dynamic_shapes():
    # Symbolic sizes are matched. (torch.compile(dynamic=True) also passes Python floats such as eps as
    # graph inputs; a norm whose eps is a traced value is left alone: ops.rms_norm takes a number.)
    fn, backend = compiled(lambda x, w: hf_norm(x, w))
    w = torch.rand(32) + 0.5
    for rows in (3, 5, 9):
        x = torch.randn(rows, 32)
        torch._dynamo.mark_dynamic(x, 0)
        torch.testing.assert_close(fn(x, w), hf_norm(x, w))
    assert backend.counts["rms_norm"] == 1, backend.counts  # one graph, for every number of rows


def test_pass_identity_and_errors():
    with pytest.raises(ValueError, match=r"ops.compile.FusionPass: unknown patterns \['gemm'\]"):
        ops.compile.FusionPass(["gemm", "rms_norm"])
    a, b, c = ops.compile.FusionPass(), ops.compile.FusionPass(), ops.compile.FusionPass(["rms_norm"])
    assert a.uuid() == b.uuid() != c.uuid()  # the FX graph cache tells graphs compiled with other rules apart
    assert torch._inductor.config.joint_custom_pre_pass is None  # import ops switches nothing on


def test_a_residual_updated_in_place_keeps_its_sum():
    # r.add_(x) then the norm of r: the caller's r must hold x + r afterwards, as in eager.
    def layer(x, r, w):
        r.add_(x)
        return hf_norm(r, w)

    def layer_out_of_place(x, r, w):
        r.copy_(x + r)
        return hf_norm(r, w)

    torch.manual_seed(0)
    x, r0, w = torch.randn(4, 16), torch.randn(4, 16), torch.rand(16) + 0.5
    for f in (layer, layer_out_of_place):
        torch._dynamo.reset()
        fn, backend = compiled(f)
        r_eager, r_compiled = r0.clone(), r0.clone()
        torch.testing.assert_close(fn(x, r_compiled, w), f(x, r_eager, w))
        torch.testing.assert_close(r_compiled, r_eager, msg=f.__name__)
        assert backend.counts["fused_add_rms_norm"] == (f is layer_out_of_place), backend.counts


def test_broadcasting_weights_and_biases_are_left_alone():
    # Valid PyTorch whose weights broadcast: not the ops' contract (weight (hidden,), bias (N,)).
    torch.manual_seed(0)
    x, r = torch.randn(8, 16), torch.randn(1, 16)
    cases = [(lambda x: hf_norm(x, torch.ones(1, 16) * 2)), (lambda x: hf_norm(x, x[:1].abs())),
             (lambda x: F.gelu(F.linear(x, x[:8], x[0, :1]))), (lambda x: F.silu(F.linear(x, x[:8], x[:, :8])))]
    for f in cases:
        torch._dynamo.reset()
        fn, backend = compiled(f)
        torch.testing.assert_close(fn(x), f(x))
        assert only(backend.counts), backend.counts
    # A residual that broadcasts: no fused add (the op writes both in place), the norm of the sum alone.
    torch._dynamo.reset()
    fn, backend = compiled(lambda x: hf_norm(x + r, torch.ones(16)))
    torch.testing.assert_close(fn(x), hf_norm(x + r, torch.ones(16)))
    assert only(backend.counts, rms_norm=1), backend.counts
