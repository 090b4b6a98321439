"""The SIMT GEMV kernel (cutlass_gemm/kernels/simt_gemv.cuh), a GPU-only kernel, checked on the host: compiled
with the host C++ compiler against emulated lock-step warps (tests/cpp/warp_emulation.h) and run through
its real entry point by tests/cpp/simt_gemv_emulation.cpp, which checks every output element exactly,
every load's bounds and alignment, and that no lane diverges before a shuffle. A wrong reduction index,
a missed K chunk or a read past an operand fails here, in CI, before any GPU time is spent."""

import os
import shutil
import subprocess

import pytest

import ops
from conftest import REPO, cutlass_include


def test_simt_gemv_on_emulated_warps(tmp_path):
    cuda_home = getattr(ops.build_info, "CUDA_HOME", None)  # the toolkit the extension was built with
    include = cutlass_include()
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if include is None or not cuda_home or compiler is None:
        pytest.skip("needs a C++ compiler, the CUDA headers and the CUTLASS headers (nvidia-cutlass)")
    cuda_include = os.path.join(cuda_home, "include")
    binary = tmp_path / "simt_gemv_emulation"
    # -fpermissive: CUTLASS's headers name device intrinsics (__dp4a, __hfma2, ...) in templates that a
    # host compiler would otherwise reject at definition; none of them is instantiated here.
    build = subprocess.run(
        [compiler, "-std=c++20", "-O2", "-pthread", "-fpermissive", "-w", f"-I{REPO}", f"-I{include}",
         f"-I{cuda_include}", f"-I{os.path.join(cuda_include, 'cccl')}",
         os.path.join(REPO, "tests", "cpp", "simt_gemv_emulation.cpp"), "-o", str(binary)],
        capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    cases, failures = (int(w) for w in run.stdout.split()[-4::2])
    assert failures == 0 and cases >= 400, run.stdout[-3000:]
