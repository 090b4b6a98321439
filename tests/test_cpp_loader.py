"""TorchScript from C++: the scripted model of every registered op is saved in Python, then loaded and
run by a C++ program linked against libtorch (tests/cpp/, no Python), with the op library dlopen'ed;
its output must equal Python's. Without the op library the program fails with a clear message."""

import glob
import os
import shutil
import subprocess
import warnings

import pytest
import torch
from filelock import FileLock  # a dependency of torch

import ops
from conftest import REPO
from op_registry import OP_IDS, OPS

pytestmark = pytest.mark.slow

TS_SCRIPT_DEPRECATION = r"`torch\.jit\.script` is deprecated"


def _cmake_args():
    args = [f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}", "-DCMAKE_BUILD_TYPE=Release"]
    if torch.version.cuda:
        # libtorch's CMake config looks for a CUDA toolkit; point it at ours, and at the nvrtc that
        # torch's nvidia wheels ship (these toolkits lack it).
        cuda_home = getattr(ops.build_info, "CUDA_HOME", None)  # the toolkit setup.py found
        if not cuda_home:
            pytest.skip("a CUDA build of torch needs a CUDA toolkit for its CMake config; none was found")
        args.append(f"-DCUDA_TOOLKIT_ROOT_DIR={cuda_home}")
        site = os.path.dirname(os.path.dirname(torch.__file__))
        nvrtc = sorted(glob.glob(os.path.join(site, "nvidia", "cu*", "lib", "libnvrtc.so*")))
        if nvrtc:
            args.append(f"-DCUDA_nvrtc_LIBRARY={nvrtc[0]}")
    return args


@pytest.fixture(scope="module")
def loader():
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed")
    build = os.path.join(REPO, "build", "cpp_loader")
    os.makedirs(build, exist_ok=True)
    # One configure and build at a time: pytest-xdist workers each run this fixture, and two cmake runs
    # in one build folder read each other's half-written cache.
    with FileLock(build + ".lock"):
        for cmd in (["cmake", "-S", os.path.join(REPO, "tests", "cpp"), "-B", build] + _cmake_args(),
                    ["cmake", "--build", build, "-j", str(os.cpu_count() or 1)]):
            # An explicit arch list keeps libtorch's CMake from probing for a GPU (a try_run that fails on
            # machines without one); the loader compiles no CUDA code, so any valid arch will do.
            env = dict(os.environ, TORCH_CUDA_ARCH_LIST="8.0")
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
            assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return os.path.join(build, "load_and_run")


def _run(loader, model_path, x, tmp_path, library=None, grad=False):
    x = x.float().contiguous()
    x.numpy().tofile(tmp_path / "x.bin")
    cmd = [loader, str(model_path), str(tmp_path / "x.bin"), str(x.shape[0]), str(x.shape[1]),
           str(tmp_path / "y.bin")] + ([library] if library else [])
    env = dict(os.environ, LOAD_AND_RUN_GRAD="1" if grad else "0")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


def _output(result, tmp_path):
    rows, cols = map(int, result.stdout.split())
    return torch.from_numpy(__import__("numpy").fromfile(tmp_path / "y.bin", dtype="float32")).view(rows, cols)


@pytest.mark.parametrize("spec", OPS, ids=OP_IDS)
def test_cpp_program_runs_scripted_model(spec, loader, tmp_path):
    model = spec.module().eval()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=TS_SCRIPT_DEPRECATION, category=FutureWarning)
        scripted = torch.jit.script(model)
    scripted.save(str(tmp_path / "model.pt"))
    x = spec.module_input(7)
    with torch.no_grad():
        expected = scripted(x)

    result = _run(loader, tmp_path / "model.pt", x, tmp_path, ops.library_path())
    assert result.returncode == 0, result.stderr
    torch.testing.assert_close(_output(result, tmp_path), expected)


def test_cpp_program_differentiates_cutlass_gemm(loader, tmp_path):
    # cutlass_gemm's autograd formula is registered in C++ (csrc/autograd.cpp): a C++ program without
    # Python gets the same input gradient as Python autograd.
    spec = next(s for s in OPS if s.name == "cutlass_gemm")
    model = spec.module().float()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=TS_SCRIPT_DEPRECATION, category=FutureWarning)
        torch.jit.script(model).save(str(tmp_path / "model.pt"))
    x = spec.module_input(5).float().requires_grad_(True)
    model(x).sum().backward()
    result = _run(loader, tmp_path / "model.pt", x.detach(), tmp_path, ops.library_path(), grad=True)
    assert result.returncode == 0, result.stderr
    torch.testing.assert_close(_output(result, tmp_path), x.grad)


def test_cpp_program_without_op_library_fails_clearly(loader, tmp_path):
    spec = OPS[0]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=TS_SCRIPT_DEPRECATION, category=FutureWarning)
        torch.jit.script(spec.module()).save(str(tmp_path / "model.pt"))
    result = _run(loader, tmp_path / "model.pt", spec.module_input(2), tmp_path)
    assert result.returncode == 2
    assert f"Unknown builtin op: ops::{spec.name}" in result.stderr
