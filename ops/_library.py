"""Loading the compiled op library `ops/_C*.so`, with readable errors instead of `undefined symbol`.

The library is a plain shared object with no Python dependency (it registers the ops with
TORCH_LIBRARY when loaded), so the same file serves Python (`torch.ops.load_library`) and C++
programs (dlopen or linking; see tests/cpp/). Its introspection ops return JSON, decoded here.
"""

import ctypes
import glob
import importlib
import json
import os

import torch

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _build_info():
    try:
        return importlib.import_module("ops._build_info")
    except ImportError as exc:
        raise ImportError(
            "ops: the compiled library is not built (ops/_build_info.py is missing). From the repository "
            "root run `make test` (builds in place), or install with `pip install --no-build-isolation .` "
            "and import ops from outside the source folder."
        ) from exc


def library_path():
    """Path of the compiled op library (for C++ programs that dlopen or link it)."""
    candidates = sorted(glob.glob(os.path.join(_PACKAGE_DIR, "_C*.so")))
    if not candidates:
        raise ImportError(f"ops: no compiled library (_C*.so) in {_PACKAGE_DIR}; build the package first "
                          "(`make test`, or `pip install --no-build-isolation .`).")
    return candidates[0]


def load():
    """Check the build against the running torch, then load the op library (registering the ops).

    Raises:
        ImportError: the library is not built, or was built against another torch version (the C++ ABI
            of torch changes between releases, so loading it would fail with `undefined symbol`).
    """
    info = _build_info()
    if info.TORCH_VERSION != torch.__version__:
        raise ImportError(
            f"ops was built against torch {info.TORCH_VERSION} but torch {torch.__version__} is installed. "
            "A C++ extension only loads into the torch it was compiled with: rebuild ops "
            "(`make test`, or `pip install --no-build-isolation --no-deps --force-reinstall .`) or install torch "
            f"{info.TORCH_VERSION}."
        )
    path = library_path()
    try:
        torch.ops.load_library(path)
    except OSError as exc:
        try:  # torch's message hides the loader's reason (e.g. an undefined symbol); ask the loader
            ctypes.CDLL(path)
        except OSError as detail:
            exc = detail
        raise ImportError(
            f"ops: loading the compiled library {path} failed ({exc}). It was built with torch "
            f"{info.TORCH_VERSION} (CUDA {info.TORCH_CUDA_VERSION}); rebuild it in this environment."
        ) from exc
    _warn_if_stale(info, path)
    return info


def _warn_if_stale(info, path):
    """In a source checkout (built in place, or an editable install), warns when the C++/CUDA sources
    changed since the library was built: what runs is not what the files say."""
    root = os.path.dirname(_PACKAGE_DIR)
    if not all(os.path.exists(os.path.join(root, f)) for f in ("setup.py", "csrc", "cutlass_gemm")):
        return
    from . import _source_digest

    built = getattr(info, "SOURCE_SHA256", None)
    if built is not None and built != _source_digest.source_digest(root):
        import warnings

        warnings.warn(f"ops: {path} was built from other sources than those in {root} now (a build input "
                      "under csrc/ or cutlass_gemm/, or setup.py, changed since): the ops run the old code until "
                      "it is rebuilt (`make build`, or `python setup.py build_ext --inplace`)", stacklevel=3)


build_info = load()

# The tables every op reads, from the library (csrc/activation.h, csrc/checks.h kGemmDtypes).
_TABLES = json.loads(torch.ops.ops._tables())
# ops.linear's activation names, in the table's order ("none" first).
ACTIVATIONS = tuple(_TABLES["activations"])
# The dtypes cutlass_gemm, linear and the fused ops take, and their names as the C++ messages list them.
GEMM_DTYPES = tuple(getattr(torch, name) for name in _TABLES["gemm_dtypes"])
GEMM_DTYPES_TEXT = ", ".join(_TABLES["gemm_dtypes"][:-1]) + " or " + _TABLES["gemm_dtypes"][-1]


def compiled_build_info():
    """Build facts compiled into the library itself (dict): with_cuda, cuda_arch_list, candidate_kernels,
    cutlass_version, torch_version, cuda_version."""
    return json.loads(torch.ops.ops._build_info())


_KERNEL_OPS = ("cutlass_gemm", "scaled_gemm", "grouped_gemm", "scaled_grouped_gemm")


def built_archs():
    """The archs this library holds machine code for, from its CUDA arch list ("8.0;9.0a" -> ["8.0", "9.0a"];
    a "+PTX" suffix dropped); [] for a CPU-only build."""
    built = compiled_build_info()
    if not built["with_cuda"]:
        return []
    entries = built["cuda_arch_list"].replace(",", ";").replace(" ", ";").split(";")
    return [a.split("+")[0] for a in entries if a]


def kernels(op=None):
    """The GEMM family's kernels, as a list of dicts, each with its ``name`` (as ``plan()`` and
    ``ops.gemm.set_tactic`` spell it) and the ``op`` it serves: ``"cutlass_gemm"`` (and ops.linear:
    cutlass_gemm/kernels/kernel_list.h, the CUTLASS instantiations and the SIMT GEMV kernels), ``"scaled_gemm"``
    (the SM90 FP8 kernels), ``"grouped_gemm"`` (the SM90 grouped kernels) and ``"scaled_grouped_gemm"`` (the SM90
    FP8 grouped kernels); ``op``: that op's only.
    ``candidate_only`` ones are compiled only with OPS_CANDIDATE_KERNELS=1
    (``ops.build_info.CANDIDATE_KERNELS``). ``built``: whether this library holds the kernel's machine code
    (a CUDA build, the kernel's build switch, and an arch of ``ops.build_info.CUDA_ARCH_LIST`` whose image
    holds it: sm_90a for SM90 kernels; an 8.x arch, or 9.0 for those the Hopper image keeps, for SM80 ones).
    Dtypes (``dtype``, ``out_dtype``) are spelled as torch's (``"bfloat16"``, ``"float8_e4m3fn"``:
    ``str(torch.bfloat16)`` without ``torch.``)."""
    if op is not None and op not in _KERNEL_OPS:
        raise ValueError(f"ops.kernels: op must be None or one of {', '.join(_KERNEL_OPS)}, got {op!r}")
    listed = json.loads(torch.ops.ops._cutlass_gemm_kernels())
    built = compiled_build_info()
    archs = built_archs()
    for k in listed:
        in_image = ("9.0a" in archs if k["sm"] == 90 else
                    any(a.startswith("8.") for a in archs) or (k["on_sm90"] and any(a.startswith("9.0") for a in archs)))
        k["built"] = in_image and (built["candidate_kernels"] or not k["candidate_only"])
    return [k for k in listed if op is None or k["op"] == op]


def allow_tf32():
    """Whether torch's float32 matmul precision currently allows TF32 (what cutlass_gemm follows)."""
    return bool(torch.ops.ops._allow_tf32())


def gemm_emulate(A, B, out, cc_major, cc_minor, arch_list, allow_tf32, poison=True, bias=None,
                 epilogue="plain", sm_count=132, candidate_kernels=None):
    """Test hook: runs the CUDA wrapper's host path on CPU tensors (see tests/test_gemm_plan.py) for a
    device of compute capability (cc_major, cc_minor) and a binary built for `arch_list`; the CUTLASS
    launch is replaced by a replay of its launch descriptor. ``epilogue``: "plain" (cutlass_gemm) or an
    ops.linear activation ("none", "relu", ...), which computes act(A @ B + bias). ``sm_count``: the
    emulated device's multiprocessors (the tactic heuristic's wave size; 132 = H100 SXM / H200).
    ``candidate_kernels``: whether the emulated binary has the candidate-only kernels (an
    OPS_CANDIDATE_KERNELS=1 build); None: as this build. Writes `out`; returns the plan (dict, as ops.gemm.plan), with the
    tactic actually used (a forced one too)."""
    return json.loads(torch.ops.ops._cutlass_gemm_emulate(A, B, out, cc_major, cc_minor, arch_list,
                                                            allow_tf32, poison, bias, epilogue, sm_count,
                                                            candidate_kernels))


def gemm_plan_for_target(A, B, cc_major, cc_minor, arch_list, allow_tf32=False, sm_count=132,
                         epilogue="plain", out=None, candidate_kernels=None):
    """Test hook: the plan (dict, as ops.gemm.plan: kernel, heuristic tactic, candidates) the CUDA
    wrapper would make for A @ B on a device of compute capability (cc_major, cc_minor) with
    ``sm_count`` multiprocessors and a binary built for ``arch_list``. Nothing runs; A and B may be CPU
    tensors (only their sizes, strides and addresses matter). ``out``: the out tensor, if any (its
    layout can change the plan); without it, a new row-major output (nothing is allocated).
    ``candidate_kernels``: as for gemm_emulate."""
    return json.loads(torch.ops.ops._cutlass_gemm_plan_for_target(A, B, cc_major, cc_minor, arch_list,
                                                                    allow_tf32, sm_count, epilogue, out,
                                                                    candidate_kernels))
