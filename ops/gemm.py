"""`ops.cutlass_gemm`: the Python API and the fake (meta) kernels of the CUTLASS GEMM op.

The schemas live in csrc/registration.cpp; CPU kernels in cutlass_gemm/dense/gemm_cpu.cpp; the CUDA
host path and kernels in cutlass_gemm/ (docs/architecture.md).
"""

import os
import threading
from typing import Optional

import torch

from . import _library  # loads the op library: registers torch.ops.ops.*
from . import _overlap
# The tuning cache's files: public here, written and read in ops/_tuning.py.
from ._tuning import TUNING_CACHE_MAX_BYTES, load_tuning_cache, save_tuning_cache  # noqa: F401

__all__ = ["cutlass_gemm", "plan", "set_tactic", "get_tactic", "set_autotune", "autotune_enabled",
           "set_candidate_kernels", "candidate_kernels_enabled", "tuning_cache", "clear_tuning_cache",
           "save_tuning_cache", "load_tuning_cache", "TUNING_CACHE_MAX_BYTES"]

_GEMM_DTYPES = _library.GEMM_DTYPES


def _check_gemm_shapes(op: str, A: torch.Tensor, B: torch.Tensor) -> None:
    """csrc/checks.cpp's check_gemm_shapes, for fake tensors (torch._check keeps them symbolic)."""
    torch._check(A.dim() == 2, lambda: f"{op}: expected A to be a 2-D matrix (M, K), got a {A.dim()}-D "
                 f"tensor of shape {list(A.shape)}")
    torch._check(B.dim() == 2, lambda: f"{op}: expected B to be a 2-D matrix (K, N), got a {B.dim()}-D "
                 f"tensor of shape {list(B.shape)}")
    torch._check(A.shape[1] == B.shape[0], lambda: f"{op}: A (M, K) and B (K, N) must agree on K, got A of "
                 f"shape {list(A.shape)} and B of shape {list(B.shape)}")


def _check_gemm_args(op: str, A: torch.Tensor, B: torch.Tensor) -> None:
    """The same checks as csrc/checks.cpp's check_gemm_inputs, for fake tensors."""
    _check_gemm_shapes(op, A, B)
    torch._check(A.dtype in _GEMM_DTYPES, lambda: f"{op}: expected A's dtype to be {_library.GEMM_DTYPES_TEXT}, "
                 f"got {A.dtype}")
    torch._check(A.dtype == B.dtype, lambda: f"{op}: A and B must have the same dtype, got A {A.dtype} "
                 f"and B {B.dtype}")
    torch._check(A.device == B.device, lambda: f"{op}: A and B must be on the same device, got A on "
                 f"{A.device} and B on {B.device}")


def _check_gemm_out(op: str, A: torch.Tensor, B: torch.Tensor, out: torch.Tensor, dtype=None,
                    dtype_origin: str = "the dtype of A and B") -> None:
    """csrc/checks.cpp's check_gemm_out: out's dtype is `dtype` (default A's)."""
    dtype = A.dtype if dtype is None else dtype
    torch._check(out.dim() == 2 and out.shape[0] == A.shape[0] and out.shape[1] == B.shape[1],
                 lambda: f"{op}: expected out of shape (M, N) = ({A.shape[0]}, {B.shape[1]}), got "
                 f"{list(out.shape)}")
    torch._check(out.dtype == dtype, lambda: f"{op}: expected out's dtype to be {dtype} ({dtype_origin}), "
                 f"got {out.dtype}")
    torch._check(out.device == A.device, lambda: f"{op}: expected out on {A.device} (the device of A and "
                 f"B), got {out.device}")
    _check_out_memory(op, out, {"A": A, "B": B})


def _check_out_memory(op: str, out: torch.Tensor, inputs) -> None:
    """csrc/checks.cpp's check_out_memory: out has no internal overlap and overlaps none of `inputs`
    (name: tensor or None)."""
    _overlap.check_written_in_place(op, "out", out)
    for name, t in inputs.items():
        torch._check(t is None or _overlap.overlap_status(out, t) not in (_overlap.FULL, _overlap.PARTIAL),
                     lambda: f"{op}: out overlaps {name} in memory; the result would overwrite its own input. "
                     "Pass a separate out tensor.")


@torch.library.register_fake("ops::cutlass_gemm")
def _cutlass_gemm_fake(A, B):
    _check_gemm_args("cutlass_gemm", A, B)
    # The real kernels return a new contiguous (row-major) tensor.
    return A.new_empty((A.shape[0], B.shape[1]))


@torch.library.register_fake("ops::cutlass_gemm.out")
def _cutlass_gemm_out_fake(A, B, *, out):
    _check_gemm_args("cutlass_gemm", A, B)
    _check_gemm_out("cutlass_gemm", A, B, out)


# Autograd: registered in C++ (csrc/autograd.cpp), so that a call costs no trip through Python and
# C++ programs get the formula too.


# The overloads, resolved once. An overload packet matches the arguments against its overloads' schemas in
# turn at every call: an out= call first fails to match the functional schema (a C++ exception with its
# message), 4 us on CPU, more than the rest of a 16x16x16 call (benchmarks/host_cost.py).
_CUTLASS_GEMM = torch.ops.ops.cutlass_gemm.default
_CUTLASS_GEMM_OUT = torch.ops.ops.cutlass_gemm.out


def cutlass_gemm(A: torch.Tensor, B: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Matrix product C = A @ B, on CUDA by CUTLASS tensor-core kernels (ATen on Hopper for float32 without TF32
    and float64, below), on CPU by ATen's BLAS.

    Args:
        A: (M, K) matrix. float16, bfloat16, float32 or float64.
        B: (K, N) matrix, same dtype and device as A.
        out: optional (M, N) tensor of the same dtype and device to write the result into. It may be
            row-major, column-major (a transposed view) or any other strided layout (computed into a
            temporary and copied back); it must not overlap A or B (docs/gemm.md: where ATen's
            overlap analysis cannot decide, the product is computed apart, then written). Under
            ``torch.compile`` a non-contiguous out is a graph break, an error with ``fullgraph=True``
            (Dynamo's rule for out= arguments).

    Returns:
        C, an (M, N) tensor: a new contiguous tensor, or ``out``.

    Precision: float16/bfloat16 accumulate in float32; float64 in float64. float32 follows torch's matmul
    precision setting like ``torch.mm`` (``torch.backends.cuda.matmul.fp32_precision``, the legacy
    ``torch.backends.cuda.matmul.allow_tf32``, ``torch.set_float32_matmul_precision``): TF32 tensor cores only where TF32 is allowed, otherwise the
    CUTLASS 3xTF32 "fast accurate" kernels (float32-level accuracy; NVIDIA CUTLASS example 27). 3xTF32
    splits each operand into a TF32 part and a remainder, so an infinite element of A or B gives NaN
    where ``torch.mm`` gives +-inf (inf - inf and inf * 0 in the split); finite inputs are unaffected.
    On Hopper that float32 case (and float64) runs through ATen: the SM80 kernels gave wrong results on the
    H200 (benchmarks/results/2026-11-30-h200) and their fix has not run on a GPU (docs/gemm.md:
    ``OPS_CUTLASS_SM80_ON_SM90=1`` runs them anyway). The CUDA paths here have not run on a GPU since,
    but for the fp16/bf16 SM90 layouts and out variants that passed on that H200.

    Layouts (CUDA): row- and column-major A, B and out run without copies (a column-major out is
    computed as C^T = B^T A^T). Other strides, pointers or leading dimensions that are not 16-byte
    aligned, and extents the kernels cannot vectorise (e.g. a row-major float16 A with K % 8 != 0) are copied into
    aligned, zero-padded buffers first: slower, never wrong. M, N or K = 0 are handled (K = 0 gives
    zeros).

    Autograd: differentiable in A and B (dA = dC B^T, dB = A^T dC, computed by this op on transposed
    views); double backward works, since the backward is made of this op; forward mode computes
    dC = dA B + A dB. The formulas are registered in C++ (csrc/autograd.cpp), so C++ programs that load
    the library can differentiate too, and torch.func transforms work. The out variant is not
    differentiable: like ``torch.mm(..., out=)`` it raises if grad mode is on and an argument requires
    grad.

    Raises:
        RuntimeError: A or B not 2-D, K mismatch, dtype not one of the four above or different between
            A, B and out, tensors on different devices, out of the wrong shape, out overlapping A or B
            (also through two storages over one buffer, e.g. torch.from_numpy twice, in eager mode; a
            compiled graph checks fake tensors, which have no memory to compare), out a negative view,
            out variant with an argument that requires grad (grad mode on), a tensor that is not dense and
            strided (sparse, nested, quantized, MKL-DNN), or (CUDA) a GPU the kernels were not built for
            (sm80-sm89, sm90 with 9.0a).
    """
    if not torch.jit.is_scripting():  # a constant to TorchScript, which compiles only the calls below
        if out is None:
            return _CUTLASS_GEMM(A, B)
        _CUTLASS_GEMM_OUT(A, B, out=out)
        return out
    # Overload packets: TorchScript resolves them once, when it compiles; it cannot script .default / .out.
    if out is None:
        return torch.ops.ops.cutlass_gemm(A, B)
    torch.ops.ops.cutlass_gemm(A, B, out=out)
    return out


# ---- Kernel selection: tactics, autotuning ------------------------------------------------------
#
# On CUDA each GEMM runs one of several CUTLASS instantiations (tile shape, cluster, schedule: see
# ``ops.kernels()`` and cutlass_gemm/kernels/kernel_list.h) with run-time scheduler settings (data-parallel,
# split-K, stream-K, swizzle); together, a "tactic". By default a shape heuristic chooses
# (cutlass_gemm/core/tactic.cpp). These functions inspect that choice, override it, or replace it with
# measurements. The settings are process-wide and have no effect on CPU tensors.


def _check_plan_device(name: str, A: torch.Tensor) -> None:
    """A plan is that of a CPU or a CUDA call (a meta tensor runs no kernel)."""
    if not isinstance(A, torch.Tensor) or A.device.type not in ("cpu", "cuda"):
        where = A.device if isinstance(A, torch.Tensor) else type(A).__name__
        raise RuntimeError(f"{name}: expected CPU or CUDA tensors, got A on {where}")


def plan(A: torch.Tensor, B: torch.Tensor, out: Optional[torch.Tensor] = None) -> dict:
    """The plan ``cutlass_gemm(A, B, out=out)`` would run on A's CUDA device, without running it.

    Args:
        A: (M, K) CUDA tensor; B: (K, N) CUDA tensor (as for ``cutlass_gemm``; M, N, K > 0).
        out: the out tensor the call would get, if any: its layout can change the plan (a
            column-major out is computed as C^T = B^T A^T, by another kernel family).

    Returns:
        dict with ``kernel`` (the kernel's name, spelled from its configuration as CUTLASS's generator
        spells kernels: ``ops.kernels()``), ``kernel_id`` (its identifier in cutlass_gemm/kernels/kernel_list.h),
        ``tactic`` (name, config, decomposition, splits, swizzle: the heuristic's choice, ignoring
        ``set_tactic`` and the tuning cache), ``tactic_source`` ("heuristic"), ``tuning_key`` (its key in
        the tuning cache), ``candidates`` (every tactic name ``set_tactic`` accepts for this GEMM),
        ``candidates_not_built`` (candidate-only kernels of this GEMM's family that the build leaves
        out: OPS_CANDIDATE_KERNELS=1 builds them), ``swap_ab``, ``kind``, the kernel's ``m``/``n``/``k`` and
        how each operand is read (``a``, ``b``, ``d``: in place or copied, layout, leading dimension).
        Where no CUTLASS kernel may run for this dtype on this GPU (fp32 without TF32 and fp64 on Hopper,
        whose SM80 kernels' fix has not run on a GPU: docs/gemm.md), ``{"path": "aten", "kernel": "aten", "tactic":
        {"name": "aten"}, "tactic_source": "fallback", "fallback": <reason>, "reason": <reason>,
        "candidates": [], "m", "n", "k"}``: the GEMM runs through ATen (cuBLAS) with torch.mm's precision
        rules. CPU tensors get that plan too, the reason naming ATen's BLAS (torch.mm's kernel). Every plan
        of the GEMM family (``ops.fp8.plan``, ``ops.grouped.plan``) opens with ``kind``, ``path`` and
        ``kernel`` (None where no CUTLASS kernel runs; "aten" in this plan), and on the CUTLASS path names its
        ``candidates``,
        ``tactic_source``, ``tuning_key`` and ``swap_ab``.

    Raises:
        RuntimeError: bad inputs (as ``cutlass_gemm``), an empty problem on CUDA, tensors on a device
            other than the CPU and CUDA, or no kernel for this GPU.
    """
    import json

    for name, t in (("A", A), ("B", B), ("out", out)):
        if not (isinstance(t, torch.Tensor) or (name == "out" and t is None)):
            raise TypeError(f"ops.gemm.plan: expected {name} to be a tensor, got {type(t).__name__}")
    if A.device.type == "cpu":
        _check_gemm_args("cutlass_gemm", A, B)
        if out is not None:
            _check_gemm_out("cutlass_gemm", A, B, out)
    _check_plan_device("ops.gemm.plan", A)
    return json.loads(torch.ops.ops._cutlass_gemm_plan(A, B, out))


# set_tactic / set_autotune return the previous setting: the read and the write happen under this lock, so
# each caller gets the value it replaced (the settings stay process-wide: a save/restore from two threads
# at once still restores in whatever order the threads finish).
_CONTROLS_LOCK = threading.Lock()


def set_tactic(name: Optional[str]) -> Optional[str]:
    """Force every CUDA ``cutlass_gemm`` / ``linear`` GEMM to run the tactic ``name`` (a name from
    ``plan(A, B)["candidates"]``, e.g.
    ``"sm90_bf16_128x128x64_1x1x1_tnt_align8_stream_k_warpspecialized_cooperative/splitk4"``), or restore the normal choice
    with ``None``. The SM90 kernels of ``scaled_gemm`` and ``grouped_gemm`` follow it too (their
    ``ops.fp8.plan`` / ``ops.grouped.plan`` ``candidates``: unswapped and swapped; a candidate's launch
    variants, ``/swz2/raster_m`` and the like, are accepted too). For benchmarking and experiments: a CUTLASS
    GEMM whose candidates do not include ``name`` raises a RuntimeError listing them; GEMMs on the ATen path
    ignore it. Not run on a GPU.
    Returns the previous setting."""
    if name is not None and not isinstance(name, str):
        raise TypeError(f"ops.gemm.set_tactic: expected a tactic name (str) or None, got {type(name).__name__}")
    if name is not None and not (name.isprintable() and name.isascii()):
        raise ValueError(f"ops.gemm.set_tactic: expected a tactic name (printable ASCII, as plan() lists them), "
                         f"got {name[:80]!r}")
    with _CONTROLS_LOCK:
        previous = get_tactic()
        torch.ops.ops._cutlass_gemm_set_tactic(name or None)
    return previous


def get_tactic() -> Optional[str]:
    """The tactic forced by ``set_tactic``, or None."""
    return torch.ops.ops._cutlass_gemm_get_tactic() or None


def set_autotune(enabled: bool) -> bool:
    """Turn autotuning on or off (off by default; the environment variable ``OPS_GEMM_AUTOTUNE=1`` turns
    it on at import). Returns the previous setting.

    With autotuning on, the first CUDA GEMM of each shape (kernel family, M, N, K, leading dimensions,
    device model) without a cached choice times every candidate tactic (a warm-up run and the median of
    5 runs each, between CUDA events: this synchronizes the stream once per candidate) and caches the
    fastest (not run on a GPU). A
    shape first seen during CUDA graph capture runs the heuristic's choice and is not tuned (timing
    would synchronize a capturing stream). The SM90 kernels of ``scaled_gemm`` and ``grouped_gemm`` are
    tuned the same way between their candidates (keyed by ``ops.fp8.plan`` / ``ops.grouped.plan``
    ``tuning_key``: their kernels, the extents and the device model), into the same cache.

    Cached choices (tuned here, or loaded with ``load_tuning_cache``) are used whenever present, with
    autotuning on or off; turning it off only stops new shapes from being timed (``clear_tuning_cache``
    forgets the choices). ``set_tactic`` takes precedence over both."""
    if not isinstance(enabled, bool):  # bool("no") is True
        raise TypeError(f"ops.gemm.set_autotune: expected enabled to be True or False, got "
                        f"{type(enabled).__name__} {enabled!r}")
    with _CONTROLS_LOCK:
        previous = autotune_enabled()
        torch.ops.ops._cutlass_gemm_set_autotune(enabled)
    return previous


def autotune_enabled() -> bool:
    """Whether autotuning is on (``set_autotune``)."""
    return bool(torch.ops.ops._cutlass_gemm_autotune_enabled())


def set_candidate_kernels(enabled: bool) -> bool:
    """Let the candidate-only kernels of a build with ``OPS_CANDIDATE_KERNELS=1`` take calls (the default), or
    not: then every op chooses as the default build does (``torch._scaled_mm``, ``torch._grouped_mm``,
    ``torch._scaled_grouped_mm``, the default CUTLASS configurations), so that one build runs both builds'
    paths, e.g. in the GPU check. No effect on a build without them (``ops.build_info.CANDIDATE_KERNELS``).
    ``plan()`` and the other plans follow it. Returns the previous setting."""
    if not isinstance(enabled, bool):
        raise TypeError(f"ops.gemm.set_candidate_kernels: expected enabled to be True or False, got "
                        f"{type(enabled).__name__} {enabled!r}")
    with _CONTROLS_LOCK:
        previous = candidate_kernels_enabled()
        torch.ops.ops._cutlass_gemm_set_candidate_kernels(enabled)
    return previous


def candidate_kernels_enabled() -> bool:
    """Whether a build's candidate-only kernels take calls (``set_candidate_kernels``; on by default)."""
    return bool(torch.ops.ops._cutlass_gemm_candidate_kernels_enabled())


def tuning_cache() -> list:
    """The tuning cache: a list of dicts with ``key`` (device model and SM count, kernel family, M, N, K,
    leading dimensions: the ``tuning_key`` of ``plan(A, B)``), ``best`` (the tactic used for that GEMM)
    and ``timings_ms`` (every candidate's median time in milliseconds when it was tuned; None for a
    candidate that could not run)."""
    import json

    return json.loads(torch.ops.ops._cutlass_gemm_tuning_cache())


def clear_tuning_cache() -> None:
    """Forget every cached choice (with autotuning on, the next GEMM of each shape is timed again)."""
    torch.ops.ops._cutlass_gemm_clear_tuning_cache()


def _autotune_from_environment() -> None:
    """OPS_GEMM_AUTOTUNE=1 turns autotuning on; OPS_GEMM_TUNING_CACHE=<file> loads a saved tuning cache.
    Neither fails the import: a bad value or file gives a warning."""
    import warnings

    value = os.environ.get("OPS_GEMM_AUTOTUNE", "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        set_autotune(True)
    elif value not in ("", "0", "false", "no", "off"):
        warnings.warn(f"OPS_GEMM_AUTOTUNE={value!r} not understood (use 1 or 0): autotuning stays off",
                      stacklevel=2)
    path = os.environ.get("OPS_GEMM_TUNING_CACHE", "")
    if path:
        try:
            load_tuning_cache(path)
        except Exception as e:  # noqa: BLE001 - whatever is wrong with the file, the import goes on
            warnings.warn(f"OPS_GEMM_TUNING_CACHE={path!r}: not loaded ({type(e).__name__}: {e})", stacklevel=2)


_autotune_from_environment()
