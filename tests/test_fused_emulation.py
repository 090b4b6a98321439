"""The CUDA kernels of rms_norm, fused_add_rms_norm and silu_and_mul (csrc/fused_kernels.cu), GPU-only
code, checked on the host: compiled with the host C++ compiler against emulated blocks (whole blocks of
threads, warp shuffles, __syncthreads, shared memory; tests/cpp/warp_emulation.h) and run through their
real launchers (tests/cpp/fused_emulation.cpp). Every kernel the launchers choose: the lane-group kernels
(rows of 4, 8, 16, 32 packs), one block per row, the register-resident variants (1, 2, 4, 8 packs per
thread), the element-wise paths for rows not in 16-byte packs; each against the CPU op, within the
rounding of one ulp of the dtype (the two sum the squares in other orders)."""

import pytest
import torch

import ops
from emulation import DTYPE_CODE

# rtol, atol per dtype: about two of the dtype's epsilons (the sum order moves 1/rms by an ulp of float32,
# which can move the output's rounding).
TOL = {torch.float16: (2e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5), torch.float32: (1e-5, 1e-7),
       torch.float64: (1e-12, 1e-14)}
PACK = {torch.float16: 8, torch.bfloat16: 8, torch.float32: 4, torch.float64: 2}
GUARD = -3.0


def widths(dtype):
    """Row lengths that reach every kernel: 1-32 packs (lane groups of 4, 8, 16, 32), a block per row
    (up to 1024 threads, several packs each), and lengths that are not a whole number of packs."""
    p = PACK[dtype]
    return [4 * p, 8 * p, 13 * p, 32 * p, 33 * p, 640 * p, 1031 * p + p // 2 if p > 1 else 1031, 7]


def with_guard(t):
    """A flat buffer holding t and 32 guard elements after it, and the view of t in it."""
    buf = torch.full((t.numel() + 32,), GUARD, dtype=t.dtype)
    view = buf[:t.numel()].view(t.shape)
    view.copy_(t)
    return buf, view


def check_guard(buf, n):
    assert torch.all(buf[n:] == GUARD), "a store past the output"


@pytest.fixture(params=[0, 1, 2, 4, 8], ids=lambda p: f"packs{p}")
def packs(request, fused_emulation):
    previous = fused_emulation.ops_emulate_set_rms_norm_packs_per_thread(request.param)
    assert previous >= 0
    yield request.param
    fused_emulation.ops_emulate_set_rms_norm_packs_per_thread(previous)


@pytest.mark.parametrize("dtype", list(DTYPE_CODE))
def test_rms_norm_and_fused_add_rms_norm(fused_emulation, packs, dtype):
    lib = fused_emulation
    g = torch.Generator().manual_seed(packs)
    for hidden in widths(dtype):
        if packs and hidden < 33 * PACK[dtype]:
            continue  # rows of at most 32 packs take the lane kernels whatever the setting
        for rows in (1, 3, 70):
            if rows == 70 and hidden > 64 * PACK[dtype]:
                continue  # a block per row: three rows show the indexing
            x = (torch.randn(rows, hidden, generator=g) * 3).to(dtype)
            w = (torch.rand(hidden, generator=g) + 0.5).to(dtype)
            r = torch.randn(rows, hidden, generator=g).to(dtype)
            rtol, atol = TOL[dtype]
            ybuf, y = with_guard(torch.zeros_like(x))
            assert lib.ops_emulate_rms_norm(DTYPE_CODE[dtype], x.data_ptr(), w.data_ptr(), y.data_ptr(), rows, hidden,
                                            1e-6, 0) == 0
            check_guard(ybuf, x.numel())
            torch.testing.assert_close(y, ops.rms_norm(x, w, 1e-6), rtol=rtol, atol=atol)
            xbuf, xe = with_guard(x)
            rbuf, re = with_guard(r)
            assert lib.ops_emulate_fused_add_rms_norm(DTYPE_CODE[dtype], xe.data_ptr(), re.data_ptr(), w.data_ptr(),
                                                      rows, hidden, 1e-6, 0) == 0
            check_guard(xbuf, x.numel())
            check_guard(rbuf, x.numel())
            xc, rc = x.clone(), r.clone()
            ops.fused_add_rms_norm(xc, rc, w, 1e-6)
            assert torch.equal(re, rc)  # residual + x rounded once: the same bits
            torch.testing.assert_close(xe, xc, rtol=rtol, atol=atol)


def emulated_norm(lib, x, w, round_x_hat, residual=None):
    """The emulated rms_norm kernel's output (fused_add_rms_norm's with `residual`, updated in place)."""
    rows, hidden = x.shape
    if residual is None:
        y = torch.empty_like(x)
        assert lib.ops_emulate_rms_norm(DTYPE_CODE[x.dtype], x.data_ptr(), w.data_ptr(), y.data_ptr(), rows, hidden,
                                        1e-6, int(round_x_hat)) == 0
        return y
    y = x.clone()
    assert lib.ops_emulate_fused_add_rms_norm(DTYPE_CODE[x.dtype], y.data_ptr(), residual.data_ptr(), w.data_ptr(),
                                              rows, hidden, 1e-6, int(round_x_hat)) == 0
    return y


@pytest.mark.parametrize("dtype", list(DTYPE_CODE))
def test_round_before_weight_in_every_rms_norm_kernel(fused_emulation, packs, dtype):
    """rms_norm's round_before_weight on CUDA: each element x * inv rounded to the dtype, then times the weight
    and rounded again. The kernel with a weight of ones stores x * inv rounded, with the same inv (the sum does
    not read the weight): times w in the dtype, that is the option's result bit for bit."""
    lib = fused_emulation
    g = torch.Generator().manual_seed(10 + packs)
    differ = 0
    for hidden in widths(dtype):
        if packs and hidden < 33 * PACK[dtype]:
            continue
        for rows in (1, 3):
            x = (torch.randn(rows, hidden, generator=g) * 3).to(dtype)
            w = (torch.rand(hidden, generator=g) + 0.5).to(dtype)
            r = torch.randn(rows, hidden, generator=g).to(dtype)
            ones = torch.ones_like(w)
            y = emulated_norm(lib, x, w, True)
            assert torch.equal(y, emulated_norm(lib, x, ones, False) * w)
            rtol, atol = TOL[dtype]
            torch.testing.assert_close(y, ops.rms_norm(x, w, 1e-6, round_before_weight=True), rtol=rtol, atol=atol)
            differ += int((y != emulated_norm(lib, x, w, False)).sum())
            residual, residual_ones = r.clone(), r.clone()
            y_add = emulated_norm(lib, x, w, True, residual=residual)
            assert torch.equal(y_add, emulated_norm(lib, x, ones, False, residual=residual_ones) * w)
            assert torch.equal(residual, residual_ones)
    assert (differ > 0) == (dtype in (torch.float16, torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("granularity", ["row", "group", "tensor"])
@pytest.mark.parametrize("add", [False, True], ids=["rms_norm_fp8", "fused_add_rms_norm_fp8"])
def test_norm_fp8_kernels_with_round_before_weight(fused_emulation, dtype, granularity, add):
    """The FP8 norm kernels with round_before_weight: quantize_fp8 of the emulated rms_norm kernel's output with
    the option, codes and scales bit for bit, over the lane kernels and a block per row."""
    lib = fused_emulation
    pack = PACK[dtype]
    fp8 = torch.float8_e4m3fn
    differ = 0
    for packs in (3, 16, 33, 640):
        k = packs * pack
        rows = 5
        g = torch.Generator().manual_seed(packs)
        x = (torch.randn(rows, k, generator=g) * 3).to(dtype)
        w = (torch.rand(k, generator=g) + 0.5).to(dtype)
        r = torch.randn(rows, k, generator=g).to(dtype)
        groups = -(-k // 128)
        given = torch.tensor([0.02]) if granularity == "tensor" else None
        codes = torch.empty(rows, k, dtype=torch.uint8)
        scales = torch.empty(rows * (groups if granularity == "group" else 1))
        residual = r.clone() if add else None
        status = lib.ops_emulate_rms_norm_fp8(
            DTYPE_CODE[dtype], 0, int(granularity == "group"), x.data_ptr(),
            None if residual is None else residual.data_ptr(), w.data_ptr(), codes.data_ptr(),
            None if given is not None else scales.data_ptr(), rows, k, 1e-6,
            None if given is None else given.data_ptr(), 0, 0, 1)
        assert status == 0
        source = x
        if add:
            source = r.clone()
            emulated_norm(lib, x, w, True, residual=source)  # the residual the kernel leaves, then its norm
            assert torch.equal(residual, source)
        want_codes, want_scales = ops.quantize_fp8(emulated_norm(lib, source, w, True), granularity, fp8, given)
        assert torch.equal(codes, want_codes.view(torch.uint8))
        if given is None:
            assert torch.equal(scales, want_scales.reshape(-1))
        default = ops.quantize_fp8(emulated_norm(lib, source, w, False), granularity, fp8, given)[0]
        differ += int((codes != default.view(torch.uint8)).sum())
    assert (differ > 0) == (dtype != torch.float32)  # the option changes codes of half types only


def check_silu_and_mul(lib, dtype, rows, d, g):
    """The emulated kernel on (rows, 2d) random values against the CPU op; nothing written past the output."""
    x = (torch.randn(rows, 2 * d, generator=g) * 4).to(dtype)
    obuf, out = with_guard(torch.zeros(rows, d, dtype=dtype))
    assert lib.ops_emulate_silu_and_mul(DTYPE_CODE[dtype], x.data_ptr(), out.data_ptr(), rows, d) == 0
    check_guard(obuf, rows * d)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(out, ops.silu_and_mul(x), rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", list(DTYPE_CODE))
def test_silu_and_mul(fused_emulation, dtype):
    g = torch.Generator().manual_seed(1)
    for d in (PACK[dtype], 3 * PACK[dtype], 1000 * PACK[dtype], 5, 1001):
        for rows in (1, 5, 300):
            check_silu_and_mul(fused_emulation, dtype, rows, d, g)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("blocks", [1, 3])
def test_silu_and_mul_grid_stride_wraps(fused_emulation, dtype, blocks):
    # Past 65535 * 32 blocks the kernel's threads each take several items, stepping rows and columns by the
    # grid's stride: strides shorter and longer than a row, packed and element-wise rows.
    before = fused_emulation.ops_emulate_set_silu_max_blocks(blocks)
    try:
        g = torch.Generator().manual_seed(2)
        for rows, d in ((3, 1000 * PACK[dtype]), (300, PACK[dtype]), (40, 5), (7, 1001)):
            check_silu_and_mul(fused_emulation, dtype, rows, d, g)
    finally:
        assert fused_emulation.ops_emulate_set_silu_max_blocks(before) == blocks


def test_a_rms_norm_setting_outside_the_list_is_refused(fused_emulation):
    assert fused_emulation.ops_emulate_set_rms_norm_packs_per_thread(3) == -1
