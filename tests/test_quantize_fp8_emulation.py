"""The FP8 quantization CUDA kernels (csrc/quantize_fp8_kernels.cuh), GPU-only code, checked on the host:
compiled with the host C++ compiler against emulated blocks (tests/cpp/warp_emulation.h) into a shared
library (tests/cpp/fused_emulation.cpp, tests/emulation.py) and run through their real launcher. Their codes
and scales must be quantize_fp8's on CPU bit for bit (NaN as NaN), for every input dtype, FP8 format,
granularity (row, 1x128 group, tensor with a given scale), pow2 and static scales, and silu_and_mul_fp8's
rows; no load leaves the input, no store passes the outputs."""

import pytest
import torch

import ops
from emulation import DTYPE_CODE, NOT_SUPPORTED

DTYPES = [torch.float16, torch.bfloat16, torch.float32]  # the kernels' (float64 runs the formula)
E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
CODE_GUARD, SCALE_GUARD = 0x5A, -7.0


@pytest.fixture
def lib(fused_emulation):
    return fused_emulation


class Outputs:
    """Guarded output buffers of one emulated quantization of `rows` rows of k: codes and scales with guard
    elements after them, the given scales' layout, and the checks after the launch."""

    def __init__(self, rows, k, granularity, given):
        self.rows, self.k, self.given = rows, k, given
        groups = -(-k // 128)
        self.n_scales = rows * groups if granularity == "group" else rows
        self.codes = torch.full((rows * k + 64,), CODE_GUARD, dtype=torch.uint8)
        self.scales = torch.full((self.n_scales + 16,), SCALE_GUARD)
        self.given_c = None if given is None else given.contiguous()
        self.stride = {"tensor": 0, "row": 1, "group": groups}[granularity]
        self.scales_ptr = None if given is not None else self.scales.data_ptr()
        self.given_ptr = None if self.given_c is None else self.given_c.data_ptr()

    def result(self, status, fp8):
        """(codes (rows, k), scales), or None where the kernel refused the rows."""
        if status == NOT_SUPPORTED:
            return None
        assert status == 0
        n = self.rows * self.k
        assert torch.all(self.codes[n:] == CODE_GUARD), "a code was stored past the codes"
        assert torch.all(self.scales[self.n_scales:] == SCALE_GUARD), "a scale was stored past the scales"
        if self.given is not None:
            assert torch.all(self.scales == SCALE_GUARD), "scales were stored although they were given"
        return self.codes[:n].view(fp8).view(self.rows, self.k), self.scales[:self.n_scales]


def emulate(lib, x, k, granularity, fp8, pow2=False, given=None, silu=False):
    """(codes (rows, k), scales) from the emulated kernel for rows of x, or None where it refuses them."""
    o = Outputs(x.numel() // (2 * k if silu else k), k, granularity, given)
    status = lib.ops_emulate_quantize_fp8(
        DTYPE_CODE[x.dtype], int(fp8 == E5), int(granularity == "group"), int(silu), x.data_ptr(),
        x.numel() * x.element_size(), o.codes.data_ptr(), o.scales_ptr, o.rows, k, o.given_ptr, o.stride, int(pow2))
    return o.result(status, fp8)


def assert_same_bits(got, want):
    """Equal bit for bit, or both NaN."""
    g, w = got.float(), want.float()
    nan = g.isnan()
    assert torch.equal(nan, w.isnan()), f"NaN at {nan.nonzero()[:4].tolist()} vs {w.isnan().nonzero()[:4].tolist()}"
    ints = torch.int8 if got.element_size() == 1 else torch.int32
    bad = (got.view(ints) != want.view(ints)) & ~nan
    assert not bad.any(), f"{int(bad.sum())} differ, first at {bad.nonzero()[:4].tolist()}: " \
                          f"{g[bad][:4].tolist()} vs {w[bad][:4].tolist()}"


def rows_of(dtype, rows, k, seed, top=448.0):
    """Normal rows with the edges: an all-zero row, an outlier per row (FP8 subnormal codes beside it),
    a NaN, an infinity, a row of values far below 1e-12, and (float32) a row whose scale amax / top is
    just above a power of two, 2^20 (1 + 2^-21) (where float32 exp2(ceil(log2(s))) is 2^20)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g) * 3
    x[:, 0] *= 50
    if rows > 1:
        x[1] = 0
    if rows > 3:
        x[3, k // 2] = float("nan")
    if rows > 5:
        x[5, k - 1] = float("inf")
    if rows > 6:
        x[6] *= 1e-20 if dtype == torch.float32 else 1e-4
    if rows > 7 and dtype == torch.float32:
        x[7, 0] = top * 2.0**20 * (1 + 2.0**-21)
    return x.to(dtype)


KS = {torch.float16: (8, 136, 264, 1032), torch.bfloat16: (8, 136, 264, 1032), torch.float32: (4, 132, 260, 516)}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fp8", [E4, E5], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("granularity", ["row", "group"])
@pytest.mark.parametrize("pow2", [False, True], ids=["scale", "pow2"])
def test_dynamic_codes_and_scales_equal_quantize_fp8(lib, dtype, fp8, granularity, pow2):
    for i, k in enumerate(KS[dtype]):
        for rows in (1, 11):
            x = rows_of(dtype, rows, k, seed=1000 * i + rows, top=448.0 if fp8 == E4 else 57344.0)
            got = emulate(lib, x, k, granularity, fp8, pow2=pow2)
            want = ops.quantize_fp8(x, granularity, fp8, pow2_scale=pow2)
            assert_same_bits(got[0], want[0])
            assert_same_bits(got[1], want[1].reshape(-1))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("granularity", ["tensor", "row", "group"])
def test_given_scales_equal_quantize_fp8(lib, dtype, granularity):
    k, rows = KS[dtype][2], 11
    x = rows_of(dtype, rows, k, seed=7)
    shape = ops.fp8._scale_shape(x.shape, granularity)
    given = torch.rand(shape, generator=torch.Generator().manual_seed(3)) * 0.05 + 1e-3
    codes, _ = emulate(lib, x, k, granularity, E4, given=given)
    want_codes, want_scales = ops.quantize_fp8(x, granularity, E4, scale=given)
    assert_same_bits(codes, want_codes)
    assert torch.equal(want_scales, given)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("granularity", ["row", "group"])
def test_silu_and_mul_rows_equal_quantize_fp8_of_the_product(lib, dtype, granularity):
    # The unfused formula on CUDA: silu_and_mul's kernel (emulated), then quantize_fp8 (on CPU: the same bits).
    for k in KS[dtype][1:3]:
        rows = 11
        x = rows_of(dtype, rows, 2 * k, seed=k)
        product = torch.empty(rows, k, dtype=dtype)
        assert lib.ops_emulate_silu_and_mul(DTYPE_CODE[dtype], x.data_ptr(), product.data_ptr(), rows, k) == 0
        got = emulate(lib, x, k, granularity, E4, silu=True)
        want = ops.quantize_fp8(product, granularity, E4)
        assert_same_bits(got[0], want[0])
        assert_same_bits(got[1], want[1].reshape(-1))
        # the emulated kernel's product is silu_and_mul's formula (to the last bits of the host's expf)
        torch.testing.assert_close(product.float(), ops.silu_and_mul(x.float()), rtol=2e-2, atol=1e-5,
                                   equal_nan=True)


def test_rows_not_in_16_byte_packs_are_refused(lib):
    # quantize_fp8's CUDA kernel then leaves them to the formula (quantize_fp8_cuda.cpp).
    assert emulate(lib, torch.randn(3, 12, dtype=torch.bfloat16), 12, "row", E4) is None
    assert emulate(lib, torch.randn(3, 6), 6, "group", E4) is None
    assert emulate(lib, torch.randn(3, 16, dtype=torch.float64), 16, "row", E4) is None
    misaligned = torch.randn(3 * 16 + 1, dtype=torch.bfloat16)[1:]
    assert emulate(lib, misaligned, 16, "row", E4) is None


def emulate_norm(lib, x, w, granularity, fp8, residual=None, pow2=False, given=None, eps=1e-6):
    """(codes, scales) of the emulated rms_norm_fp8 (fused_add_rms_norm_fp8 with `residual`, updated in
    place), or None where the kernels refuse the rows."""
    rows, k = x.shape
    o = Outputs(rows, k, granularity, given)
    status = lib.ops_emulate_rms_norm_fp8(
        DTYPE_CODE[x.dtype], int(fp8 == E5), int(granularity == "group"), x.data_ptr(),
        None if residual is None else residual.data_ptr(), w.data_ptr(), o.codes.data_ptr(), o.scales_ptr, rows, k,
        eps, o.given_ptr, o.stride, int(pow2), 0)
    return o.result(status, fp8)


def emulated_rms_norm(lib, x, w, eps=1e-6):
    y = torch.empty_like(x)
    status = lib.ops_emulate_rms_norm(DTYPE_CODE[x.dtype], x.data_ptr(), w.data_ptr(), y.data_ptr(), *x.shape, eps, 0)
    assert status == 0
    return y


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("granularity", ["row", "group", "tensor"])
@pytest.mark.parametrize("add", [False, True], ids=["rms_norm_fp8", "fused_add_rms_norm_fp8"])
def test_norm_fp8_equals_quantize_fp8_of_the_norm_kernel(lib, dtype, granularity, add):
    # The unfused formula on CUDA: the rms_norm kernel (emulated: the same sum order), then quantize_fp8.
    # Rows reach every kernel: lane groups of 4-32 packs (one group, or two to four with 32 lanes) and a
    # block per row (ragged last group).
    pack = 4 if dtype == torch.float32 else 8
    for packs in (3, 8, 16, 17, 32, 33, 200, 640):
        k = packs * pack
        for rows in ((1, 19) if packs <= 32 else (1, 3)):
            x = rows_of(dtype, rows, k, seed=packs + rows)
            w = (torch.rand(k, generator=torch.Generator().manual_seed(k)) + 0.5).to(dtype)
            r = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)).to(dtype)
            for fp8, pow2 in ((E4, False), (E5, True)):
                given = None
                if granularity == "tensor":
                    given = torch.tensor(0.02)
                    if pow2:
                        continue
                residual = r.clone() if add else None
                got = emulate_norm(lib, x, w, granularity, fp8, residual=residual, pow2=pow2, given=given)
                source = x
                if add:
                    expected_residual = r.clone()
                    xe = x.clone()
                    assert lib.ops_emulate_fused_add_rms_norm(DTYPE_CODE[dtype], xe.data_ptr(),
                                                              expected_residual.data_ptr(), w.data_ptr(), rows, k,
                                                              1e-6, 0) == 0
                    torch.testing.assert_close(residual, expected_residual, rtol=0, atol=0, equal_nan=True)
                    source = expected_residual
                want = ops.quantize_fp8(emulated_rms_norm(lib, source, w), granularity, fp8, scale=given,
                                        pow2_scale=pow2)
                assert_same_bits(got[0], want[0])
                if given is None:
                    assert_same_bits(got[1], want[1].reshape(-1))


def test_norm_fp8_refuses_rows_the_composition_serves(lib):
    w = torch.ones(12, dtype=torch.bfloat16)
    assert emulate_norm(lib, torch.randn(2, 12, dtype=torch.bfloat16), w, "row", E4) is None  # not in packs
    w64 = torch.ones(16, dtype=torch.float64)
    assert emulate_norm(lib, torch.randn(2, 16, dtype=torch.float64), w64, "row", E4) is None
    previous = lib.ops_emulate_set_rms_norm_packs_per_thread(4)  # the register kernels sum in another order
    try:
        w = torch.ones(1024, dtype=torch.bfloat16)
        assert emulate_norm(lib, torch.randn(2, 1024, dtype=torch.bfloat16), w, "row", E4) is None
    finally:
        lib.ops_emulate_set_rms_norm_packs_per_thread(previous)
