"""torch.autocast: the GEMM ops (cutlass_gemm, linear) run in the region's lower precision dtype, as
torch.mm and F.linear do (csrc/autocast.cpp), so converted models keep working in mixed precision; the
fused norm and activation ops run in their inputs' dtype. CPU autocast here; the same kernels are
registered for CUDA (tests marked cuda)."""

import copy

import pytest
import torch
import torch.nn.functional as F

import ops
from conftest import DEVICES, TINY_VOCAB, tiny_hf_decoder


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gemm_ops_follow_autocast_like_torch(device, dtype):
    A, B = torch.randn(16, 32, device=device), torch.randn(32, 8, device=device)
    bias = torch.randn(8, device=device)
    with torch.autocast(device, dtype=dtype):
        got = ops.cutlass_gemm(A, B)
        assert got.dtype == torch.mm(A, B).dtype == dtype
        y = ops.linear(A, B.t(), bias, "gelu")
        assert y.dtype == F.linear(A, B.t(), bias).dtype == dtype
        # float64 is never cast (autocast leaves it alone for torch.mm too).
        assert ops.cutlass_gemm(A.double(), B.double()).dtype == torch.float64
    # CPU: ATen's mm, bit for bit; CUDA: another kernel than cuBLAS's, whose sums may round apart.
    exact = dict(atol=0, rtol=0) if device == "cpu" else {}
    torch.testing.assert_close(got, (A.to(dtype) @ B.to(dtype)), **exact)
    torch.testing.assert_close(y, F.gelu(F.linear(A.to(dtype), B.t().to(dtype), bias.to(dtype))),
                               atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_grouped_gemm_follows_autocast(device):
    # A float32 activation (a norm's output) and bfloat16 experts, as in transformers' MoE layers under
    # autocast: both run in the region's dtype (torch._grouped_mm raises here, pytorch#174763).
    x, experts = torch.randn(10, 32, device=device), torch.randn(3, 32, 8, device=device, dtype=torch.bfloat16)
    offs = torch.tensor([2, 2, 10], dtype=torch.int32, device=device)
    with torch.autocast(device, dtype=torch.bfloat16):
        got = ops.grouped_gemm(x, experts, offs)
        wide = ops.grouped_gemm(x, experts, offs, out_dtype=torch.float32)
    assert got.dtype == torch.bfloat16 and wide.dtype == torch.float32
    assert torch.equal(got, ops.grouped_gemm(x.bfloat16(), experts, offs))


def test_autocast_backward_gives_float32_gradients():
    A = torch.randn(16, 32, requires_grad=True)
    W = torch.randn(8, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = ops.linear(A, W, None, "silu")
    out.float().sum().backward()
    assert A.grad.dtype == W.grad.dtype == torch.float32
    A2, W2 = A.detach().clone().requires_grad_(), W.detach().clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = F.silu(F.linear(A2, W2))
    ref.float().sum().backward()
    torch.testing.assert_close(A.grad, A2.grad, atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(W.grad, W2.grad, atol=5e-2, rtol=5e-2)


def test_backward_inside_an_autocast_region_recomputes_the_forwards_activation_input():
    # The activation's derivative is taken at the forward's z (float32 here), not at a z recomputed in the
    # region's bfloat16: the bias gradient (g * act'(z), summed) is the one a backward outside the region gives.
    x, W, b = (torch.randn(*s, requires_grad=True) for s in ((8, 64), (32, 64), (32,)))
    y = ops.linear(x, W, b, "gelu")
    g = torch.randn_like(y)
    outside, = torch.autograd.grad(y, b, g, retain_graph=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside, = torch.autograd.grad(y, b, g)
    assert torch.equal(inside, outside)


def test_compiled_linear_under_autocast():
    layer = ops.nn.Linear(32, 8, activation="relu")
    x = torch.randn(4, 32)
    compiled = torch.compile(layer, fullgraph=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager, got = layer(x), compiled(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, eager)


def test_converted_decoder_runs_under_autocast():
    stock = tiny_hf_decoder("Llama").eval()
    converted = copy.deepcopy(stock)
    ops.nn.convert(converted)
    ids = torch.randint(0, TINY_VOCAB, (2, 9))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected, got = stock(ids).logits, converted(ids).logits
    assert got.dtype == expected.dtype
    # bf16 GEMMs on both sides (ATen's on CPU): they may differ in rounding only, about one bf16 unit in
    # the last place (2^-8 relative; the logits are below 1).
    torch.testing.assert_close(got.float(), expected.float(), atol=4e-3, rtol=4e-3)
