"""torch.vmap over every op (batching rules in ops/_vmap.py).

Each registered op's samples (tests/op_registry.py: transposed, sliced, expanded, offset and empty
tensors) are batched three ways: one tensor argument at a time, and all of them at once, with the batch
dimension at the front or at the back. The vmapped op must equal the op run per sample, and the float64
reference. Then: nesting, batch size 0, gradients through and of vmap, the in-place fused_add_rms_norm,
and that every op has a real batching rule (not functorch's per-sample fallback).
"""

import itertools

import pytest
import torch
import torch.nn.functional as F

import ops
from conftest import DEVICES
from op_registry import OP_IDS, OPS

BATCH = 3


def _batched(t, bdim):
    """BATCH distinct copies of t (scaled by 1, -0.5, 2: exact for FP8 codes too), stacked at dimension bdim."""
    scaled = [(t.float() * s).to(t.dtype) if t.element_size() == 1 else t * s for s in (1.0, -0.5, 2.0)]
    return torch.stack(scaled, dim=bdim % (t.dim() + 1))


def _batchings(spec, sample):
    """(name, which argument positions are batched, bdim) for a sample; the arguments an op writes always batched
    (an unbatched one would be written once per sample: refused)."""
    tensors = spec.data_positions(sample)
    choices = [(f"arg{i}", tuple(sorted({i, *spec.mutated}))) for i in tensors] + [("all", tuple(tensors))]
    return [(f"{name}@{bdim}", positions, bdim) for (name, positions), bdim
            in itertools.product(choices, (0, -1))]


@pytest.mark.parametrize("spec", OPS, ids=OP_IDS)
@pytest.mark.parametrize("device", DEVICES)
def test_vmap_equals_per_sample_and_reference(spec, device):
    checked = 0
    for sample in spec.samples(device, torch.float64, False):
        for name, positions, bdim in _batchings(spec, sample):
            args = [_batched(a, bdim) if i in positions else a for i, a in enumerate(sample.args)]
            in_dims = tuple(bdim if i in positions else None for i in range(len(args)))
            vmapped = torch.vmap(spec.call, in_dims=in_dims, out_dims=0 if spec.overload._schema.returns else None)
            # outputs batched at 0, then the arguments the op wrote, batched at bdim (OpSpec.run)
            out = spec.run(vmapped, args)
            outputs = len(out) - len(spec.mutated)
            for b in range(BATCH):
                sample_args = [a.select(bdim, b) if i in positions else a for i, a in enumerate(args)]
                got = [o[b] for o in out[:outputs]] + [o.select(bdim, b) for o in out[outputs:]]
                spec.check(got, spec.run(spec.call, sample_args))
                spec.check(got, spec.reference(*sample_args))
            checked += 1
    assert checked >= 20


@pytest.mark.parametrize("spec", OPS, ids=OP_IDS)
def test_every_op_has_a_batching_rule(spec):
    # functorch's fallback (one call per sample, a "performance drop" warning) is not a rule.
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"ops::{spec.name}", "FuncTorchBatched")
    assert torch._C._dispatch_has_kernel_for_dispatch_key("ops::fused_add_rms_norm", "FuncTorchBatched")


@pytest.mark.parametrize("device", DEVICES)
def test_cutlass_gemm_nested_vmap_and_empty_batch(device):
    A = torch.randn(4, 5, 6, dtype=torch.float64, device=device)
    B = torch.randn(3, 6, 7, dtype=torch.float64, device=device)
    # Outer vmap over B, inner over A: every pair (i, j) -> A[j] @ B[i].
    out = torch.vmap(torch.vmap(ops.cutlass_gemm, in_dims=(0, None)), in_dims=(None, 0))(A, B)
    torch.testing.assert_close(out, torch.einsum("jmk,ikn->ijmn", A, B))
    for in_dims in [(0, 0), (0, None), (None, 0)]:
        a = A[:0] if in_dims[0] == 0 else A[0]
        b = B[:0] if in_dims[1] == 0 else B[0]
        out = torch.vmap(ops.cutlass_gemm, in_dims=in_dims)(a, b)
        assert out.shape == (0, 5, 7) and out.device.type == device


@pytest.mark.parametrize("device", DEVICES)
def test_per_sample_weights_with_empty_batch_use_the_fake_kernel_shape(device):
    x = torch.randn(2, 8, dtype=torch.float64, device=device)
    W = torch.randn(0, 5, 8, dtype=torch.float64, device=device)
    assert torch.vmap(ops.linear, in_dims=(None, 0))(x, W).shape == (0, 2, 5)
    w = torch.randn(0, 8, dtype=torch.float64, device=device)
    assert torch.vmap(ops.rms_norm, in_dims=(None, 0))(x, w).shape == (0, 2, 8)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spec", OPS, ids=OP_IDS)
def test_grad_of_vmap_and_vmap_of_grad(spec, device):
    spec.skip("autograd")
    sample = spec.samples(device, torch.float64, False)[0]
    positions = spec.data_positions(sample)
    args = [_batched(a, 0) if i == 0 else a for i, a in enumerate(sample.args)]
    in_dims = (0,) + (None,) * (len(args) - 1)

    def loss(call, *xs):
        return call(*xs).sin().sum()

    def grads(call, vmapped):
        leaves = [a.detach().clone().requires_grad_() if i in positions else a for i, a in enumerate(args)]
        if vmapped:
            out = torch.vmap(call, in_dims=in_dims)(*leaves)
        else:
            out = torch.stack([call(leaves[0][b], *leaves[1:]) for b in range(BATCH)])
        return torch.autograd.grad(out.sin().sum(), [leaves[i] for i in positions])

    # grad(vmap(op)) == grad(map(op)), through the op's own autograd.
    torch.testing.assert_close(grads(spec.call, True), grads(spec.call, False))
    # vmap(grad(op)): per-sample gradients, against the float64 reference's.
    per_sample = torch.vmap(torch.func.grad(lambda *xs: loss(spec.call, *xs)), in_dims=in_dims)(*args)
    expected = torch.vmap(torch.func.grad(lambda *xs: loss(spec.reference, *xs)), in_dims=in_dims)(*args)
    torch.testing.assert_close(per_sample, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_add_rms_norm_under_vmap_writes_in_place(device):
    x = torch.randn(3, 4, 8, device=device)
    r = torch.randn(3, 4, 8, device=device)
    w = torch.randn(8, device=device)
    W = torch.randn(3, 8, device=device)

    def expect(x, r, w):
        return F.rms_norm(x + r, (8,), None, 1e-6) * w, x + r

    # Batch dimension 0 of input, 1 of residual (a non-contiguous view written through).
    xi, rb = x.clone(), r.transpose(0, 1).contiguous()
    torch.vmap(ops.fused_add_rms_norm, in_dims=(0, 1, None), out_dims=None)(xi, rb, w)
    ex, er = expect(x, r, w)
    torch.testing.assert_close(xi, ex)
    torch.testing.assert_close(rb.transpose(0, 1), er)
    # Per-sample weights.
    xi, ri = x.clone(), r.clone()
    torch.vmap(ops.fused_add_rms_norm, in_dims=(0, 0, 0), out_dims=None)(xi, ri, W)
    ex, er = expect(x, r, W[:, None, :])
    torch.testing.assert_close(xi, ex)
    torch.testing.assert_close(ri, er)


def test_fused_add_rms_norm_under_vmap_rejects_an_unbatched_destination():
    x, r, w = torch.randn(3, 4, 8), torch.randn(4, 8), torch.randn(8)
    before = r.clone()
    with pytest.raises(RuntimeError, match="fused_add_rms_norm: under vmap, input and residual must both be "
                       "batched .* got input batched and residual unbatched"):
        torch.vmap(lambda a: ops.fused_add_rms_norm(a, r, w), out_dims=None)(x)
    assert torch.equal(r, before)  # nothing written


SHARED = {  # op, its batched arguments from one buffer `b` and fresh tensors `t`, the error's words
    # sample 0 disjoint; sample 1's weight is its input's row: one call per sample wrote sample 0 first
    "weight-is-a-later-input": (ops.fused_add_rms_norm, lambda b, t: (b[1:3], t(2, 8), b[0:3:2]),
                                "fused_add_rms_norm: under vmap, input and weight share memory"),
    # sample 0 writes row 1 as its residual, which sample 1 reads as its input
    "across-samples": (ops.fused_add_rms_norm, lambda b, t: (b[0:2], b[1:3], t(2, 8)),
                       "fused_add_rms_norm: under vmap, input and residual share memory"),
    "fp8-residual-is-a-weight": (ops.fused_add_rms_norm_fp8, lambda b, t: (t(2, 8), b[0:2], b[1:3]),
                                 "fused_add_rms_norm_fp8: under vmap, residual and weight share memory"),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", SHARED, ids=list(SHARED))
def test_in_place_ops_under_vmap_refuse_shared_memory_before_writing(device, case):
    op, make, message = SHARED[case]
    args = make(torch.randn(4, 8, device=device), lambda *shape: torch.randn(*shape, device=device))
    before = [a.clone() for a in args]
    with pytest.raises(RuntimeError, match=message):
        torch.vmap(op, in_dims=(0, 0, 0), out_dims=None)(*args)
    assert all(torch.equal(a, b) for a, b in zip(args, before))  # nothing written


@pytest.mark.parametrize("device", DEVICES)
def test_in_place_ops_under_vmap_take_disjoint_views_of_one_buffer(device):
    buf, W = torch.randn(3, 16, device=device), torch.randn(3, 8, device=device)
    x, r = buf[:, 0::2], buf[:, 1::2]  # interleaved columns: one range of memory, no common element
    ex, er = x.clone(), r.clone()
    for i in range(3):
        ops.fused_add_rms_norm(ex[i], er[i], W[i])
    torch.vmap(ops.fused_add_rms_norm, in_dims=(0, 0, 0), out_dims=None)(x, r, W)
    assert torch.equal(x, ex) and torch.equal(r, er)


def test_errors_inside_vmap_name_the_op():
    x = torch.randn(3, 4, 7)
    with pytest.raises(RuntimeError, match="silu_and_mul: expected input's last dimension to be even"):
        torch.vmap(ops.silu_and_mul)(x)
    with pytest.raises(RuntimeError, match="rms_norm: expected weight of shape"):
        torch.vmap(ops.rms_norm, in_dims=(0, None))(x, torch.randn(5))


# Merged calls must not misread samples the op would reject.
ZERO_D_SAMPLES = [
    ("rms_norm", lambda x: torch.vmap(ops.rms_norm, in_dims=(0, None))(x, torch.randn(4)),
     r"rms_norm: expected input of shape \(\.\.\., hidden\), got a 0-D tensor"),
    ("silu_and_mul", lambda x: torch.vmap(ops.silu_and_mul)(x),
     r"silu_and_mul: expected input of shape \(\.\.\., 2 \* d\), got a 0-D tensor"),
    ("linear", lambda x: torch.vmap(ops.linear, in_dims=(0, None))(x, torch.randn(5, 4)),
     r"linear: expected input of shape \(\.\.\., in_features\), got a 0-D tensor"),
]


@pytest.mark.parametrize("case", ZERO_D_SAMPLES, ids=[c[0] for c in ZERO_D_SAMPLES])
def test_zero_d_samples_raise_the_ops_error(case):
    with pytest.raises(RuntimeError, match=case[2]):
        case[1](torch.randn(4))


def test_fused_add_rms_norm_zero_d_or_mismatched_samples_raise_and_write_nothing():
    for x, r in [(torch.randn(4), torch.randn(4)), (torch.randn(3, 2, 8), torch.randn(3, 8)),
                 (torch.randn(0, 2, 8), torch.randn(0, 8))]:
        x0, r0 = x.clone(), r.clone()
        with pytest.raises(RuntimeError, match="fused_add_rms_norm: expected"):
            torch.vmap(ops.fused_add_rms_norm, in_dims=(0, 0, None), out_dims=None)(x, r, torch.ones(x.shape[-1]))
        assert torch.equal(x, x0) and torch.equal(r, r0)


@pytest.mark.parametrize("in_dims,A,B,pattern", [
    ((0, None), (4, 3), (3, 2), r"expected A to be a 2-D matrix \(M, K\), got a 1-D tensor of shape \[3\]"),
    ((None, 0), (2, 3), (4, 3, 2, 2), r"expected B to be a 2-D matrix \(K, N\), got a 3-D tensor"),
    ((0, None), (4, 2, 3), (5, 7), r"A \(M, K\) and B \(K, N\) must agree on K, got A of shape \[2, 3\] and B of shape \[5, 7\]"),
    ((None, 0), (2, 3), (4, 5, 7), r"A \(M, K\) and B \(K, N\) must agree on K, got A of shape \[2, 3\] and B of shape \[5, 7\]"),
], ids=["A-1d", "B-3d", "K-A-batched", "K-B-batched"])
def test_cutlass_gemm_errors_name_one_samples_shapes(in_dims, A, B, pattern):
    with pytest.raises(RuntimeError, match="cutlass_gemm: " + pattern):
        torch.vmap(ops.cutlass_gemm, in_dims=in_dims)(torch.randn(*A), torch.randn(*B))


def test_empty_batch_of_per_sample_weights_keeps_autograd():
    x = torch.randn(2, 8, requires_grad=True)
    W = torch.randn(0, 5, 8, requires_grad=True)
    y = torch.vmap(ops.linear, in_dims=(None, 0))(x, W)
    assert y.shape == (0, 2, 5) and y.requires_grad
    y.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x)) and W.grad.shape == W.shape


def _fp8_calls(granularity, static):
    """(name, call(x, residual, weight, scale), whether it writes the residual) of each FP8 op; scale is None
    unless `static`."""
    def kwargs(scale):
        return dict(granularity=granularity, scale=scale if static else None)

    return [
        ("quantize_fp8", lambda x, r, w, s: ops.quantize_fp8(x, **kwargs(s)), False),
        ("rms_norm_fp8", lambda x, r, w, s: ops.rms_norm_fp8(x, w, **kwargs(s)), False),
        ("silu_and_mul_fp8", lambda x, r, w, s: ops.silu_and_mul_fp8(x, **kwargs(s)), False),
        ("fused_add_rms_norm_fp8", lambda x, r, w, s: ops.fused_add_rms_norm_fp8(x, r, w, **kwargs(s)), True),
    ]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("granularity,static", [("row", False), ("group", False), ("tensor", False),
                                                ("tensor", True), ("block", False)])
@pytest.mark.parametrize("bdim", [0, -1])
def test_fp8_ops_under_vmap_equal_their_samples(device, granularity, static, bdim):
    # Row-local scales merge the batch into the rows; a scale over a whole sample (tensor, block) or a static
    # one is computed per sample.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCH, 5, 256, generator=g).to(device)
    residual = torch.randn(BATCH, 5, 256, generator=g).to(device)
    weight, scale = (torch.rand(256, generator=g) + 0.5).to(device), torch.tensor([0.5, 2.0, 4.0], device=device)
    for name, call, writes in _fp8_calls(granularity, static):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"ops::{name}", "FuncTorchBatched"), name
        if (granularity == "block" and name != "quantize_fp8") or (static and granularity != "tensor"):
            continue
        mine, theirs = residual.movedim(0, bdim).clone(), residual.clone()
        codes, scales = torch.vmap(call, in_dims=(bdim, bdim, None, 0))(x.movedim(0, bdim), mine, weight, scale)
        expected = [call(x[i], theirs[i], weight, scale[i]) for i in range(BATCH)]
        assert torch.equal(codes.view(torch.uint8), torch.stack([c for c, _ in expected]).view(torch.uint8)), name
        assert torch.equal(scales, torch.stack([s for _, s in expected])), name
        assert torch.equal(mine.movedim(bdim, 0), theirs if writes else residual), name


def test_fused_add_rms_norm_fp8_under_vmap_rejects_an_unbatched_residual():
    x, r, w = torch.randn(3, 4, 128), torch.randn(4, 128), torch.ones(128)
    before = r.clone()
    with pytest.raises(RuntimeError, match="fused_add_rms_norm_fp8: under vmap, residual must be batched"):
        torch.vmap(lambda a: ops.fused_add_rms_norm_fp8(a, r, w))(x)
    assert torch.equal(r, before)


@pytest.mark.parametrize("device", DEVICES)
def test_grouped_gemm_takes_per_sample_offsets_batched_on_any_dimension(device):
    A, B = torch.randn(6, 8, device=device), torch.randn(3, 8, 4, device=device)
    offs = torch.tensor([[1, 2], [4, 4], [6, 6]], dtype=torch.int32, device=device)  # samples are columns
    out = torch.vmap(lambda o: ops.grouped_gemm(A, B, o), in_dims=1)(offs)
    expected = torch.stack([ops.grouped_gemm(A, B, offs[:, i].contiguous()) for i in range(2)])
    assert torch.equal(out, expected)
