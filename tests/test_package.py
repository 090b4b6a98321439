"""The package as a user meets it: import in a clean interpreter, build facts, readable errors."""

import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest
import torch

import ops
from conftest import REPO, run_python


def test_import_in_clean_interpreter():
    # Only `import ops`: the library loads and torch.ops.ops.cutlass_gemm exists and runs.
    result = run_python(
        "import ops, torch\n"
        "A = torch.randn(3, 4); B = torch.randn(4, 5)\n"
        "assert torch.allclose(torch.ops.ops.cutlass_gemm(A, B), A @ B, atol=1e-5)\n"
        "print(ops.build_info.TORCH_VERSION)\n",
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == torch.__version__


def test_build_info():
    info = ops.build_info
    assert info.TORCH_VERSION == torch.__version__
    compiled = ops._library.compiled_build_info()
    assert compiled["torch_version"] == info.TORCH_VERSION
    assert compiled["with_cuda"] == info.WITH_CUDA
    assert compiled["candidate_kernels"] == info.CANDIDATE_KERNELS
    if info.WITH_CUDA:
        assert info.TORCH_CUDA_VERSION == torch.version.cuda
        assert compiled["cuda_version"] == torch.version.cuda
        assert compiled["cuda_arch_list"] == info.CUDA_ARCH_LIST
        assert re.fullmatch(r"\d+\.\d+\.\d+(\.\d+)?", info.CUTLASS_VERSION)
        assert info.CUDA_ARCH_LIST  # e.g. "8.0;9.0a"


def test_kernel_list():
    kernels = ops.kernels("cutlass_gemm")
    names = {k["name"] for k in kernels}
    assert len(names) == len(kernels)
    # Every dtype x math has all four operand layouts, so row/column-major inputs never need copies.
    families = {}
    for k in kernels:
        families.setdefault((k["sm"], k["dtype"], k["math"]), set()).add((k["layout_a"], k["layout_b"]))
    assert all(len(layouts) == 4 for layouts in families.values()), families
    assert (90, "bfloat16", "standard") in families and (80, "float32", "3xtf32") in families


def test_kernel_list_names_the_fp8_and_grouped_kernels():
    # As sm90_scaled_gemm.cuh, sm90_grouped_gemm.cuh and sm90_scaled_grouped_gemm.cuh instantiate them, under the
    # names plan() reports.
    everything = ops.kernels()
    kinds = ("cutlass_gemm", "scaled_gemm", "grouped_gemm", "scaled_grouped_gemm")
    assert {k["op"] for k in everything} == set(kinds)
    assert len({k["name"] for k in everything}) == len(everything)
    assert sorted(everything, key=lambda k: k["name"]) == sorted(
        [k for op in kinds for k in ops.kernels(op)], key=lambda k: k["name"])
    scaled = ops.kernels("scaled_gemm")
    # Per output dtype and activation: fast and two-level and the two blockwise kernels, each also swapped.
    assert len(scaled) == 3 * 5 * 8 and all(k["sm"] == 90 and k["candidate_only"] for k in scaled)
    for k in scaled:
        blockwise = k["recipes"][0].startswith("blockwise")
        assert ("fp8_blockwise" in k["name"]) == blockwise and ("fastaccum" in k["name"]) == (k["accumulation"] == "fast")
        assert ("128x32x128" in k["name"]) == k["swap_ab"] == ("_tnn_" in k["name"])
        short = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}[k["out_dtype"]]
        assert k["name"].endswith(f"_{short}_scaled_bias_{k['activation']}") or blockwise
    # Every op's dtypes in torch's names.
    assert {k["dtype"] for k in scaled} == {"float8_e4m3fn"}
    assert {(k["out_dtype"], k["activation"]) for k in scaled} == {
        (o, a) for o in ("bfloat16", "float16", "float32") for a in ("none", "relu", "gelu", "gelu_tanh", "silu")}
    grouped = ops.kernels("grouped_gemm")
    assert {k["dtype"] for k in grouped} == {"bfloat16", "float16"}
    assert len(grouped) == 2 * 5 and all(k["sm"] == 90 and k["candidate_only"] for k in grouped)
    assert {(k["layout_a"], k["layout_b"], k["swap_ab"]) for k in grouped if k["modes"] == ["2D x 2D"]} == {
        ("col", "row", False)}
    assert ("sm90_bf16_128x32x128_1x1x1_nnn_align8_warpspecialized_cooperative_ptr_array"
            in {k["name"] for k in grouped})  # swapped, row-major B: the kernel's A is B^T, column-major
    with pytest.raises(ValueError, match="ops.kernels: op must be None or one of cutlass_gemm, scaled_gemm, "
                                         "grouped_gemm, scaled_grouped_gemm"):
        ops.kernels("linear")


def test_kernel_list_says_which_kernels_this_build_holds():
    info = ops.build_info
    for k in ops.kernels():
        images = ops._library.built_archs()
        arch_built = ("9.0a" in images) if k["sm"] == 90 else any(
            a.startswith("8.") or (k["on_sm90"] and a.startswith("9.0")) for a in images)
        assert k["built"] == (arch_built and (info.CANDIDATE_KERNELS or not k["candidate_only"])), k["name"]
    if info.WITH_CUDA and info.CUDA_ARCH_LIST == "8.0;9.0a" and not info.CANDIDATE_KERNELS:  # the default build
        assert sum(k["built"] for k in ops.kernels()) == sum(not k["candidate_only"] for k in ops.kernels()) > 0


def test_wrong_torch_version_gives_readable_error():
    # Pretend the running torch is another release: the import must say so in words, before the
    # shared library is loaded (which would fail with `undefined symbol`).
    result = run_python("import torch\ntorch.__version__ = '2.0.0'\nimport ops\n", cwd=REPO)
    assert result.returncode != 0
    assert f"ops was built against torch {torch.__version__} but torch 2.0.0 is installed" in result.stderr
    assert "undefined symbol" not in result.stderr


def test_allow_tf32_follows_torch_settings():
    # cutlass_gemm reads torch's float32 matmul precision like torch.mm does.
    saved = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert ops._library.allow_tf32() is False
        torch.set_float32_matmul_precision("high")
        assert ops._library.allow_tf32() is True
    finally:
        torch.set_float32_matmul_precision(saved)


def test_allow_tf32_follows_the_per_backend_precision_api():
    """TF32 is read from the per-backend precision API: the legacy getter (allowTF32CuBLAS) raises "mix of
    the legacy and new APIs" once a user has set torch.backends.cuda.matmul.fp32_precision, which would
    fail every CUDA cutlass_gemm and linear call, whatever its dtype. In a fresh process: the settings are
    global."""
    result = run_python("""
import torch, ops
assert ops._library.allow_tf32() is False                  # torch's default: "ieee" for CUDA matmul
torch.backends.cuda.matmul.fp32_precision = "tf32"
assert ops._library.allow_tf32() is True
torch.backends.cuda.matmul.fp32_precision = "ieee"
assert ops._library.allow_tf32() is False
torch.backends.fp32_precision = "tf32"                      # the generic setting, inherited from "none"
torch.backends.cuda.matmul.fp32_precision = "none"
assert ops._library.allow_tf32() is True
torch.backends.fp32_precision = "ieee"
assert ops._library.allow_tf32() is False
print("ok")
""", cwd=REPO, timeout=120)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stdout + result.stderr[-3000:]


def test_includes_go_one_way():
    """cutlass_gemm/ includes csrc/ (checks, JSON, the tables), never the reverse; the torch-free headers
    the CUDA kernel TUs include (kernel_list.h and what it includes) include no torch header."""
    import pathlib
    csrc = pathlib.Path(REPO, "csrc")
    for path in sorted(csrc.rglob("*")):
        if path.suffix in (".cpp", ".h", ".cu", ".cuh"):
            assert "cutlass_gemm/" not in "".join(re.findall(r'#include\s+"([^"]+)"', path.read_text())), path
    for header in ("cutlass_gemm/kernels/kernel_list.h", "cutlass_gemm/kernels/launch_args.h", "csrc/activation.h"):
        includes = re.findall(r'#include\s+[<"]([^">]+)[">]', pathlib.Path(REPO, header).read_text())
        assert not [i for i in includes if i.split("/")[0] in ("ATen", "c10", "torch")], (header, includes)


def test_sdist_holds_every_build_input(tmp_path):
    # `python setup.py sdist` of the tree as it is: the source distribution `pip install <sdist>` builds
    # from must hold every file whose digest the library records (ops/_source_digest.py: the headers
    # too, which are no Extension sources), the package, the tests and what README's commands run;
    # nothing built (the library, its build facts).
    skip = shutil.ignore_patterns("build", "dist", ".git", "*.egg-info", ".whl", ".prebuilt", ".hypothesis",
                                  ".pytest_cache", "__pycache__", "local", "venv", ".venv")
    tree = tmp_path / "tree"
    # Links stay links: a virtual environment's may point anywhere (CI's links site-packages/nvidia).
    shutil.copytree(REPO, tree, ignore=skip, symlinks=True)
    for name in ("_C.abi3.so", "_build_info.py"):  # as after an in-place build
        (tree / "ops" / name).write_text("built\n")
    env = dict(os.environ, OPS_WITH_CUDA="0")
    result = subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path / "dist")], cwd=tree,
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    (archive,) = (tmp_path / "dist").iterdir()
    with tarfile.open(archive) as tar:
        members = {m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile()}

    def files(top):
        return {os.path.relpath(os.path.join(folder, f), tree) for folder, _, names in os.walk(tree / top)
                for f in names}

    expected = (files("csrc") | files("cutlass_gemm") | files("tests") | files("docs") | files("benchmarks")
                | {f"ops/{f}" for f in os.listdir(tree / "ops") if f.endswith(".py")}
                | {"setup.py", "pyproject.toml", "README.md", "Makefile", "pytest.ini", "requirements.txt",
                   "requirements-nodeps.txt", "MANIFEST.in"})
    expected -= {"ops/_build_info.py"}
    missing = expected - members
    assert not missing, f"the sdist lacks {sorted(missing)[:10]}"
    assert not {"ops/_C.abi3.so", "ops/_build_info.py"} & members


def _run_setup(tmp_path, args, env=None, prelude=""):
    """setup.py `args` in a folder holding a copy of setup.py and what it reads before building."""
    (tmp_path / "ops").mkdir(exist_ok=True)
    for name in ("setup.py", "README.md", "ops/_source_digest.py"):
        shutil.copy(os.path.join(REPO, name), tmp_path / name)
    code = (f"{prelude}\nimport runpy, sys; sys.argv = ['setup.py', *{args!r}]; "
            "runpy.run_path('setup.py', run_name='__main__')")
    env = {**os.environ, "OPS_WITH_CUDA": "0", **(env or {})}
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)


def test_setup_stops_with_a_reason_where_it_cannot_build_right(tmp_path):
    # An isolated build environment (pip install . without --no-build-isolation) has no torch.
    result = _run_setup(tmp_path, ["--name"], prelude="import sys; sys.modules['torch'] = None")
    assert result.returncode != 0 and "pip install --no-build-isolation ." in result.stderr, result.stderr[-2000:]
    # setuptools < 70.1 without the wheel package cannot write a wheel (a fresh Python 3.11 venv's 65.5).
    result = _run_setup(tmp_path, ["dist_info"], prelude="import setuptools, sys; setuptools.__version__ = '65.5.0'; "
                                                           "sys.modules['wheel'] = None")
    assert result.returncode != 0 and "pip install 'setuptools>=70.1'" in result.stderr, result.stderr[-2000:]
    for knob in ("OPS_WITH_CUDA", "OPS_CANDIDATE_KERNELS", "OPS_DEBUG_INFO"):
        result = _run_setup(tmp_path, ["--name"], env={knob: "sometimes"})
        assert result.returncode != 0 and f"setup.py: {knob}='sometimes'; expected one of 1, 0" in result.stderr


def test_the_distribution_requires_the_torch_it_was_built_against(tmp_path):
    result = _run_setup(tmp_path, ["-q", "egg_info", "--egg-base", str(tmp_path)])
    assert result.returncode == 0, result.stderr[-2000:]
    requires = (tmp_path / "torch_cutlass_ops.egg-info" / "requires.txt").read_text().split()
    assert requires == [f"torch=={torch.__version__.split('+')[0]}"]


def test_import_warns_when_the_checkout_changed_since_the_build(tmp_path):
    # Built in place (or installed editable): a source edited since the build runs only after a rebuild.
    shutil.copytree(os.path.join(REPO, "ops"), tmp_path / "ops", ignore=shutil.ignore_patterns("__pycache__", "_C*.so"))
    os.symlink(ops._library.library_path(), tmp_path / "ops" / os.path.basename(ops._library.library_path()))
    for name in ("csrc", "cutlass_gemm"):
        shutil.copytree(os.path.join(REPO, name), tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(REPO, "setup.py"), tmp_path)
    from ops import _source_digest

    digest = _source_digest.source_digest(str(tmp_path))
    (tmp_path / "ops" / "_build_info.py").write_text(
        open(os.path.join(REPO, "ops", "_build_info.py")).read().replace(ops.build_info.SOURCE_SHA256, digest))
    code = "import warnings; warnings.simplefilter('error'); import ops"
    result = run_python(code, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    with open(tmp_path / "csrc" / "checks.cpp", "a") as f:
        f.write("// edited\n")
    result = run_python(code, cwd=tmp_path)
    assert result.returncode != 0 and "was built from other sources than those in" in result.stderr
