"""The fused CUDA kernels on emulated blocks (tests/cpp/fused_emulation.cpp, tests/cpp/warp_emulation.h),
built once per pytest run with the host C++ compiler and loaded with ctypes."""

import ctypes
import os
import shutil
import subprocess

import pytest
import torch

import ops
from conftest import REPO

# fused_kernels.h's DTypeCode.
DTYPE_CODE = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2, torch.float64: 3}
NOT_SUPPORTED = 801  # cudaErrorNotSupported


def build(directory):
    """The library, built in `directory`; skips the test without a C++ compiler or the CUDA headers."""
    cuda_home = getattr(ops.build_info, "CUDA_HOME", None)  # the toolkit the extension was built with
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if not cuda_home or compiler is None:
        pytest.skip("needs a C++ compiler and the CUDA headers")
    cuda_include = os.path.join(cuda_home, "include")
    path = os.path.join(directory, "libfused_emulation.so")
    result = subprocess.run(
        [compiler, "-std=c++20", "-O2", "-pthread", "-fPIC", "-shared", "-Wall", "-Wno-unknown-pragmas",
         "-Wno-maybe-uninitialized", "-Werror", f"-I{REPO}", f"-I{cuda_include}",
         f"-I{os.path.join(cuda_include, 'cccl')}", os.path.join(REPO, "tests", "cpp", "fused_emulation.cpp"),
         "-o", path],
        capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    lib = ctypes.CDLL(path)
    i64, ptr, i32, f64 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_double
    lib.ops_emulate_quantize_fp8.argtypes = [i32, i32, i32, i32, ptr, i64, ptr, ptr, i64, i64, ptr, i64, i32]
    lib.ops_emulate_rms_norm.argtypes = [i32, ptr, ptr, ptr, i64, i64, f64, i32]  # ..., eps, round_x_hat
    lib.ops_emulate_fused_add_rms_norm.argtypes = [i32, ptr, ptr, ptr, i64, i64, f64, i32]
    lib.ops_emulate_silu_and_mul.argtypes = [i32, ptr, ptr, i64, i64]
    lib.ops_emulate_set_rms_norm_packs_per_thread.argtypes = [i32]
    lib.ops_emulate_set_silu_max_blocks.argtypes = [i64]
    lib.ops_emulate_set_silu_max_blocks.restype = i64
    lib.ops_emulate_rms_norm_fp8.argtypes = [i32, i32, i32, ptr, ptr, ptr, ptr, ptr, i64, i64, f64, ptr, i64, i32,
                                             i32]
    return lib
