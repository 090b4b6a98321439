"""Build the `ops` package: `ops._C`, the C++/CUDA operator library.

This file is the one place that decides what gets built:

* With nvcc and a CUDA build of torch: a CUDAExtension with the CUTLASS GEMM kernels the dispatcher
  can choose (cutlass_gemm/kernels/*.cu: one translation unit per arch and dtype family, so that the
  CUTLASS templates their kernels share are instantiated once), built for TORCH_CUDA_ARCH_LIST,
  default "8.0;9.0a". With OPS_CANDIDATE_KERNELS=1 also the candidate-only kernels the heuristic never
  picks (cutlass_gemm/kernels/candidates/*.cu: swap-AB, SIMT GEMV), for benchmarks.gemm --candidates
  and autotuning. Building needs no GPU.
* Otherwise (or with OPS_WITH_CUDA=0): a CppExtension with the CPU kernels only.

Either way `ops._C` is a plain shared library of ops (TORCH_LIBRARY registrations, no Python symbols:
py_limited_api=True keeps libtorch_python out), loaded by `torch.ops.load_library` in Python and by
dlopen in C++ programs.

Environment knobs: OPS_WITH_CUDA=0|1 (default: auto), OPS_CANDIDATE_KERNELS=0|1 (default 0),
TORCH_CUDA_ARCH_LIST, MAX_JOBS (default: cores, capped at one compile job per 7 GB of memory: an SM90
kernel TU peaks near 6.5 GB), OPS_DEBUG_INFO=1 (full debug info, -g, in the C++ objects; by default
they carry line tables only, -g1: file:line in native backtraces, which the GPU check's crash
diagnostics print, for 20-30% less compile time than -g), CUDA_HOME (default: the folder holding the
nvcc on PATH, else /usr/local/cuda).

Build facts (torch, CUDA, arch list, CUTLASS version, the SHA-256 of the sources) are written to
ops/_build_info.py beside the compiled library, so `import ops` can refuse a torch it was not built
against with a readable error.
"""

import glob
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys

import setuptools
from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))

# A wheel (pip install, pip wheel, an editable install) needs setuptools >= 70.1 or the `wheel` package; the
# setuptools 65 of a fresh Python 3.11 venv fails with "invalid command 'bdist_wheel'".
if ({"bdist_wheel", "editable_wheel", "dist_info"} & set(sys.argv[1:])
        and tuple(int(p) for p in re.findall(r"\d+", setuptools.__version__)[:2]) < (70, 1)
        and importlib.util.find_spec("wheel") is None):
    sys.exit(f"setup.py: setuptools {setuptools.__version__} builds wheels only with the `wheel` package, which "
             "is not installed: pip install 'setuptools>=70.1' (requirements.txt), then build again.")
DEFAULT_ARCH_LIST = "8.0;9.0a"
GB = 1024**3


def _find_cuda_home():
    """The CUDA toolkit root: $CUDA_HOME, else the folder holding the nvcc on PATH (following links),
    else /usr/local/cuda. A candidate must hold bin/nvcc and include/cuda_runtime_api.h (on some machines
    the nvcc on PATH is a wrapper script in /usr/local/bin)."""
    if os.environ.get("CUDA_HOME"):
        return os.environ["CUDA_HOME"]
    candidates = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    candidates += ["/usr/local/cuda"] + sorted(glob.glob("/usr/local/cuda-*"), reverse=True)
    for root in candidates:
        if os.path.exists(os.path.join(root, "bin", "nvcc")) and os.path.exists(
                os.path.join(root, "include", "cuda_runtime_api.h")):
            return root
    return None


# torch.utils.cpp_extension reads CUDA_HOME when it is imported.
_cuda_home = _find_cuda_home()
if _cuda_home:
    os.environ.setdefault("CUDA_HOME", _cuda_home)

try:
    import torch  # noqa: E402
except ImportError:
    sys.exit(f"setup.py: torch cannot be imported by the Python running this build ({sys.executable}). ops is "
             "built against the torch it will run with: install torch, then `pip install --no-build-isolation .` "
             "(pip's default isolated build environment has no torch).")
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension  # noqa: E402


def _nvcc_version(cuda_home):
    out = subprocess.run([os.path.join(cuda_home, "bin", "nvcc"), "--version"], capture_output=True,
                         text=True, check=True).stdout
    match = re.search(r"release (\d+)\.(\d+)", out)
    return f"{match.group(1)}.{match.group(2)}" if match else "unknown"


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def _flag(name, allowed=()):
    """An on/off environment knob (unset: off); any other value than those and `allowed` stops the build."""
    value = os.environ.get(name, "0").strip().lower()
    if value not in _TRUE + _FALSE + allowed:
        expected = ", ".join(_TRUE[:1] + _FALSE[:1] + allowed)
        sys.exit(f"setup.py: {name}={os.environ[name]!r}; expected one of {expected} (or true/false, yes/no, on/off)")
    return value if value in allowed else value in _TRUE


def _with_cuda():
    flag = _flag("OPS_WITH_CUDA", allowed=("auto",)) if os.environ.get("OPS_WITH_CUDA", "").strip() else "auto"
    if flag is False:
        return False
    available = torch.version.cuda is not None and _cuda_home is not None and os.path.exists(
        os.path.join(_cuda_home, "bin", "nvcc"))
    if flag is True and not available:
        sys.exit("setup.py: OPS_WITH_CUDA=1 but no CUDA build of torch or no nvcc was found "
                 f"(torch {torch.__version__}, CUDA_HOME={_cuda_home}).")
    if available:
        nvcc = _nvcc_version(_cuda_home)
        if nvcc.split(".")[0] != torch.version.cuda.split(".")[0]:
            sys.exit(f"setup.py: nvcc {nvcc} (in {_cuda_home}) does not match the CUDA {torch.version.cuda} "
                     "torch was built with; their major versions must agree. Point CUDA_HOME at a "
                     "matching toolkit, or build the CPU-only library with OPS_WITH_CUDA=0.")
    return available


def _cutlass_include_dirs():
    spec = importlib.util.find_spec("cutlass_library")  # locate without importing its dependencies
    if spec is None or not spec.submodule_search_locations:
        sys.exit("setup.py: CUTLASS headers not found. Install them with "
                 "`pip install --no-deps nvidia-cutlass==4.2.0.0` (see requirements-nodeps.txt), or build the "
                 "CPU-only library with OPS_WITH_CUDA=0.")
    source = os.path.join(list(spec.submodule_search_locations)[0], "source")
    dirs = [os.path.join(source, "include"), os.path.join(source, "tools", "util", "include")]
    for d in dirs:
        if not os.path.isdir(d):
            sys.exit(f"setup.py: expected CUTLASS headers in {d}; reinstall nvidia-cutlass.")
    return dirs


def _cutlass_version():
    try:
        return importlib.metadata.version("nvidia-cutlass")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _nvidia_wheel_include_dirs():
    """CUDA library headers (cublas_v2.h, cusparse.h, ...) from torch's nvidia-* wheels, for toolkits
    that lack them. Added with -idirafter, so a full toolkit's own headers win."""
    dirs = []
    for site in sys.path:
        dirs += glob.glob(os.path.join(site, "nvidia", "cu*", "include"))
        dirs += glob.glob(os.path.join(site, "nvidia", "*", "include"))
    seen, out = set(), []
    for d in dirs:
        if os.path.isdir(d) and d not in seen:
            seen.add(d)
            out.append(d)
    return out


def _default_max_jobs():
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        mem = 8 * GB
    return max(1, min(os.cpu_count() or 1, int(mem // (7 * GB))))


def _write_if_changed(path, text):
    if os.path.exists(path) and open(path).read() == text:
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


WITH_CUDA = _with_cuda()
CANDIDATE_KERNELS = _flag("OPS_CANDIDATE_KERNELS") and WITH_CUDA
ARCH_LIST = os.environ.get("TORCH_CUDA_ARCH_LIST") or DEFAULT_ARCH_LIST if WITH_CUDA else ""
if WITH_CUDA:
    os.environ["TORCH_CUDA_ARCH_LIST"] = ARCH_LIST
os.environ.setdefault("MAX_JOBS", str(_default_max_jobs()))

BUILD_INFO = {
    "torch_version": torch.__version__,
    "torch_cuda_version": torch.version.cuda if WITH_CUDA else None,
    "nvcc_version": _nvcc_version(_cuda_home) if WITH_CUDA else None,
    "with_cuda": WITH_CUDA,
    "cuda_home": _cuda_home,  # also for CPU-only builds: C++ programs against a CUDA torch need it
    "cuda_arch_list": ARCH_LIST,
    "candidate_kernels": CANDIDATE_KERNELS,
    "cutlass_version": _cutlass_version() if WITH_CUDA else None,
    "python_version": ".".join(map(str, sys.version_info[:3])),
}

# A generated header with the build facts, force-included into every TU (-include) and rewritten only
# when a fact changes, so an unchanged configuration recompiles nothing.
GENERATED = os.path.join(ROOT, "build", "generated")
_write_if_changed(
    os.path.join(GENERATED, "ops_build_config.h"),
    "// Generated by setup.py; do not edit.\n#pragma once\n"
    f"#define OPS_WITH_CUDA {int(WITH_CUDA)}\n"
    f'#define OPS_CUDA_ARCH_LIST "{ARCH_LIST}"\n'
    f'#define OPS_CUTLASS_VERSION "{BUILD_INFO["cutlass_version"] or ""}"\n'
    f'#define OPS_TORCH_VERSION "{torch.__version__}"\n'
    f'#define OPS_CUDA_VERSION "{BUILD_INFO["torch_cuda_version"] or ""}"\n',
)
# OPS_CANDIDATE_KERNELS in a header of its own, included by the files that read it, so that switching
# it rebuilds those and the candidate TUs only.
_write_if_changed(
    os.path.join(GENERATED, "ops_candidate_kernels.h"),
    "// Generated by setup.py; do not edit.\n#pragma once\n"
    f"#define OPS_WITH_CANDIDATE_KERNELS {int(CANDIDATE_KERNELS)}\n",
)


def _sources():
    """Every C++/CUDA file, by a naming rule a new op follows: `*_cuda.cpp` (torch-side CUDA wrappers)
    and `*.cu` (kernels) are built only with CUDA; every other `.cpp` always. The candidate-only CUTLASS
    kernels (cutlass_gemm/kernels/candidates/) only with OPS_CANDIDATE_KERNELS=1."""
    def cpp(folder, recursive=False):
        return sorted(glob.glob(f"{folder}/**/*.cpp" if recursive else f"{folder}/*.cpp", recursive=recursive))

    host = cpp("csrc") + cpp("cutlass_gemm", recursive=True)
    files = [f for f in host if not f.endswith("_cuda.cpp")]
    if WITH_CUDA:
        files += [f for f in host if f.endswith("_cuda.cpp")]
        files += cpp("csrc/allocator") + sorted(glob.glob("csrc/*.cu"))
        files += sorted(glob.glob("cutlass_gemm/kernels/*.cu"))
        if CANDIDATE_KERNELS:
            files += sorted(glob.glob("cutlass_gemm/kernels/candidates/*.cu"))
    return files


def _system_includes(dirs):
    """-isystem flags (C++ only): torch's headers as system headers, so that their warnings (its vec
    headers: -Wunknown-pragmas, -Wpsabi) do not bury ours. A directory given with both -I (torch's
    extension builder adds its own) and -isystem is searched as a system directory. Not for nvcc: torch
    drops its arch flags when any nvcc flag contains "arch", which a path may."""
    return [flag for d in dirs for flag in ("-isystem", d)]


def _openmp_flags():
    """["-fopenmp"] where torch's CPU parallel backend is OpenMP (its Linux wheels), else []. ATen's
    at::parallel_for is a header template whose parallel region is a `#pragma omp parallel`: a file
    compiled without -fopenmp runs every parallel_for on one thread. Linked with it too, the library needs libgomp.so.1, which is the one torch has loaded."""
    info = torch.__config__.parallel_info()
    if sys.platform == "darwin" or "ATen parallel backend: OpenMP" not in info or "OpenMP not found" in info:
        return []
    # A compiler that cannot build and link OpenMP code (no libgomp beside it) still builds the library,
    # with single-threaded CPU kernels, and says so.
    probe = "#include <omp.h>\nint main() { int n = 0;\n#pragma omp parallel\n n = omp_get_num_threads(); return n < 0; }\n"
    try:
        result = subprocess.run([os.environ.get("CXX", "c++"), "-fopenmp", "-x", "c++", "-", "-o", os.devnull],
                                input=probe, capture_output=True, text=True, timeout=120)
        ok = result.returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    if not ok:
        print("setup.py: the C++ compiler cannot build OpenMP code; the CPU kernels will run on one thread")
        return []
    return ["-fopenmp"]


def _extension():
    torch_include = os.path.join(os.path.dirname(torch.__file__), "include")
    torch_includes = [torch_include, os.path.join(torch_include, "torch", "csrc", "api", "include")]
    openmp = _openmp_flags()
    # -Wno-psabi: GCC notes that 512-bit vectors passed by value changed ABI in GCC 4.6; in
    # fused_cpu_avx512.cpp they pass only between ATen's inline helpers (its entry points take tensors).
    cxx = ["-O3", "-Wno-psabi", "-include", "ops_build_config.h"] + openmp + _system_includes(torch_includes)
    if not _flag("OPS_DEBUG_INFO"):
        cxx.append("-g1")  # overrides the -g of Python's CFLAGS: line tables only
    include_dirs = [GENERATED, ROOT]
    if not WITH_CUDA:
        return CppExtension("ops._C", _sources(), include_dirs=include_dirs,
                            extra_compile_args={"cxx": cxx}, extra_link_args=openmp, py_limited_api=True)
    include_dirs += _cutlass_include_dirs()
    for d in _nvidia_wheel_include_dirs():
        cxx += ["-idirafter", d]
    # torch's extension builder picks the C++ standard: -std=c++17 under torch 2.11 (the GPU machine's), c++20
    # under 2.14. Kernel code stays C++17.
    nvcc = [
        "-O3",
        "-DNDEBUG",  # without it nvcc serialises wgmma (warning C7510)
        "--expt-relaxed-constexpr",
        "--expt-extended-lambda",
        # CUTLASS 4.2's sm100 collective headers (included by the sm90 builders) warn "implicit by-copy
        # capture of this is deprecated" (C++20) 84 times per build; none of our code captures that way.
        "--diag-suppress=2908",
        "-include", "ops_build_config.h",
    ]
    return CUDAExtension("ops._C", _sources(), include_dirs=include_dirs,
                         extra_compile_args={"cxx": cxx, "nvcc": nvcc}, extra_link_args=openmp,
                         py_limited_api=True)


def _source_digest():
    """ops/_source_digest.py's SHA-256 of the build inputs, loaded by path (importing ops needs the
    library this builds)."""
    spec = importlib.util.spec_from_file_location("_ops_source_digest", os.path.join(ROOT, "ops", "_source_digest.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.source_digest(ROOT)


def _compile_order(source):
    """The SM90 kernel TUs first (each takes minutes), then the other kernel TUs, then the rest: ninja
    starts a fresh build's jobs in this order, and a long TU started last would leave the other cores idle
    while it finishes."""
    return (0 if "/kernels/sm90_" in source else 1 if "/kernels/" in source else 2, source)


class BuildExt(BuildExtension):
    """Records the build facts beside the compiled library (ops/_build_info.py), with the digest of the
    sources as the build started (SOURCE_SHA256: which sources a library was built from), and hands the
    sources to the compiler longest first (setuptools sorts them by name)."""

    def build_extension(self, ext):
        compile_by_name = self.compiler.compile

        def compile_longest_first(sources, *args, **kwargs):
            return compile_by_name(sorted(sources, key=_compile_order), *args, **kwargs)

        self.compiler.compile = compile_longest_first
        try:
            super().build_extension(ext)
        finally:
            self.compiler.compile = compile_by_name

    def run(self):
        facts = dict(BUILD_INFO, source_sha256=_source_digest())
        super().run()
        target = os.path.join(os.path.dirname(self.get_ext_fullpath("ops._C")), "_build_info.py")
        lines = ['"""Facts recorded by setup.py when ops._C was built. Generated; do not edit."""', ""]
        lines += [f"{k.upper()} = {v!r}" for k, v in facts.items()]
        _write_if_changed(target, "\n".join(lines) + "\n")


setup(
    # The distribution's name; the import name is `ops`. PyPI's unrelated `ops` (Canonical's) installs a
    # top-level `ops` package too: one environment cannot hold both.
    name="torch-cutlass-ops",
    version="0.1.0",
    description="C++/CUDA custom operators for PyTorch: a CUTLASS GEMM and friends, registered "
                "with torch.library.",
    long_description=open(os.path.join(ROOT, "README.md"), encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=["ops"],
    # The library loads only into the torch it was built against (its public version; a local label such
    # as +cu130 is not compared), as torchvision's wheels pin theirs.
    install_requires=[f"torch=={torch.__version__.split('+')[0]}"],
    # ops._C uses no Python API (py_limited_api): one wheel serves CPython 3.10 and later.
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
    ext_modules=[_extension()],
    cmdclass={"build_ext": BuildExt.with_options(use_ninja=True)},
    python_requires=">=3.10",
    zip_safe=False,
)
