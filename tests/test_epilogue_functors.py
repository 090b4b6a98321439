"""The activation functors of the fused linear's CUTLASS epilogue (cutlass_gemm/kernels/cutlass_common.cuh:
GeluTanh, Silu), evaluated on the host: they are CUTLASS_HOST_DEVICE, so a small host program compiled
with nvcc runs them here without a GPU. Checked against PyTorch's formulas in float64 over the whole
float range, special values included. (On the GPU the same code runs with a faster exp; tests/test_linear.py
checks that path within one output rounding.)"""

import os
import subprocess

import pytest
import torch
import torch.nn.functional as F

from conftest import REPO, cutlass_include

PROGRAM = r"""
#include <cstdio>
#include <cstdlib>
#include "cutlass_gemm/kernels/cutlass_common.cuh"
int main(int argc, char** argv) {
  ops::cutlass_gemm::GeluTanh<float> gelu_tanh;
  ops::cutlass_gemm::Silu<float> silu;
  ops::cutlass_gemm::GeluTanh<cutlass::Array<float, 4>> gelu_tanh_array;
  ops::cutlass_gemm::Silu<cutlass::Array<float, 4>> silu_array;
  for (int i = 1; i < argc; ++i) {
    const float x = std::strtof(argv[i], nullptr);
    cutlass::Array<float, 4> v;
    v.fill(x);
    std::printf("%a %a %a %a\n", gelu_tanh(x), silu(x), gelu_tanh_array(v)[3], silu_array(v)[1]);
  }
}
"""


@pytest.fixture(scope="module")
def functors(tmp_path_factory):
    """Runs the functors on a list of floats: a (len, 4) float64 tensor of gelu_tanh, silu, and the
    same two through their Array specialisations."""
    from torch.utils.cpp_extension import CUDA_HOME  # the toolkit the extension is built with

    nvcc = os.path.join(CUDA_HOME, "bin", "nvcc") if CUDA_HOME else None
    include = cutlass_include()
    if include is None or nvcc is None or not os.path.exists(nvcc):
        pytest.skip("needs nvcc and the CUTLASS headers (nvidia-cutlass)")
    folder = tmp_path_factory.mktemp("functors")
    source, binary = folder / "functors.cu", folder / "functors"
    source.write_text(PROGRAM)
    build = subprocess.run([nvcc, "-std=c++17", "--expt-relaxed-constexpr", f"-I{include}", f"-I{REPO}",
                            f"-I{REPO}/build/generated", "-include", "ops_build_config.h", str(source), "-o",
                            str(binary)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]

    def run(values):
        out = subprocess.run([str(binary)] + [repr(float(v)) for v in values], capture_output=True, text=True,
                             check=True).stdout.split("\n")
        return torch.tensor([[float.fromhex(t) for t in line.split()] for line in out if line],
                            dtype=torch.float64)

    return run


def inputs():
    """float32 values over the whole range: dense on [-100, 100] (the logistic tails, and the clamp at
    e^80), magnitudes up to 3e38 of both signs, and the special values."""
    dense = torch.linspace(-100, 100, 4001)
    wide = torch.logspace(-30, 38.5, 300)
    specials = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), -80.0, -80.01, -88.7, -88.8])
    return torch.cat([dense, wide, -wide, specials]).float()


def test_gelu_tanh_and_silu_match_pytorch_over_the_float_range(functors):
    x = inputs()
    got = functors(x.tolist())
    xd = x.double()
    # PyTorch's gelu(approximate="tanh") is 0.5 x (1 + tanh(u)); in float64 it is written here as the
    # equal x / (1 + e^(-2u)), since the tanh form cancels to 0 for x < -9 even in float64 (the exact
    # value there is ~1e-30, which the functor computes); F.gelu checks the agreement where both are exact.
    u = 0.7978845608028654 * (xd + 0.044715 * xd ** 3)
    gelu_tanh = xd / (1 + torch.exp(-2 * u))
    moderate = xd.abs() < 8
    torch.testing.assert_close(gelu_tanh[moderate], F.gelu(xd[moderate], approximate="tanh"))
    expected = {"gelu_tanh": gelu_tanh, "silu": F.silu(xd)}
    for column, name in ((0, "gelu_tanh"), (1, "silu"), (2, "gelu_tanh"), (3, "silu")):
        y, ref = got[:, column], expected[name]
        assert torch.equal(torch.isnan(y), torch.isnan(ref)), name  # NaN in, and -inf, give NaN
        finite = ~torch.isnan(ref)
        assert torch.equal(torch.isinf(y[finite]), torch.isinf(ref[finite])), name
        # Within float32 evaluation error of the float64 formula; where the exact result is below ~1e-30
        # (large negative x), a zero is within that too.
        torch.testing.assert_close(y[finite], ref[finite], rtol=1e-5, atol=1e-30, equal_nan=True, msg=name)
    # Large finite negative inputs give (signed) zeros.
    big_negative = (x < -100) & torch.isfinite(x)
    assert (got[big_negative.nonzero().squeeze(1)][:, :2] == 0).all()
