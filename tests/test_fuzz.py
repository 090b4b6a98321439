"""Property-based tests of the real ops (hypothesis): over shapes (0 and 1 included), dtypes (invalid
ones included), strides, storage offsets and out variants, every call either matches the float64
reference or raises a RuntimeError that names the op; none crashes."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ops
from conftest import DEVICES

VALID = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INVALID = [torch.int32, torch.int64, torch.bool, torch.complex64, torch.uint8]
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5, torch.float64: 1e-12}


@st.composite
def matrices(draw, rows, cols, dtype, device):
    """A (rows x cols) view into a larger buffer: any of row-major, column-major, strided with gaps,
    transposed-with-gaps, with a storage offset."""
    kind = draw(st.sampled_from(["row", "col", "gaps", "gaps_t"]))
    step = draw(st.integers(1, 3))
    pad = draw(st.integers(0, 3))
    offset = draw(st.integers(0, 7))
    if kind == "row":
        strides = (cols * step + pad, step)
    elif kind == "col":
        strides = (step, rows * step + pad)
    elif kind == "gaps":
        strides = (cols * step + pad + 1, step)
    else:
        strides = (step, rows * step + pad + 1)
    size = offset + 1 + sum((n - 1) * s for n, s in zip((rows, cols), strides)) if rows and cols else offset
    base = torch.randn(max(size, 1), dtype=torch.float64)
    base = base.to(dtype) if dtype.is_floating_point or dtype.is_complex else (base * 4).to(dtype)
    return base.to(device).as_strided((rows, cols), strides, offset)


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(data=st.data(), m=st.integers(0, 24), n=st.integers(0, 24), k=st.integers(0, 24),
       dtype=st.sampled_from(VALID + INVALID), use_out=st.booleans())
def test_cutlass_gemm_matches_or_raises_clearly(device, data, m, n, k, dtype, use_out):
    A = data.draw(matrices(m, k, dtype, device))
    B = data.draw(matrices(k, n, dtype, device))
    out = data.draw(matrices(m, n, dtype, device)) if use_out else None
    if out is not None and dtype.is_floating_point:
        out.fill_(float("nan"))
    try:
        C = ops.cutlass_gemm(A, B, out=out)
    except RuntimeError as e:
        assert dtype not in VALID, f"valid call raised: {e}"
        assert str(e).startswith("cutlass_gemm: expected A's dtype"), str(e)
        return
    assert dtype in VALID, "an invalid dtype was accepted"
    assert C.shape == (m, n) and C.dtype == dtype
    if out is not None:
        assert C is out
    expected = A.double().cpu() @ B.double().cpu()
    scale = max(1.0, k ** 0.5)
    torch.testing.assert_close(C.double().cpu() / scale, expected / scale, atol=TOL[dtype], rtol=TOL[dtype])
