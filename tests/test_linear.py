"""ops.linear: values against a float64 reference for every dtype, activation and bias choice, input ranks
and layouts, empty problems; bad inputs give the op's own error, the same from the fake kernel. The mode
tests (autograd, opcheck, compile, export, vmap, ...) run through tests/op_registry.py; the CUDA kernels'
every tactic is in test_gemm_cuda.py."""

import pytest
import torch
import torch.nn.functional as F

import ops
from conftest import DEVICES

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
ACTIVATIONS = ["none", "relu", "gelu", "gelu_tanh", "silu"]
# Relative tolerance: the output's rounding (half types: one rounding after an fp32 epilogue), and
# the accumulation of K products for float32 (TF32 is off by default, as for torch.mm).
RTOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5, torch.float64: 1e-12}


def reference(x, w, b, activation):
    z = F.linear(x.double(), w.double(), None if b is None else b.double())
    return {"none": lambda v: v, "relu": F.relu, "gelu": F.gelu, "silu": F.silu,
            "gelu_tanh": lambda v: F.gelu(v, approximate="tanh")}[activation](z)


def rand(*shape, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) / 4).to(dtype=dtype, device=device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
def test_cpu_values_are_the_bits_of_f_linear_and_the_activation(dtype, activation, with_bias):
    x = rand(2, 3, 40, dtype=dtype, device="cpu", seed=0)
    w = rand(24, 40, dtype=dtype, device="cpu", seed=1)
    b = rand(24, dtype=dtype, device="cpu", seed=2) if with_bias else None
    z = F.linear(x, w, b)
    act = {"none": lambda v: v, "relu": F.relu, "gelu": F.gelu, "silu": F.silu,
           "gelu_tanh": lambda v: F.gelu(v, approximate="tanh")}[activation]
    assert torch.equal(ops.linear(x, w, b, activation), act(z))
    # F.linear's path turns on the weight's requires_grad (at::matmul folds a non-contiguous input into rows
    # then) and on the input's layout: each combination, 3-D and 4-D.
    for shape in [(2, 40, 3), (2, 2, 40, 3)]:
        strided = rand(*shape, dtype=dtype, device="cpu", seed=3).transpose(-1, -2)
        for frozen in (True, False):
            weight = w.detach().requires_grad_(not frozen)
            expected = act(F.linear(strided, weight, b)).detach()
            assert torch.equal(ops.linear(strided, weight, b, activation).detach(), expected), (shape, frozen)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("x_shape", [(16,), (5, 16), (2, 3, 16), (0, 16)], ids=str)
def test_values(device, dtype, activation, with_bias, x_shape):
    x = rand(*x_shape, dtype=dtype, device=device, seed=0)
    w = rand(24, 16, dtype=dtype, device=device, seed=1)
    b = rand(24, dtype=dtype, device=device, seed=2) if with_bias else None
    y = ops.linear(x, w, b, activation)
    assert y.shape == (*x_shape[:-1], 24) and y.dtype == dtype and y.device.type == device
    assert y.is_contiguous()
    torch.testing.assert_close(y.double().cpu(), reference(x, w, b, activation).cpu(),
                               rtol=RTOL[dtype], atol=RTOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("activation", ACTIVATIONS[1:])
def test_activation_within_one_rounding_over_a_wide_range(device, dtype, activation):
    # Pre-activations z = bias over [-8, 8] (x = 0): the fused epilogue's activation must be as accurate as
    # the output's rounding, also where the result is small (gelu's tails: CUTLASS's tanh.approx-based
    # GELU_taylor was off by ~20% at z = -3).
    bias = torch.linspace(-8, 8, 256, dtype=torch.float64).to(dtype)
    x = torch.zeros(4, 16, dtype=dtype, device=device)
    w = rand(256, 16, dtype=dtype, device=device, seed=1)
    y = ops.linear(x, w, bias.to(device), activation)
    expected = reference(torch.zeros(4, 16), torch.zeros(256, 16), bias.double(), activation).to(dtype)
    ulp = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}[dtype]
    torch.testing.assert_close(y.cpu().double(), expected.double(), rtol=ulp, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_operands_and_empty_feature_dimensions(device):
    dt = torch.float64
    x = rand(16, 10, dtype=dt, device=device, seed=0).t()             # (10, 16), column-major
    w = rand(48, 16, dtype=dt, device=device, seed=1)[::2]           # (24, 16), row stride 32
    b = rand(48, dtype=dt, device=device, seed=2)[::2]               # (24,), stride 2
    torch.testing.assert_close(ops.linear(x, w, b, "gelu"), reference(x, w, b, "gelu"))
    # K = 0: act(bias) for every row; N = 0: an empty (rows, 0) result.
    x0, w0, b0 = torch.empty(3, 0, dtype=dt, device=device), torch.empty(4, 0, dtype=dt, device=device), \
        rand(4, dtype=dt, device=device, seed=3)
    torch.testing.assert_close(ops.linear(x0, w0, b0, "silu"), F.silu(b0).expand(3, 4))
    assert ops.linear(x, torch.empty(0, 16, dtype=dt, device=device)).shape == (10, 0)


def test_result_does_not_alias_inputs():
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    y = ops.linear(x, w)
    assert y.data_ptr() not in (x.data_ptr(), w.data_ptr())


BAD = [
    ("0-d input", lambda d: (torch.tensor(1.0, device=d), torch.randn(3, 1, device=d), None, "none"),
     RuntimeError, r"linear: expected input of shape \(\.\.\., in_features\), got a 0-D tensor"),
    ("in_features mismatch", lambda d: (torch.randn(4, 8, device=d), torch.randn(3, 7, device=d), None, "none"),
     RuntimeError, r"linear: expected weight of shape \(out_features, in_features\) with in_features = 8 "
     r"\(input's last dimension\), got \[3, 7\]"),
    ("1-d weight", lambda d: (torch.randn(4, 8, device=d), torch.randn(8, device=d), None, "none"),
     RuntimeError, r"linear: expected weight of shape \(out_features, in_features\)"),
    ("bias shape", lambda d: (torch.randn(4, 8, device=d), torch.randn(3, 8, device=d), torch.randn(4, device=d),
                              "none"),
     RuntimeError, r"linear: expected bias of shape \(out_features,\) = \(3,\), got \[4\]"),
    ("weight dtype", lambda d: (torch.randn(4, 8, device=d), torch.randn(3, 8, device=d, dtype=torch.float16),
                                None, "none"),
     RuntimeError, r"linear: expected weight's dtype to be torch.float32 \(input's dtype\), got torch.float16"),
    ("bias dtype", lambda d: (torch.randn(4, 8, device=d), torch.randn(3, 8, device=d),
                              torch.randn(3, device=d, dtype=torch.float64), "relu"),
     RuntimeError, r"linear: expected bias's dtype to be torch.float32 \(input's dtype\), got torch.float64"),
    ("integer input", lambda d: (torch.ones(4, 8, device=d, dtype=torch.int32),
                                 torch.ones(3, 8, device=d, dtype=torch.int32), None, "none"),
     RuntimeError, r"linear: expected input's dtype to be float16, bfloat16, float32 or float64, got torch.int32"),
    ("unknown activation", lambda d: (torch.randn(4, 8, device=d), torch.randn(3, 8, device=d), None, "tanh"),
     ValueError, r'linear: expected activation to be one of "none", "relu", "gelu", "gelu_tanh", "silu", '
     r'got "tanh"'),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_inputs(device, case):
    _, make, error, pattern = case
    with pytest.raises(error, match=pattern):
        ops.linear(*make(device))


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_fake_kernel_error_messages_equal_the_real_kernels(case):
    def message(device):
        with pytest.raises(case[2]) as info:
            ops.linear(*case[1](device))
        return str(info.value).splitlines()[0]

    assert message("meta") == message("cpu")


def test_one_table_of_activations_and_dtypes():
    """The library's tables (csrc/activation.h, checks.h) are what Python, the kernels and the pass read."""
    from ops import _compile_patterns, _library, recipes
    from ops.linear import ACTIVATION_FUNCTIONS
    assert _library.ACTIVATIONS == tuple(ACTIVATIONS)
    assert _library.GEMM_DTYPES == tuple(DTYPES)
    assert tuple(ACTIVATION_FUNCTIONS) == _library.ACTIVATIONS
    assert tuple(_compile_patterns.ACTIVATIONS) == _library.ACTIVATIONS[1:]
    assert recipes.RECIPES["gated_mlp"].acts == _library.ACTIVATIONS[1:]
    # The fused kernels' epilogues: plain, then bias + each activation.
    epilogues = {k["epilogue"] for k in ops.kernels("cutlass_gemm")}
    assert epilogues == {"plain", "bias"} | {"bias_" + a for a in ACTIVATIONS[1:]}
    x = torch.randn(5, 8, dtype=torch.float64)
    for name, fn in ACTIVATION_FUNCTIONS.items():
        torch.testing.assert_close(ops.linear(x, torch.eye(8, dtype=torch.float64), activation=name), fn(x))


@pytest.mark.parametrize("which", ["weight", "bias"])
def test_operands_on_another_device(which):
    x, w, b = torch.randn(4, 8), torch.randn(3, 8), torch.randn(3)
    if which == "weight":
        w = w.to("meta")
        pattern = "linear: input and weight must be on the same device, got input on cpu and weight on meta"
    else:
        b = b.to("meta")
        pattern = r"linear: expected bias on cpu \(input's device\), got meta"
    with pytest.raises(RuntimeError, match=pattern):
        ops.linear(x, w, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("frozen", ["weight", "input"])
def test_saves_for_backward_what_f_linear_saves(device, frozen):
    # Without an activation: input only if weight needs a gradient, weight only if input does (a frozen
    # weight keeps no activation memory). So the operand F.linear does not save may be modified in place
    # between forward and backward with ops.linear too. With an activation, z is recomputed from both.
    def forward_modify_backward(linear, activation="none"):
        w0 = torch.randn(6, 4, device=device, requires_grad=frozen != "weight")
        x0 = torch.randn(3, 4, device=device, requires_grad=frozen != "input")
        x, w = x0 * 1, w0 * 1  # non-leaves: they may be modified in place
        y = linear(x, w, activation)
        expected = torch.ones(3, 6, device=device) @ w if frozen == "weight" else torch.ones(6, 3, device=device) @ x
        with torch.no_grad():
            (x if frozen == "weight" else w).add_(1.0)  # the operand whose gradient is not needed
        y.sum().backward()
        return (x0 if frozen == "weight" else w0).grad, expected

    for linear in (lambda x, w, act: F.linear(x, w), lambda x, w, act: ops.linear(x, w, None, act)):
        grad, expected = forward_modify_backward(linear)
        torch.testing.assert_close(grad, expected)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        forward_modify_backward(lambda x, w, act: ops.linear(x, w, None, act), "gelu")  # kept to recompute z
