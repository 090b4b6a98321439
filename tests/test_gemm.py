"""ops.cutlass_gemm on every available device: values against torch.mm, layouts, out variants, empty
problems, bad inputs, opcheck."""

import itertools

import pytest
import torch

import ops
from conftest import DEVICES, REPO, run_python

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def tolerance(dtype, device):
    """Elementwise tolerance (atol = rtol) against torch.mm on the same inputs.

    On CPU both sides are ATen's BLAS, but the half types accumulate/round differently between at::mm
    paths; on CUDA cuBLAS and CUTLASS use different summation orders. Half-type outputs are rounded to
    11 (fp16) or 8 (bf16) significant bits: one or two ulps of a value of size ~sqrt(K) for our N(0,1)
    inputs. fp32 on CUDA may run TF32 on either side only if allowed (tests keep the default: not).
    """
    return {torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float32: 1e-4, torch.float64: 1e-10}[dtype]


def matrix(rows, cols, dtype, device, layout, offset=0, gen=None):
    """A (rows x cols) matrix with values N(0, 1), in `layout`:
    row: contiguous; col: a transposed view; strided: every other column of a wider tensor;
    offset: `offset` elements into its storage."""
    g = gen or torch.Generator().manual_seed(rows * 1000 + cols)
    if layout == "row":
        base = torch.randn(rows * cols + offset, generator=g, dtype=torch.float64)
        t = base[offset:].view(rows, cols)
    elif layout == "col":
        base = torch.randn(rows * cols + offset, generator=g, dtype=torch.float64)
        t = base[offset:].view(cols, rows).t()
    elif layout == "strided":
        base = torch.randn(rows * 2 * cols + offset, generator=g, dtype=torch.float64)
        t = base[offset:].view(rows, 2 * cols)[:, ::2]
    else:
        raise ValueError(layout)
    # Convert the storage, then re-take the same view, so strides and offset survive the dtype change.
    storage = t.as_strided((t.untyped_storage().nbytes() // 8,), (1,), 0).to(dtype=dtype, device=device)
    return storage.as_strided(t.shape, t.stride(), t.storage_offset())


def check_close(actual, A, B, dtype, device):
    expected = torch.mm(A.double().cpu(), B.double().cpu())
    tol = tolerance(dtype, device)
    # Compare against the float64 product, normalised by sqrt(K) (the size of a sum of K N(0,1) terms).
    scale = max(1.0, A.shape[1] ** 0.5)
    torch.testing.assert_close(actual.double().cpu() / scale, expected / scale, atol=tol, rtol=tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout_a,layout_b", list(itertools.product(["row", "col", "strided"], repeat=2)))
def test_values_all_layouts(device, dtype, layout_a, layout_b):
    M, N, K = 37, 24, 56  # M != N != K: a wrong stride order or swap cannot hide
    A = matrix(M, K, dtype, device, layout_a)
    B = matrix(K, N, dtype, device, layout_b)
    C = ops.cutlass_gemm(A, B)
    assert C.shape == (M, N) and C.dtype == dtype and C.device.type == device
    assert C.is_contiguous()
    check_close(C, A, B, dtype, device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout_a,layout_b", list(itertools.product(["row", "col", "strided"], repeat=2)))
def test_cpu_values_are_torch_mm_bits(dtype, layout_a, layout_b):
    # On CPU the op is torch.mm's kernel: the same bits whichever backend torch picks (BLAS, oneDNN), an out
    # variant torch.mm's into the same layout (a column-major out computes the transposed product: other bits
    # than a row-major one in float64 with MKL on AMD EPYC).
    A, B = matrix(37, 56, dtype, "cpu", layout_a), matrix(56, 24, dtype, "cpu", layout_b)
    assert torch.equal(ops.cutlass_gemm(A, B), torch.mm(A, B))
    out, expected = torch.empty(24, 37, dtype=dtype).t(), torch.empty(24, 37, dtype=dtype).t()
    assert torch.equal(ops.cutlass_gemm(A, B, out=out), torch.mm(A, B, out=expected))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offset", [1, 3, 8])
def test_storage_offsets(device, dtype, offset):
    M, N, K = 16, 40, 24
    A = matrix(M, K, dtype, device, "row", offset=offset)
    B = matrix(K, N, dtype, device, "col", offset=offset + 1)
    check_close(ops.cutlass_gemm(A, B), A, B, dtype, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("out_layout", ["row", "col", "strided"])
def test_out_variant(device, dtype, out_layout):
    M, N, K = 20, 33, 17
    A = matrix(M, K, dtype, device, "row")
    B = matrix(K, N, dtype, device, "row")
    out = matrix(M, N, dtype, device, out_layout).fill_(float("nan"))
    storage_before = out.untyped_storage().data_ptr()
    result = ops.cutlass_gemm(A, B, out=out)
    assert result is out
    assert out.untyped_storage().data_ptr() == storage_before  # written in place, not reallocated
    check_close(out, A, B, dtype, device)
    # The schema-level op (what TorchScript and C++ call) writes out too and returns nothing.
    out2 = torch.full_like(out, float("nan"))
    assert torch.ops.ops.cutlass_gemm.out(A, B, out=out2) is None
    check_close(out2, A, B, dtype, device)


@pytest.mark.parametrize("device", DEVICES)
def test_out_strided_leaves_gaps_untouched(device):
    A = matrix(5, 6, torch.float32, device, "row")
    B = matrix(6, 7, torch.float32, device, "row")
    base = torch.full((5, 14), -7.0, device=device)
    ops.cutlass_gemm(A, B, out=base[:, ::2])
    assert torch.all(base[:, 1::2] == -7.0)  # the columns between the out view's columns


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,N,K", [(0, 5, 3), (4, 0, 3), (4, 5, 0), (0, 0, 0), (1, 1, 1), (1, 9, 1)])
def test_empty_and_tiny(device, dtype, M, N, K):
    A = torch.randn(M, K, dtype=torch.float64).to(dtype=dtype, device=device)
    B = torch.randn(K, N, dtype=torch.float64).to(dtype=dtype, device=device)
    C = ops.cutlass_gemm(A, B)
    assert C.shape == (M, N)
    check_close(C, A, B, dtype, device)
    out = torch.full((M, N), float("nan"), dtype=dtype, device=device)
    ops.cutlass_gemm(A, B, out=out)
    if K == 0:
        assert torch.all(out == 0)
    check_close(out, A, B, dtype, device)


BAD_INPUTS = [
    # (description, A, B, out, message pattern)
    ("1-D A", lambda d: torch.randn(4, device=d), lambda d: torch.randn(4, 3, device=d), None,
     r"cutlass_gemm: expected A to be a 2-D matrix \(M, K\), got a 1-D tensor"),
    ("3-D B", lambda d: torch.randn(4, 4, device=d), lambda d: torch.randn(2, 4, 3, device=d), None,
     r"cutlass_gemm: expected B to be a 2-D matrix \(K, N\), got a 3-D tensor"),
    ("K mismatch", lambda d: torch.randn(4, 5, device=d), lambda d: torch.randn(4, 3, device=d), None,
     r"cutlass_gemm: A \(M, K\) and B \(K, N\) must agree on K"),
    ("mixed dtypes", lambda d: torch.randn(4, 4, device=d),
     lambda d: torch.randn(4, 3, device=d, dtype=torch.float16), None,
     r"cutlass_gemm: A and B must have the same dtype, got A torch.float32 and B torch.float16"),
    ("int64", lambda d: torch.ones(4, 4, device=d, dtype=torch.int64),
     lambda d: torch.ones(4, 3, device=d, dtype=torch.int64), None,
     r"cutlass_gemm: expected A's dtype to be float16, bfloat16, float32 or float64, got torch.int64"),
    ("complex", lambda d: torch.ones(4, 4, device=d, dtype=torch.complex64),
     lambda d: torch.ones(4, 3, device=d, dtype=torch.complex64), None,
     r"expected A's dtype to be float16, bfloat16, float32 or float64, got torch.complex64"),
    ("bool", lambda d: torch.ones(4, 4, device=d, dtype=torch.bool),
     lambda d: torch.ones(4, 3, device=d, dtype=torch.bool), None,
     r"expected A's dtype to be float16, bfloat16, float32 or float64, got torch.bool"),
    ("out wrong shape", lambda d: torch.randn(4, 4, device=d), lambda d: torch.randn(4, 3, device=d),
     lambda d: torch.empty(4, 4, device=d),
     r"cutlass_gemm: expected out of shape \(M, N\) = \(4, 3\), got \[4, 4\]"),
    ("out wrong dtype", lambda d: torch.randn(4, 4, device=d), lambda d: torch.randn(4, 3, device=d),
     lambda d: torch.empty(4, 3, device=d, dtype=torch.float64),
     r"cutlass_gemm: expected out's dtype to be torch.float32 \(the dtype of A and B\), got torch.float64"),
    ("out expanded", lambda d: torch.randn(4, 4, device=d), lambda d: torch.randn(4, 3, device=d),
     lambda d: torch.empty(1, 3, device=d).expand(4, 3),
     r"cutlass_gemm: out has internally overlapping memory"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_inputs(device, case):
    _, make_a, make_b, make_out, pattern = case
    A, B = make_a(device), make_b(device)
    with pytest.raises(RuntimeError, match=pattern):
        if make_out is None:
            ops.cutlass_gemm(A, B)
        else:
            ops.cutlass_gemm(A, B, out=make_out(device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["A", "B"])
def test_out_overlapping_input_is_an_error(device, which):
    A = torch.randn(4, 4, device=device)
    B = torch.randn(4, 4, device=device)
    out = A if which == "A" else B.t()  # the same memory, even through a view
    before = out.clone()
    with pytest.raises(RuntimeError, match=f"cutlass_gemm: out overlaps {which} in memory"):
        ops.cutlass_gemm(A, B, out=out)
    assert torch.equal(out, before)  # nothing written


@pytest.mark.parametrize("device", DEVICES)
def test_out_on_other_device_is_an_error(device):
    A = torch.randn(4, 4, device=device)
    B = torch.randn(4, 3, device=device)
    other = "meta"
    with pytest.raises(RuntimeError, match=rf"^cutlass_gemm: expected out on {device}\S* \(the device of A and B\), "
                                           rf"got {other}"):
        ops.cutlass_gemm(A, B, out=torch.empty(4, 3, device=other))


def test_inputs_on_different_devices_is_an_error():
    A = torch.randn(4, 4)
    B = torch.randn(4, 3, device="meta")
    with pytest.raises(RuntimeError, match=r"cutlass_gemm: A and B must be on the same device"):
        ops.cutlass_gemm(A, B)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_opcheck(device, dtype):
    A = matrix(8, 12, dtype, device, "row")
    B = matrix(12, 16, dtype, device, "col")
    torch.library.opcheck(torch.ops.ops.cutlass_gemm.default, (A, B))
    out = torch.empty(8, 16, dtype=dtype, device=device)
    torch.library.opcheck(torch.ops.ops.cutlass_gemm.out, (A, B), {"out": out})
    # Transposed output and sliced inputs: the fake kernel must match the real one.
    torch.library.opcheck(torch.ops.ops.cutlass_gemm.default, (A[1:, ::2], B[::2, 1:]))
    out_t = torch.empty(16, 8, dtype=dtype, device=device).t()
    torch.library.opcheck(torch.ops.ops.cutlass_gemm.out, (A, B), {"out": out_t})


@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_fake_kernel_error_messages_equal_the_real_kernels(case):
    # The fake kernel (torch._check, used under torch.compile / export) and the C++ checks say the same.
    def message(device):
        _, make_a, make_b, make_out, _ = case
        with pytest.raises(RuntimeError) as info:
            out = {} if make_out is None else {"out": make_out(device)}
            ops.cutlass_gemm(make_a(device), make_b(device), **out)
        return str(info.value).splitlines()[0]

    assert message("meta") == message("cpu")


@pytest.mark.parametrize("case", ["A", "B-transposed", "partial"])
def test_fake_kernel_out_overlap_errors_equal_the_real_kernels(case):
    # The fake kernel checks out against A and B as the real kernels do: a compiled out= call (aot_eager)
    # raises where eager raises.
    def message(device):
        X = torch.randn(4, 4, device=device)
        A, B, out = {"A": (X, torch.randn(4, 4, device=device), X),
                     "B-transposed": (torch.randn(4, 4, device=device), X, X.t()),
                     "partial": (X[0:2], torch.randn(4, 4, device=device), X[1:3])}[case]
        with pytest.raises(RuntimeError) as info:
            ops.cutlass_gemm(A, B, out=out)
        return str(info.value).splitlines()[0]

    assert message("meta") == message("cpu")
    assert "cutlass_gemm: out overlaps" in message("cpu")


def test_fake_kernel_errors_match_real_ones():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        A = torch.empty(4, 5)
        B = torch.empty(4, 3)
        with pytest.raises(RuntimeError, match=r"cutlass_gemm: A \(M, K\) and B \(K, N\) must agree on K"):
            torch.ops.ops.cutlass_gemm(A, B)
        C = torch.ops.ops.cutlass_gemm(torch.empty(4, 5), torch.empty(5, 3))
        assert C.shape == (4, 3) and C.stride() == (3, 1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cols", [slice(0, 4), slice(4, 8), slice(2, 6)], ids=["same", "disjoint", "partial"])
def test_out_sharing_a_buffer_with_a_strided_input_is_right(device, cols):
    # out and A are strided views of one buffer: the overlap analysis cannot decide, so the op must
    # compute into a temporary (in place, it would give a wrong result without an error).
    X = torch.randn(6, 8, dtype=torch.float64, device=device)
    B = torch.randn(4, 4, dtype=torch.float64, device=device)
    A = X[:, :4]
    expected = A.clone() @ B
    ops.cutlass_gemm(A, B, out=X[:, cols])
    torch.testing.assert_close(X[:, cols], expected)


@pytest.mark.parametrize("case", ["full", "partial", "disjoint", "strided", "strided-overlap"])
def test_out_sharing_memory_through_another_storage(case):
    # torch.from_numpy of one array twice gives two storages over one buffer, which ATen's overlap analysis
    # (storage identity) takes for disjoint: out overlapping A must still be an error,
    # and strided views the analysis cannot decide are computed through a temporary.
    np = pytest.importorskip("numpy")
    buffer = np.random.default_rng(0).standard_normal((8, 8))
    X, Y = torch.from_numpy(buffer), torch.from_numpy(buffer)
    assert not X.is_set_to(Y) and X.data_ptr() == Y.data_ptr()
    B = torch.randn(4, 4, dtype=torch.float64)
    rows = lambda T, first: T.view(-1)[8 * first:8 * first + 16].view(4, 4)  # buffer rows first, first + 1
    A, out = {"full": (rows(X, 0), rows(Y, 0)), "partial": (rows(X, 0), rows(Y, 1)),
              "disjoint": (rows(X, 0), rows(Y, 4)), "strided": (X[:4, :4], Y[:4, 4:]),
              "strided-overlap": (X[:4, :4], Y[:4, 2:6])}[case]
    expected = A.clone() @ B
    if case in ("full", "partial"):
        before = out.clone()
        with pytest.raises(RuntimeError, match="cutlass_gemm: out overlaps A in memory"):
            ops.cutlass_gemm(A, B, out=out)
        assert torch.equal(out, before)
    else:
        ops.cutlass_gemm(A, B, out=out)
        torch.testing.assert_close(out, expected)


def test_negative_views_read_resolved_and_written_refused():
    # A negative view (z.conj().imag: memory holding -values, the negative bit set) as out would make
    # PyTorch's Negative-key fallback fail an internal assert and corrupt memory (a later op segfaults):
    # a clear error, checked in a fresh process so that a regression cannot take this one down.
    result = run_python(
        "import torch, ops\n"
        "z = torch.randn(4, 4, dtype=torch.complex128)\n"
        "A, B = z.conj().imag, torch.randn(4, 4, dtype=torch.float64)\n"
        "assert A.is_neg()\n"
        "torch.testing.assert_close(ops.cutlass_gemm(A, B), A.resolve_neg() @ B)\n"  # read: resolved
        "out = torch.randn(4, 4, dtype=torch.complex128).conj().imag\n"
        "before = out.clone()\n"
        "try:\n"
        "    ops.cutlass_gemm(A.resolve_neg(), B, out=out)\n"
        "except RuntimeError as e:\n"
        "    print('ERROR', str(e).splitlines()[0])\n"
        "assert torch.equal(out, before)\n"
        "print('SUM', (out.sum() + A.sum()).item())\n", cwd=REPO, env={"PYTHONPATH": REPO})
    assert result.returncode == 0, result.stderr[-3000:]
    assert ("ERROR cutlass_gemm.out: out is written in place but is a negative view (its negative bit is set, "
            "e.g. z.conj().imag)") in result.stdout, result.stdout
    assert "SUM" in result.stdout


def test_undefined_input_names_the_argument():
    with pytest.raises(RuntimeError, match="cutlass_gemm: A must be a defined tensor"):
        torch.ops.ops.cutlass_gemm(None, torch.randn(2, 2))
