"""rms_norm, fused_add_rms_norm and silu_and_mul: values against float64 references on every device,
both kernel paths (16-byte vectors; element-wise for odd lengths or misaligned pointers), in-place
semantics, bad inputs. The mode tests (autograd, opcheck, compile, export, ...) are in test_modes.py
and friends through tests/op_registry.py."""

import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch
import torch.nn.functional as F

import ops
from conftest import DEVICES, REPO, run_python

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
# Output rounding of the dtype (results are computed in fp32 and rounded once), plus input-scale slack.
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 2e-6, torch.float64: 1e-12}


def randn(*shape, dtype, device, offset=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = 1
    for s in shape:
        n *= s
    base = torch.randn(n + offset, generator=g, dtype=torch.float64).to(dtype=dtype, device=device)
    return base[offset:].view(*shape)


def close(actual, expected, dtype):
    torch.testing.assert_close(actual.double().cpu(), expected.double().cpu(), atol=TOL[dtype] * 4, rtol=TOL[dtype])


# Rows of <= 32 vectors or elements take the CUDA lane-group kernels (4, 8, 16 or 32 lanes per row, many
# rows per block, a partial last block): (1000, 128) is a per-head q/k norm; longer rows, one block each.
SHAPES = [(1, 8), (7, 16), (3, 5, 13), (33, 4096), (2, 1), (64, 100), (1000, 128), (301, 40), (129, 31)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("offset", [0, 1])  # 1: a misaligned pointer takes the element-wise path
def test_rms_norm_values(device, dtype, shape, offset):
    x = randn(*shape, dtype=dtype, device=device, offset=offset)
    w = randn(shape[-1], dtype=dtype, device=device, seed=1)
    y = ops.rms_norm(x, w, eps=1e-5)
    assert y.shape == x.shape and y.dtype == dtype and y.is_contiguous()
    close(y, F.rms_norm(x.double(), (shape[-1],), w.double(), 1e-5), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_fused_add_rms_norm_values_and_in_place(device, dtype, shape):
    x = randn(*shape, dtype=dtype, device=device)
    r = randn(*shape, dtype=dtype, device=device, seed=2)
    w = randn(shape[-1], dtype=dtype, device=device, seed=1)
    x0, r0 = x.clone(), r.clone()
    x_ptr, r_ptr = x.data_ptr(), r.data_ptr()
    assert ops.fused_add_rms_norm(x, r, w, 1e-6) is None
    assert x.data_ptr() == x_ptr and r.data_ptr() == r_ptr
    summed = (x0.double() + r0.double()).to(dtype)  # the residual as stored
    close(r, summed, dtype)
    close(x, F.rms_norm(summed.double(), (shape[-1],), w.double(), 1e-6), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["rms_norm", "fused_add_rms_norm"])
def test_rms_norm_values_on_very_long_rows(device, op):
    """One vectorised pass over a row's squares, each lane adding d / lanes fp32 terms, gives 1.3e-5
    relative error at d = 2^22 for inputs in [0.9, 1.1] (F.rms_norm: 1.6e-7); the CPU kernel sums in torch's
    cascade (docs/numerics.md). Positive inputs: no cancellation hides the error."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(2, 1 << 22, generator=g, dtype=torch.float64) * 0.2 + 0.9
    w = torch.rand(1 << 22, generator=g, dtype=torch.float64) + 0.5
    x32, w32 = x.to(device=device, dtype=torch.float32), w.to(device=device, dtype=torch.float32)
    if op == "rms_norm":
        y = ops.rms_norm(x32, w32, eps=1e-6)
    else:  # the residual sums to x32 exactly (halving is exact)
        y, residual = x32 / 2, x32 / 2
        ops.fused_add_rms_norm(y, residual, w32, eps=1e-6)
        assert torch.equal(residual, x32)
    close(y, F.rms_norm(x32.double(), (1 << 22,), w32.double(), 1e-6), torch.float32)


@pytest.fixture
def rms_packs_per_thread(request):
    """Selects the CUDA rms_norm kernel for long rows (csrc/fused_kernels.h): 0, the default, or the
    register-resident kernel with up to 1, 2, 4 or 8 16-byte packs per thread; restored afterwards."""
    previous = torch.ops.ops._rms_norm_set_packs_per_thread(request.param)
    yield request.param
    torch.ops.ops._rms_norm_set_packs_per_thread(previous)


@pytest.mark.cuda
@pytest.mark.parametrize("rms_packs_per_thread", [0, 1, 2, 4, 8], indirect=True)
@pytest.mark.parametrize("dtype", DTYPES)
# Rows of 33..32768 packs: one and several packs per thread, a partial last pack round, the most
# threads each variant launches (32768 bf16 = 4096 packs: 512 threads with 8 packs, 1024 with 4), and
# rows too long for the register kernel (16384 bf16 = 2048 packs with 1 per thread; 16384 fp64 with 8),
# which keep the default one.
@pytest.mark.parametrize(
    "shape", [(33, 4096), (5, 5120), (3, 264), (2, 16384), (4, 8200), (2, 32768), (2, 65536)], ids=str
)
def test_rms_norm_kernels_for_long_rows(rms_packs_per_thread, dtype, shape):
    x = randn(*shape, dtype=dtype, device="cuda")
    r = randn(*shape, dtype=dtype, device="cuda", seed=2)
    w = randn(shape[-1], dtype=dtype, device="cuda", seed=1)
    close(ops.rms_norm(x, w, eps=1e-5), F.rms_norm(x.double(), (shape[-1],), w.double(), 1e-5), dtype)
    summed = (x.double() + r.double()).to(dtype)
    ops.fused_add_rms_norm(x, r, w, 1e-6)
    close(r, summed, dtype)
    close(x, F.rms_norm(summed.double(), (shape[-1],), w.double(), 1e-6), dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_add_rms_norm_non_contiguous_written_back(device):
    base_x = randn(8, 32, dtype=torch.float32, device=device)
    base_r = randn(32, 8, dtype=torch.float32, device=device, seed=2)
    x, r = base_x[:, ::2], base_r.t()[:, :16]  # (8, 16) views, neither contiguous
    w = randn(16, dtype=torch.float32, device=device, seed=1)
    x0, r0 = x.clone(), r.clone()
    untouched = base_x[:, 1::2].clone()
    ops.fused_add_rms_norm(x, r, w)
    close(r, x0 + r0, torch.float32)
    close(x, F.rms_norm(x0 + r0, (16,), w, 1e-6), torch.float32)
    assert torch.equal(base_x[:, 1::2], untouched)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 16), (7, 32), (3, 5, 26), (33, 28672), (2, 2), (64, 200)], ids=str)
@pytest.mark.parametrize("offset", [0, 1])
def test_silu_and_mul_values(device, dtype, shape, offset):
    x = randn(*shape, dtype=dtype, device=device, offset=offset)
    y = ops.silu_and_mul(x)
    d = shape[-1] // 2
    assert y.shape == (*shape[:-1], d) and y.is_contiguous()
    xd = x.double()
    close(y, F.silu(xd[..., :d]) * xd[..., d:], dtype)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_silu_and_mul_far_negative_gates(dtype):
    # Gates in (-88.72, -87.34) make 1 + exp(-a) a divisor in (2^126, 2^128), for which the CUDA kernel's
    # __fdividef returns 0: silu(a) ~ -1e-36 is a normal bfloat16, visible times a large up-projection value
    # (unscaled, the kernel would give -0 where F.silu(a) * b gives about -53 for a = -88, b = 1e38).
    gates = torch.tensor([-87.0, -87.5, -88.0, -88.5, -88.7, -89.0, -100.0, 0.5], dtype=torch.float64)
    up = torch.full_like(gates, 1e38 if dtype == torch.bfloat16 else 6e4)
    x = torch.cat([gates, up]).to(dtype).view(1, -1).cuda()
    xd = x.double().cpu()
    expected = (F.silu(xd[:, :8].float()).double() * xd[:, 8:]).to(dtype)  # PyTorch's float formula, rounded
    torch.testing.assert_close(ops.silu_and_mul(x).cpu(), expected, rtol=TOL[dtype], atol=0)


def _check_rows_past(rows, hidden, device):
    """rms_norm, fused_add_rms_norm, silu_and_mul and quantize_fp8 over rows x hidden bfloat16 elements: the
    first and last rows against the float formula (and the codes of those rows quantized alone)."""
    x = torch.empty(rows, hidden, dtype=torch.bfloat16, device=device).normal_(generator=torch.Generator(
        device).manual_seed(0))
    w = torch.linspace(0.5, 1.5, hidden, dtype=torch.bfloat16, device=device)
    ends = (slice(0, 2), slice(rows - 3, rows))

    def norm(t):
        return F.rms_norm(t.float(), (t.shape[-1],), w.float(), 1e-6)

    y = ops.rms_norm(x, w, 1e-6)
    for end in ends:
        close(y[end], norm(x[end]), torch.bfloat16)
    del y
    codes, scales = ops.quantize_fp8(x, "row")
    for end in ends:
        alone = ops.quantize_fp8(x[end].clone(), "row")
        assert torch.equal(codes[end].view(torch.uint8), alone[0].view(torch.uint8)) and torch.equal(scales[end], alone[1])
    del codes, scales
    d = hidden // 2
    y = ops.silu_and_mul(x)
    for end in ends:
        close(y[end], F.silu(x[end, :d].float()) * x[end, d:].float(), torch.bfloat16)
    del y
    residual = torch.ones_like(x)
    ends_before = [x[end].clone() for end in ends]
    ops.fused_add_rms_norm(x, residual, w, 1e-6)
    for end, before in zip(ends, ends_before):
        assert torch.equal(residual[end], before + 1)
        close(x[end], norm(residual[end]), torch.bfloat16)


def test_row_checks_of_the_2_31_element_test():
    _check_rows_past(37, 256, "cpu")


@pytest.mark.cuda
def test_cuda_kernels_past_2_31_elements():
    # (2^19 + 3) rows of 4096: the last rows' elements lie past 2^31 (int32 offsets would wrap); 8 GiB at a time.
    _check_rows_past(2**19 + 3, 4096, "cuda")


def test_fused_add_rms_norm_compiles_fullgraph():
    def f(x, r, w):
        ops.fused_add_rms_norm(x, r, w)
        return x * 2, r

    x, r, w = torch.randn(4, 16), torch.randn(4, 16), torch.randn(16)
    xc, rc, xe, re = x.clone(), r.clone(), x.clone(), r.clone()
    torch._dynamo.reset()
    out_c = torch.compile(f, fullgraph=True)(xc, rc, w)
    out_e = f(xe, re, w)
    torch.testing.assert_close(out_c, out_e)
    torch.testing.assert_close((xc, rc), (xe, re))  # the compiled call mutated its inputs too


def test_fused_add_rms_norm_opcheck():
    torch.library.opcheck(torch.ops.ops.fused_add_rms_norm.default,
                          (torch.randn(4, 16), torch.randn(4, 16), torch.randn(16), 1e-6))
    torch.library.opcheck(torch.ops.ops.fused_add_rms_norm.default,
                          (torch.randn(2, 3, 10, dtype=torch.bfloat16), torch.randn(2, 3, 10, dtype=torch.bfloat16),
                           torch.randn(10, dtype=torch.bfloat16), 1e-5))


def test_fused_add_rms_norm_rejects_requires_grad():
    x = torch.randn(4, 16, requires_grad=True)
    with pytest.raises(RuntimeError, match="fused_add_rms_norm: an in-place inference op"):
        ops.fused_add_rms_norm(x, torch.randn(4, 16), torch.randn(16))


BAD = [
    ("rms_norm hidden mismatch", lambda d: ops.rms_norm(torch.randn(4, 8, device=d), torch.randn(7, device=d)),
     r"rms_norm: expected weight of shape \(hidden,\) = \(8,\)"),
    ("rms_norm dtype mismatch", lambda d: ops.rms_norm(torch.randn(4, 8, device=d),
                                                       torch.randn(8, device=d, dtype=torch.float16)),
     r"rms_norm: expected weight's dtype to be torch.float32 \(input's dtype\), got torch.float16"),
    ("rms_norm int", lambda d: ops.rms_norm(torch.ones(4, 8, device=d, dtype=torch.int32),
                                            torch.ones(8, device=d, dtype=torch.int32)),
     r"rms_norm: expected input's dtype to be float16, bfloat16, float32 or float64"),
    ("rms_norm 0-d", lambda d: ops.rms_norm(torch.tensor(1.0, device=d), torch.ones(1, device=d)),
     r"rms_norm: expected input of shape \(\.\.\., hidden\)"),
    ("silu odd", lambda d: ops.silu_and_mul(torch.randn(4, 7, device=d)),
     r"silu_and_mul: expected input's last dimension to be even"),
    ("silu int", lambda d: ops.silu_and_mul(torch.ones(4, 8, device=d, dtype=torch.int64)),
     r"silu_and_mul: expected input's dtype to be float16"),
    ("add residual shape", lambda d: ops.fused_add_rms_norm(torch.randn(4, 8, device=d), torch.randn(4, 9, device=d),
                                                            torch.randn(8, device=d)),
     r"fused_add_rms_norm: expected residual of input's shape"),
    ("add input expanded", lambda d: ops.fused_add_rms_norm(torch.randn(1, 8, device=d).expand(4, 8),
                                                            torch.randn(4, 8, device=d), torch.randn(8, device=d)),
     r"fused_add_rms_norm: input has internally overlapping memory \(e.g. an expanded tensor\) but is "
     r"written in place"),
    ("add residual expanded", lambda d: ops.fused_add_rms_norm(torch.randn(4, 8, device=d),
                                                               torch.randn(4, 1, device=d).expand(4, 8),
                                                               torch.randn(8, device=d)),
     r"fused_add_rms_norm: residual has internally overlapping memory"),
    ("add overlapping rows", lambda d: (lambda T: ops.fused_add_rms_norm(T[0:2], T[1:3], torch.randn(8, device=d)))(
        torch.randn(4, 8, device=d)), r"fused_add_rms_norm: input and residual share memory; input is written"),
    ("add same tensor", lambda d: (lambda T: ops.fused_add_rms_norm(T, T, torch.randn(8, device=d)))(
        torch.randn(4, 8, device=d)), r"fused_add_rms_norm: input and residual share memory"),
    ("add shifted strided views", lambda d: (lambda T: ops.fused_add_rms_norm(T[:, :8], T[:, 4:12],
                                                                              torch.randn(8, device=d)))(
        torch.randn(4, 16, device=d)), r"fused_add_rms_norm: input and residual share memory; input is written"),
    ("add undecidable strided views", lambda d: (lambda T: ops.fused_add_rms_norm(
        T.as_strided((3, 4), (5, 1), 0), T.as_strided((3, 4), (5, 1), 2), torch.randn(4, device=d)))(
        torch.randn(20, device=d)),
     r"fused_add_rms_norm: input and residual share memory \(or may: strided views of one buffer\)"),
    ("add weight in residual", lambda d: (lambda R: ops.fused_add_rms_norm(torch.randn(4, 8, device=d), R, R[1]))(
        torch.randn(4, 8, device=d)), r"fused_add_rms_norm: residual and weight share memory"),
    ("add residual dtype", lambda d: ops.fused_add_rms_norm(torch.randn(4, 8, device=d),
                                                            torch.randn(4, 8, device=d, dtype=torch.float64),
                                                            torch.randn(8, device=d)),
     r"fused_add_rms_norm: expected residual's dtype to be torch.float32 \(input's dtype\), got torch.float64"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_inputs(device, case):
    _, call, pattern = case
    with pytest.raises(RuntimeError, match=pattern):
        call(device)


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_fake_kernel_error_messages_equal_the_real_kernels(case):
    # The fake kernels (torch._check, used under torch.compile / export) and the C++ checks say the same.
    def message(device):
        with pytest.raises(RuntimeError) as info:
            case[1](device)
        return str(info.value).splitlines()[0]

    assert message("meta") == message("cpu")


def test_wrong_device_weight():
    with pytest.raises(RuntimeError, match="rms_norm: input and weight must be on the same device"):
        ops.rms_norm(torch.randn(4, 8), torch.randn(8, device="meta"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["partial", "same", "strided-views", "weight-in-input", "weight-in-residual"])
def test_fused_add_rms_norm_refuses_shared_memory(device, case):
    # Overlapping input and residual would give a result that depends on the write order.
    T = torch.randn(4, 16, device=device)
    w = torch.randn(8, device=device)
    x, r = torch.randn(4, 8, device=device), torch.randn(4, 8, device=device)
    x, r, w, pair = {
        "partial": (T[0:2, :8], T[1:3, :8], w, "input and residual"),
        "same": (x, x, w, "input and residual"),
        "strided-views": (T[:, :8], T[:, 4:12], w, "input and residual"),
        "weight-in-input": (x, r, x[0], "input and weight"),
        "weight-in-residual": (x, r, r[1], "residual and weight"),
    }[case]
    before = [t.clone() for t in (T, x, r)]
    with pytest.raises(RuntimeError, match=f"fused_add_rms_norm: {pair} share memory"):
        ops.fused_add_rms_norm(x, r, w)
    assert all(torch.equal(t, b) for t, b in zip((T, x, r), before))  # nothing written


@pytest.mark.parametrize("case", ["same", "shifted"])
def test_fused_add_rms_norm_refuses_memory_shared_through_another_storage(case):
    # Two storages over one buffer (torch.from_numpy of one array twice): ATen's overlap analysis, by storage
    # identity, takes them for disjoint, and residual would come back holding the normalised values.
    np = pytest.importorskip("numpy")
    buffer = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    X, R = torch.from_numpy(buffer), torch.from_numpy(buffer)
    x, r = (X, R) if case == "same" else (X[:4], R[1:])
    before = X.clone()
    with pytest.raises(RuntimeError, match="fused_add_rms_norm: input and residual share memory"):
        ops.fused_add_rms_norm(x, r, torch.ones(8))
    assert torch.equal(X, before)


def test_fused_add_rms_norm_on_copy_on_write_clones():
    # torch._lazy_clone shares memory until one side is written, which copies it first: not shared memory
    # for the overlap check, which must not refuse it.
    x0, w = torch.randn(4, 8), torch.randn(8)
    original = x0.clone()
    x, r = torch._lazy_clone(x0), torch._lazy_clone(x0)
    ops.fused_add_rms_norm(x, r, w)
    close(r, 2 * original, torch.float32)
    close(x, F.rms_norm(2 * original, (8,), w, 1e-6), torch.float32)
    assert torch.equal(x0, original)  # the tensor both were cloned from is untouched


def test_fused_add_rms_norm_refuses_written_negative_views():
    # z.conj().imag is a negative view: PyTorch's Negative-key fallback ran the op on a clone and then
    # expected it to return the tensor it wrote; fused_add_rms_norm returns nothing, so it failed an
    # internal assert and corrupted memory (the next op segfaulted). In a fresh process.
    result = run_python(
        "import torch, ops\n"
        "x, w = torch.randn(4, 8), torch.ones(8)\n"
        "for name in ('residual', 'input'):\n"
        "    neg = torch.randn(4, 8, dtype=torch.complex64).conj().imag\n"
        "    before = neg.clone()\n"
        "    try:\n"
        "        ops.fused_add_rms_norm(x, neg, w) if name == 'residual' else ops.fused_add_rms_norm(neg, x, w)\n"
        "    except RuntimeError as e:\n"
        "        print('ERROR', str(e).splitlines()[0])\n"
        "    assert torch.equal(neg, before)\n"
        "print('SUM', x.sum().item())\n"
        "neg = torch.randn(4, 8, dtype=torch.complex64).conj().imag\n"  # read only: resolved
        "torch.testing.assert_close(ops.rms_norm(neg, w), ops.rms_norm(neg.resolve_neg(), w))\n",
        cwd=REPO, env={"PYTHONPATH": REPO})
    assert result.returncode == 0, result.stderr[-3000:]
    for name in ("residual", "input"):
        assert (f"ERROR fused_add_rms_norm: {name} is written in place but is a negative view (its negative bit "
                "is set, e.g. z.conj().imag)") in result.stdout, result.stdout
    assert "SUM" in result.stdout


@pytest.mark.parametrize("device", DEVICES)
def test_fused_add_rms_norm_disjoint_views_of_one_buffer(device):
    T = torch.randn(4, 8, dtype=torch.float64, device=device)
    w = torch.randn(8, dtype=torch.float64, device=device)
    x0, r0 = T[0:2].clone(), T[2:4].clone()
    ops.fused_add_rms_norm(T[0:2], T[2:4], w)
    torch.testing.assert_close(T[2:4], x0 + r0)
    torch.testing.assert_close(T[0:2], F.rms_norm(x0 + r0, (8,), w, 1e-6))


def _offsets(t):
    """The storage offsets of t's elements (brute force, for small views)."""
    index = torch.arange(t.untyped_storage().nbytes() // t.element_size())
    return set(index.as_strided(t.shape, t.stride(), t.storage_offset()).flatten().tolist())


@pytest.mark.parametrize("device", DEVICES)
def test_fused_add_rms_norm_on_the_two_halves_of_one_buffer(device):
    """x, r = h.chunk(2, -1): disjoint interleaved views that ATen's overlap analysis cannot decide, which
    torch's in-place ops take: decided exactly, not refused as sharing memory."""
    h = torch.randn(5, 16, dtype=torch.float64, device=device)
    w = torch.randn(8, dtype=torch.float64, device=device)
    x, r = h.chunk(2, -1)
    x0, r0 = x.clone(), r.clone()
    ops.fused_add_rms_norm(x, r, w, 1e-6)
    torch.testing.assert_close(r, x0 + r0)
    torch.testing.assert_close(x, F.rms_norm(x0 + r0, (8,), w, 1e-6))
    x, r = h.chunk(2, -1)  # the same on fake tensors (torch.compile's and export's fake kernel)
    torch.library.opcheck(torch.ops.ops.fused_add_rms_norm.default, (x, r, w, 1e-6))


@given(rows=st.integers(1, 4), cols=st.integers(1, 5), row_stride=st.integers(1, 12), shift=st.integers(0, 24),
       transpose=st.booleans())
@settings(max_examples=300, deadline=None)
def test_shifted_views_overlap_is_exact_where_it_decides(rows, cols, row_stride, shift, transpose):
    """Two equal-shaped views of one buffer, the second shifted: wherever the Python (fake kernel) and the
    C++ analyses decide, they agree with brute force; fused_add_rms_norm runs exactly when they share no
    element, and then gives the reference's values."""
    from ops import _overlap

    size, stride = ((rows, cols), (row_stride, 1)) if not transpose else ((cols, rows), (1, row_stride))
    span = (rows - 1) * row_stride + cols
    buffer = torch.randn(span + shift, dtype=torch.float64)
    a, b = buffer.as_strided(size, stride, 0), buffer.as_strided(size, stride, shift)
    if torch._debug_has_internal_overlap(a) == 1:
        return  # expanded-like views: refused as written in place, another check
    truth = bool(_offsets(a) & _offsets(b))
    decided = _overlap.shifted_views_overlap(a, b)
    assert decided is None or decided == truth
    w = torch.randn(size[-1], dtype=torch.float64)
    a0, b0 = a.clone(), b.clone()
    try:
        ops.fused_add_rms_norm(a, b, w, 1e-6)
    except RuntimeError as e:
        assert "share memory" in str(e) and (truth or decided is None), str(e)
        assert ("(or may" in str(e)) == (decided is None and _overlap.overlap_status(a, b) == _overlap.TOO_HARD)
        return
    assert not truth
    torch.testing.assert_close(b, a0 + b0)
    torch.testing.assert_close(a, F.rms_norm(a0 + b0, (size[-1],), w, 1e-6))


@pytest.mark.parametrize("capability, build", [("default", "baseline"), ("avx2", "avx2"), ("avx512", "avx512")])
def test_every_cpu_kernel_build_under_its_aten_capability(capability, build):
    """The CPU kernels are built for the baseline ISA, AVX2 and AVX-512, and run as the build matching the
    capability ATen runs its own kernels at, which ATEN_CPU_CAPABILITY lowers: this file's CPU value tests
    and test_fp8_numerics.py's of the quantization kernel, in a fresh process per build (the main run tests only this
    CPU's best one)."""
    env = {"ATEN_CPU_CAPABILITY": capability}
    probe = run_python("import torch, ops; "
                       "print(torch.backends.cpu.get_cpu_capability(), torch.ops.ops._fused_cpu_isa())",
                       cwd=REPO, env=env, timeout=120)
    assert probe.returncode == 0, probe.stderr[-2000:]
    aten, ours = probe.stdout.split()[-2:]
    if aten.lower() != capability:
        pytest.skip(f"ATen runs at {aten} on this CPU, not {capability}")
    # torch 2.14.1 reports the ATEN_CPU_CAPABILITY asked for even where the CPU lacks it (AVX512 on an AMD
    # EPYC without AVX-512); the kernels then run the CPU's best build.
    order = ["default", "avx2", "avx512"]
    best = torch.backends.cpu.get_cpu_capability().lower()
    if "ATEN_CPU_CAPABILITY" not in os.environ and best in order and order.index(capability) > order.index(best):
        assert ours == {"default": "baseline"}.get(best, best)
        pytest.skip(f"this CPU's best ISA is {best}, not {capability}")
    assert ours == build
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:randomly",
                          os.path.join(REPO, "tests", "test_fused.py"), os.path.join(REPO, "tests", "test_fp8_numerics.py"),
                          "-k", "values and cpu or quantize_cpu_kernel"],
                         cwd=REPO, env=dict(os.environ, **env), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and " passed" in run.stdout, run.stdout[-3000:] + run.stderr[-2000:]


def test_rms_norm_without_weight_names_the_argument():
    # F.rms_norm takes weight=None; ops.rms_norm needs a weight, and says so (not a bare AttributeError
    # from the wrapper's nested-tensor check).
    with pytest.raises(RuntimeError, match=r"rms_norm: weight must be a defined tensor \(hidden,\), got None"):
        ops.rms_norm(torch.randn(2, 4), None)


# ---- Numerics conventions (docs/numerics.md): torch's and vLLM's formulas, bit for bit on CPU ------------
# These tests' names hold "values" and "cpu": test_every_cpu_kernel_build_under_its_aten_capability runs
# them under each of ATen's CPU capabilities.

# Row lengths below, at and past a 32-byte vector of squares (8 float32, 4 float64), four vectors and a
# cascade level of ATen's sum, odd lengths, and long rows of several levels.
NORM_WIDTHS = [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 255, 257, 511, 513,
               1000, 2049, 4096, 5120, 8191]


def llama_rms_norm(x, w, eps):
    """transformers' LlamaRMSNorm.forward (weight of x's dtype)."""
    input_dtype = x.dtype
    hidden_states = x.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + eps)
    return w * hidden_states.to(input_dtype)


def vllm_native_rms_norm(x, w, eps):
    """vLLM's RMSNorm.forward_native without a residual."""
    orig_dtype = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(dim=-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    return x.to(orig_dtype) * w


def norm_inputs(rows, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    scale = torch.logspace(-2, 2, rows, dtype=torch.float64).unsqueeze(-1)  # rows of very different sizes
    x = (torch.randn(rows, d, generator=g, dtype=torch.float64) * scale).to(dtype)
    w = (torch.rand(d, generator=g, dtype=torch.float64) + 0.5).to(dtype)
    return x, w


def assert_conventions(dtype, x, w, eps, y, y_rounded):
    """y: rms_norm's default, F.rms_norm's bits; y_rounded: round_before_weight, Llama's and vLLM's bits
    (float64: F.rms_norm's too, rounding x_hat to float64 changes nothing; their float64 runs in float32)."""
    assert torch.equal(y, F.rms_norm(x, (x.shape[-1],), w, eps))
    if dtype == torch.float64:
        assert torch.equal(y_rounded, y)
    else:
        assert torch.equal(y_rounded, llama_rms_norm(x, w, eps))
        assert torch.equal(y_rounded, vllm_native_rms_norm(x, w, eps))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_values_are_torch_bits_on_cpu(dtype):
    differ = 0
    for d in NORM_WIDTHS:
        for rows in (1, 6):
            x, w = norm_inputs(rows, d, dtype, seed=d)
            y = ops.rms_norm(x, w, 1e-6)
            y_rounded = ops.rms_norm(x, w, 1e-6, round_before_weight=True)
            assert_conventions(dtype, x, w, 1e-6, y, y_rounded)
            differ += int((y != y_rounded).sum())
    assert (differ > 0) == (dtype in (torch.float16, torch.bfloat16))  # the conventions part in half types only


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_rms_norm_values_of_one_long_row_are_torch_bits_on_cpu(dtype, threads):
    """A tensor of one row of more than 32768 elements: torch sums it in min(threads, ceil(d / 32768)) parts
    (TensorIterator's two-pass reduction) where it runs several threads; several rows are summed whole."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for shape in [(32768,), (1, 32769), (1, 1, 70001), (2, 40000), (100003,)]:
            x, w = norm_inputs(1, shape[-1], dtype, seed=shape[-1])
            x = x.view(-1).repeat(shape[0] if len(shape) == 2 else 1).view(shape)
            assert_conventions(dtype, x, w, 1e-5, ops.rms_norm(x, w, 1e-5),
                               ops.rms_norm(x, w, 1e-5, round_before_weight=True))
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rms_norm_values_are_torch_bits_on_cpu(dtype):
    # transformers' decoder layer: residual = residual + hidden (rounded to the dtype), then the norm of it.
    for d in (7, 64, 100, 4096):
        for round_before_weight in (False, True):
            x, w = norm_inputs(5, d, dtype, seed=d)
            r, _ = norm_inputs(5, d, dtype, seed=d + 1)
            summed = r + x
            ops.fused_add_rms_norm(x, r, w, 1e-6, round_before_weight=round_before_weight)
            assert torch.equal(r, summed)
            expected = ops.rms_norm(summed, w, 1e-6, round_before_weight=round_before_weight)
            assert torch.equal(x, expected)
            if round_before_weight and dtype != torch.float64:
                assert torch.equal(x, llama_rms_norm(summed, w, 1e-6))
            elif not round_before_weight:
                assert torch.equal(x, F.rms_norm(summed, (d,), w, 1e-6))


# silu_and_mul rows: d = 1 (torch computes each gate alone), runs shorter than and around two vectors (the
# scalar tail of each run), and tensors of more than 32768 gates that torch splits between threads inside a
# row (3 x 20000: at gate 30000) or at a row's end (2 x 28672).
SILU_SHAPES = [(1, 2), (3, 2), (1, 32), (7, 34), (3, 66), (5, 128), (2, 200), (2, 3, 62), (33, 2000), (4, 16386),
               (3, 40000), (1, 80000), (2, 57344), (5, 24690)]


def silu_inputs(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * 4).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_silu_and_mul_values_are_torch_bits_on_cpu(dtype, threads):
    """float32, float64: F.silu(a) * b itself (vLLM's SiluAndMul.forward_native); float16, bfloat16: that
    formula in float32 on x.float(), rounded once."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for i, shape in enumerate(SILU_SHAPES):
            x = silu_inputs(shape, dtype, seed=i)
            d = shape[-1] // 2
            y = x if dtype in (torch.float32, torch.float64) else x.float()
            expected = (F.silu(y[..., :d]) * y[..., d:]).to(dtype)
            assert torch.equal(ops.silu_and_mul(x), expected), shape
    finally:
        torch.set_num_threads(previous)


def ulp(v, dtype):
    """The spacing of `dtype`'s values at |v| (float64 tensors), subnormals included."""
    info = torch.finfo(dtype)
    exponent = torch.floor(torch.log2(v.abs().clamp_min(info.smallest_normal)))
    return torch.exp2(exponent - {torch.float16: 10, torch.bfloat16: 7}[dtype])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_silu_and_mul_half_types_within_half_an_ulp_of_float64_on_cpu(dtype):
    """One rounding of a float32 value within 5 float32 roundings of silu(a) * b (exp to 1 ulp, the sum, the
    quotient, the product): |y - y64| <= ulp/2 + 5 * 2^-24 |y64|. F.silu(a) * b in the dtype rounds silu(a)
    first, and misses that bound (up to about one ulp)."""
    x = silu_inputs((64, 2 * 4096), dtype, seed=7)
    d = 4096
    y64 = F.silu(x[:, :d].double()) * x[:, d:].double()
    bound = 0.5 * ulp(y64.abs() * (1 + 2.0 ** -20), dtype) + 5 * 2.0 ** -24 * y64.abs()
    assert ((ops.silu_and_mul(x).double() - y64).abs() <= bound).all()
    assert ((F.silu(x[:, :d]) * x[:, d:]).double() - y64).abs().gt(bound).any()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_norm_fp8_values_quantize_the_reference_norms_bit_for_bit_on_cpu(dtype, fp8):
    """rms_norm_fp8 and fused_add_rms_norm_fp8: quantize_fp8 of F.rms_norm's output by default, of Llama's
    (vLLM's native) norm with round_before_weight, codes and scales bit for bit."""
    changed = 0
    for granularity, scale in (("row", None), ("group", None), ("tensor", torch.tensor(0.01))):
        x, w = norm_inputs(83, 4096, dtype, seed=3)
        r, _ = norm_inputs(83, 4096, dtype, seed=4)
        for round_before_weight in (False, True):
            reference = (llama_rms_norm if round_before_weight else
                         lambda t, w, eps: F.rms_norm(t, (t.shape[-1],), w, eps))
            codes, scales = ops.rms_norm_fp8(x, w, 1e-6, granularity, fp8, scale,
                                             round_before_weight=round_before_weight)
            want_codes, want_scales = ops.quantize_fp8(reference(x, w, 1e-6), granularity, fp8, scale)
            assert torch.equal(codes.view(torch.uint8), want_codes.view(torch.uint8))
            assert torch.equal(scales, want_scales)
            residual = r.clone()
            codes_add, scales_add = ops.fused_add_rms_norm_fp8(x, residual, w, 1e-6, granularity, fp8, scale,
                                                               round_before_weight=round_before_weight)
            assert torch.equal(residual, r + x)
            want_codes, want_scales = ops.quantize_fp8(reference(r + x, w, 1e-6), granularity, fp8, scale)
            assert torch.equal(codes_add.view(torch.uint8), want_codes.view(torch.uint8))
            assert torch.equal(scales_add, want_scales)
            if round_before_weight:
                default, default_scales = ops.rms_norm_fp8(x, w, 1e-6, granularity, fp8, scale)
                changed += int((default.view(torch.uint8) != codes.view(torch.uint8)).sum())
                if (dtype, fp8, granularity) == (torch.bfloat16, torch.float8_e4m3fn, "row"):  # docs/numerics.md
                    assert int((default_scales != scales).sum()) == 14
                    assert int((default.view(torch.uint8) != codes.view(torch.uint8)).sum()) == 8693
                    assert int((ops.rms_norm(x, w, 1e-6) != reference(x, w, 1e-6)).sum()) == 88360
    assert (changed > 0) == (dtype != torch.float32)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_round_before_weight_on_cuda(dtype):
    """The CUDA kernels honour round_before_weight: x * inv rounded, then times the weight. The kernel with a
    weight of ones stores x * inv rounded with the same inv; times w in the dtype that is the option's result.
    Rows reach a lane kernel (64), a block per row (4096) and the element-wise path (100)."""
    for hidden in (64, 4096, 100):
        x, w = (t.cuda() for t in norm_inputs(7, hidden, dtype, seed=hidden))
        r, _ = (t.cuda() for t in norm_inputs(7, hidden, dtype, seed=hidden + 1))
        ones = torch.ones_like(w)
        y = ops.rms_norm(x, w, 1e-6, round_before_weight=True)
        assert torch.equal(y, ops.rms_norm(x, ones, 1e-6) * w)
        torch.testing.assert_close(y.cpu(), llama_rms_norm(x.cpu(), w.cpu(), 1e-6), rtol=TOL[dtype], atol=1e-5)
        xa, ra, xb, rb = x.clone(), r.clone(), x.clone(), r.clone()
        ops.fused_add_rms_norm(xa, ra, w, 1e-6, round_before_weight=True)
        ops.fused_add_rms_norm(xb, rb, ones, 1e-6)
        assert torch.equal(ra, rb) and torch.equal(xa, xb * w)
        for granularity in ("row", "group"):
            codes, scales = ops.rms_norm_fp8(x, w, 1e-6, granularity, round_before_weight=True)
            want = ops.quantize_fp8(y, granularity)
            assert torch.equal(codes.view(torch.uint8), want[0].view(torch.uint8)) and torch.equal(scales, want[1])
            residual = r.clone()
            codes, scales = ops.fused_add_rms_norm_fp8(x, residual, w, 1e-6, granularity, round_before_weight=True)
            want = ops.quantize_fp8(ops.rms_norm(r + x, w, 1e-6, round_before_weight=True), granularity)
            assert torch.equal(codes.view(torch.uint8), want[0].view(torch.uint8)) and torch.equal(scales, want[1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_quantize_fp8_divides_where_vllm_multiplies_by_the_reciprocal(dtype, fp8):
    """code = x / scale in float32, rounded to FP8 once: within half an FP8 step of the exact quotient (plus
    the float32 quotient's rounding). vLLM's x * (1 / scale) rounds twice: one FP8 step off where x / scale
    falls on (or within a float32 rounding of) a midpoint between two codes, never more: with computed
    scales 312 of these 1,048,576 bfloat16 elements and 62 float16 ones for e4m3, none for float32."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(64, 16384, generator=g) * torch.logspace(-3, 3, 64).unsqueeze(-1)).to(dtype)
    codes, scales = ops.quantize_fp8(x, "row", fp8)
    top = torch.finfo(fp8).max
    vllm = (x.float() * torch.reciprocal(scales)).clamp(-top, top).to(fp8)
    steps = (codes.view(torch.uint8).int() - vllm.view(torch.uint8).int()).abs()  # same sign: adjacent codes
    assert steps.max() <= 1
    if fp8 == torch.float8_e4m3fn:
        assert int(steps.sum()) == {torch.bfloat16: 312, torch.float16: 62, torch.float32: 0}[dtype]
    quotient = x.double() / scales.double()
    mantissa = 3 if fp8 == torch.float8_e4m3fn else 2
    spacing = torch.exp2(torch.floor(torch.log2(quotient.abs().clamp_min(torch.finfo(fp8).smallest_normal)))
                         - mantissa)
    assert ((codes.double() - quotient).abs() <= spacing / 2 + quotient.abs() * 2.0 ** -24).all()


@pytest.mark.filterwarnings(r"ignore:`torch\.jit\.script` is deprecated:FutureWarning")
def test_round_before_weight_in_every_mode():
    """The option passes through opcheck (fake kernels, autograd registration, compile), torch.compile, vmap
    (batch merged, and per-sample weights), TorchScript and autograd (x_hat's rounding differentiates as 1)."""
    x, w = norm_inputs(6, 64, torch.bfloat16, seed=1)
    x = x.view(2, 3, 64)
    expected = ops.rms_norm(x, w, 1e-6, round_before_weight=True)
    option = {"round_before_weight": True}
    torch.library.opcheck(torch.ops.ops.rms_norm.default, (x, w, 1e-6), option)
    torch.library.opcheck(torch.ops.ops.fused_add_rms_norm.default, (x.clone(), x.clone(), w, 1e-6), option)
    torch.library.opcheck(torch.ops.ops._rms_norm_tensor_eps.default, (x, w, torch.tensor(1e-6, dtype=torch.float64)),
                          option)
    torch.library.opcheck(torch.ops.ops.rms_norm_fp8.default, (x, w, 1e-6), option,
                          test_utils=("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic"))
    assert torch.equal(torch.ops.ops._rms_norm_tensor_eps(x, w, torch.tensor(1e-6, dtype=torch.float64), **option),
                       expected)
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: ops.rms_norm(t, w, 1e-6, round_before_weight=True), fullgraph=True)
    assert torch.equal(compiled(x), expected)
    assert torch.equal(torch.vmap(lambda t: ops.rms_norm(t, w, 1e-6, round_before_weight=True))(x), expected)
    weights = torch.stack([w, w * 2])
    per_sample = torch.vmap(lambda t, v: ops.rms_norm(t, v, 1e-6, round_before_weight=True))(x, weights)
    assert torch.equal(per_sample[1], ops.rms_norm(x[1], w * 2, 1e-6, round_before_weight=True))
    def add_norm(h, r):
        ops.fused_add_rms_norm(h, r, w, 1e-6, round_before_weight=True)
        return h

    residual, hidden = x.clone(), x.clone()
    torch.vmap(add_norm)(hidden, residual)
    assert torch.equal(hidden, ops.rms_norm(x + x, w, 1e-6, round_before_weight=True))
    codes = torch.vmap(lambda t: ops.rms_norm_fp8(t, w, 1e-6, round_before_weight=True))(x)[0]
    assert torch.equal(codes.view(torch.uint8), ops.quantize_fp8(expected)[0].view(torch.uint8))

    @torch.jit.script
    def scripted(t: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(t, v, 1e-6, round_before_weight=True)

    assert torch.equal(scripted(x, w), expected)
    xf = x.float().requires_grad_()
    wf = w.float().requires_grad_()
    grads = torch.autograd.grad(ops.rms_norm(xf, wf, 1e-6, round_before_weight=True).sum(), (xf, wf))
    want = torch.autograd.grad(F.rms_norm(xf, (64,), wf, 1e-6).sum(), (xf, wf))
    for got, ref in zip(grads, want):
        torch.testing.assert_close(got, ref)


def test_numerics_doc_names_tests_that_exist():
    """docs/numerics.md says which test checks each claim: every test it names is defined where it says."""
    import re
    text = open(os.path.join(REPO, "docs", "numerics.md")).read()
    named = set(re.findall(r"`(?:tests/(\w+)\.py::)?(test_\w+)`", text))
    assert len(named) >= 15
    for module, name in named:
        source = open(os.path.join(REPO, "tests", f"{module or 'test_fused'}.py")).read()
        assert f"def {name}(" in source, (module, name)
