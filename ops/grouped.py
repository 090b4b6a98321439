"""``ops.grouped_gemm``: one GEMM per group of rows, columns or K, with ``torch._grouped_mm``'s modes (the
experts of mixture-of-experts models). Python API and fake kernels; schema in csrc/registration.cpp,
checks in csrc/checks.cpp (``check_grouped_gemm_inputs``), host paths in cutlass_gemm/grouped/, the SM90
kernels in cutlass_gemm/kernels/sm90_grouped_gemm.cuh, autograd in csrc/autograd.cpp."""

import json
from typing import Optional

import torch

from . import _library
from .gemm import _check_out_memory, _check_plan_device

__all__ = ["grouped_gemm", "plan"]

# What each mode's offs cuts, by (A.dim(), B.dim()): csrc/checks.h GroupedMode.
MODES = {(2, 3): "2D x 3D", (2, 2): "2D x 2D", (3, 3): "3D x 3D", (3, 2): "3D x 2D"}


def _problem(op, A, B, offs, out_dtype, origin="out_dtype"):
    """csrc/checks.cpp's check_grouped_gemm_inputs, for fake tensors: returns the mode and the output's shape."""
    torch._check(A.dtype in _library.GEMM_DTYPES, lambda: f"{op}: expected A's dtype to be "
                 f"{_library.GEMM_DTYPES_TEXT}, got {A.dtype}")
    torch._check(A.dtype == B.dtype, lambda: f"{op}: A and B must have the same dtype, got A {A.dtype} and B "
                 f"{B.dtype}")
    half = A.dtype in (torch.float16, torch.bfloat16)
    torch._check(out_dtype == A.dtype or (half and out_dtype == torch.float32), lambda: f"{op}: expected {origin} "
                 f"to be {A.dtype} (A's dtype){' or torch.float32' if half else ''}, got {out_dtype}")
    return _shapes(op, A, B, offs)


def _shapes(op, A, B, offs):
    """csrc/checks.cpp's grouped_problem (grouped_gemm's and scaled_grouped_gemm's): the mode, the output's
    shape, offs's checks; reads no dtypes."""
    torch._check(A.dim() in (2, 3), lambda: f"{op}: expected A to be 2-D (M, K) or 3-D (G, M, K), got a "
                 f"{A.dim()}-D tensor of shape {list(A.shape)}")
    torch._check(B.dim() in (2, 3), lambda: f"{op}: expected B to be 2-D (K, N) or 3-D (G, K, N), got a "
                 f"{B.dim()}-D tensor of shape {list(B.shape)}")
    torch._check(A.device == B.device, lambda: f"{op}: A and B must be on the same device, got A on {A.device} "
                 f"and B on {B.device}")
    torch._check(A.shape[-1] == B.shape[-2], lambda: f"{op}: A and B must agree on K (A's last dimension, B's "
                 f"second to last), got A of shape {list(A.shape)} and B of shape {list(B.shape)}")
    mode = MODES[(A.dim(), B.dim())]
    if offs is not None and mode == "3D x 3D":
        torch._check(False, lambda: f"{op}: offs must be None when A and B are both 3-D (one GEMM per batch "
                     "entry), got a tensor")
    if offs is None and mode != "3D x 3D":
        torch._check(False, lambda: f"{op}: offs is required when A or B is 2-D (int32 cumulative ends of the "
                     "groups), got None")
    if mode == "2D x 3D":
        groups, out_shape = B.shape[0], (A.shape[0], B.shape[2])
    elif mode == "2D x 2D":
        groups = offs.numel()
        out_shape = (groups, A.shape[0], B.shape[1])
    elif mode == "3D x 3D":
        torch._check(A.shape[0] == B.shape[0], lambda: f"{op}: A (G, M, K) and B (G, K, N) must agree on G, got "
                     f"A of shape {list(A.shape)} and B of shape {list(B.shape)}")
        groups, out_shape = A.shape[0], (A.shape[0], A.shape[1], B.shape[2])
    else:
        groups, out_shape = A.shape[0], (A.shape[1], B.shape[1])
    if offs is not None:
        torch._check(offs.dim() == 1, lambda: f"{op}: expected offs to be 1-D (G,), got a {offs.dim()}-D tensor "
                     f"of shape {list(offs.shape)}")
        torch._check(offs.dtype == torch.int32, lambda: f"{op}: expected offs to be torch.int32 (as "
                     f"torch._grouped_mm), got {offs.dtype}")
        torch._check(offs.device == A.device, lambda: f"{op}: expected offs on {A.device} (A's device), got "
                     f"{offs.device}")
        torch._check(offs.is_contiguous(), lambda: f"{op}: offs must be a contiguous tensor")
        first = "B's first dimension" if mode == "2D x 3D" else "A's first dimension"
        torch._check(offs.shape[0] == groups, lambda: f"{op}: expected offs of G = {groups} elements ({first} in "
                     f"{mode}), got {offs.shape[0]}")
    return mode, out_shape


@torch.library.register_fake("ops::grouped_gemm")
def _grouped_gemm_fake(A, B, offs=None, out_dtype=None):
    out_dtype = A.dtype if out_dtype is None else out_dtype
    _, shape = _problem("grouped_gemm", A, B, offs, out_dtype)
    # The real kernels return a new contiguous tensor; the group sizes (offs's values) do not change its shape.
    return A.new_empty(shape, dtype=out_dtype)


@torch.library.register_fake("ops::grouped_gemm.out")
def _grouped_gemm_out_fake(A, B, offs=None, out_dtype=None, *, out):
    origin = "out's dtype" if out_dtype is None else "out_dtype"
    out_dtype = out.dtype if out_dtype is None else out_dtype
    mode, shape = _problem("grouped_gemm", A, B, offs, out_dtype, origin)
    _check_out("grouped_gemm", out, A, mode, shape, out_dtype, origin, {"A": A, "B": B, "offs": offs})


def _check_out(op, out, A, mode, shape, out_dtype, origin, inputs):
    """csrc/checks.cpp's check_grouped_gemm_out (and scaled_grouped_gemm's): shape, dtype, device, memory."""
    torch._check(tuple(out.shape) == tuple(shape), lambda: f"{op}: expected out of shape {list(shape)} ({mode}), "
                 f"got {list(out.shape)}")
    torch._check(out.dtype == out_dtype, lambda: f"{op}: expected out's dtype to be {out_dtype} ({origin}), "
                 f"got {out.dtype}")
    torch._check(out.device == A.device, lambda: f"{op}: expected out on {A.device} (the device of A and B), got "
                 f"{out.device}")
    _check_out_memory(op, out, inputs)


# Resolved once, as in ops.gemm: the overload packet's schema matching costs 4.5 us per out= call on CPU
# (benchmarks/host_cost.py).
_GROUPED_GEMM = torch.ops.ops.grouped_gemm.default
_GROUPED_GEMM_OUT = torch.ops.ops.grouped_gemm.out


def grouped_gemm(A: torch.Tensor, B: torch.Tensor, offs: Optional[torch.Tensor] = None,
                 out_dtype: Optional[torch.dtype] = None, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """One matrix product per group, with ``torch._grouped_mm``'s modes and meaning.

    ``offs`` holds the groups' cumulative ends (int32, G elements) along the dimension it cuts:

    * 2D x 3D, A (M, K), B (G, K, N): rows ``offs[g-1]:offs[g]`` of A times ``B[g]``; out (M, N). The MoE
      forward: A the tokens sorted by expert, B one weight matrix per expert.
    * 2D x 2D, A (M, K), B (K, N): ``A[:, offs[g-1]:offs[g]] @ B[offs[g-1]:offs[g]]``; out (G, M, N). The
      weight gradient of the MoE forward.
    * 3D x 3D, A (G, M, K), B (G, K, N), offs None: ``A[g] @ B[g]``; out (G, M, N).
    * 3D x 2D, A (G, M, K), B (K, N): ``A[g] @ B[:, offs[g-1]:offs[g]]`` into those columns; out (M, N).

    Groups may be empty; output rows (2D x 3D) or columns (3D x 2D) past the last end are zero.

    Args:
        A, B: float16, bfloat16, float32 or float64, one dtype and device, any strides.
        offs: int32 cumulative group ends on A's device (None for 3D x 3D): non-negative, non-decreasing,
            the last at most the size it cuts.
        out_dtype: A's dtype (None; with ``out``, out's dtype), or torch.float32 for float16 and bfloat16
            inputs (returned unrounded).
        out: optional output of the mode's shape and ``out_dtype`` to write into (any strides, not
            overlapping the inputs); not differentiable.

    Computation: on CPU one ATen ``mm`` per group (3D x 3D: one ``bmm``), ``torch._grouped_mm``'s own CPU
    path (equal bit for bit where torch writes; it leaves rows or columns past the last end unwritten). On
    CUDA: in a build with OPS_CANDIDATE_KERNELS=1 on an sm_90a device, SM90 CUTLASS grouped kernels (offs
    read on the device); else ``torch._grouped_mm`` where it runs the problem (its CUTLASS kernel for
    bfloat16 on SM90/SM100 reads offs on the device: no synchronization), on offs clamped to [0, extent]
    and made non-decreasing on the device (bad offsets are not errors there, and never read out of bounds);
    else the loop (offs read and checked on the host). ``plan`` says which. None of the CUDA paths has run
    on a GPU.

    Autograd: differentiable in A and B (offs is an index): the input gradient is a grouped GEMM against
    the transposed weights, the weight gradient a grouped GEMM over the cut dimension; any gradient layout.

    Raises:
        RuntimeError: dimensions, dtypes, devices, K or G that do not agree, offs missing or given where
            the mode has none, offs of another dtype, device or count, offs's values out of order or past
            the end, ``out`` of the wrong shape or dtype or overlapping an input (as ATen's overlap analysis
            decides; docs/gemm.md).
    """
    if not torch.jit.is_scripting():  # a constant to TorchScript, which compiles only the calls below
        if out is None:
            return _GROUPED_GEMM(A, B, offs, out_dtype)
        _GROUPED_GEMM_OUT(A, B, offs, out_dtype, out=out)
        return out
    # Overload packets: TorchScript resolves them once, when it compiles; it cannot script .default / .out.
    if out is None:
        return torch.ops.ops.grouped_gemm(A, B, offs, out_dtype)
    torch.ops.ops.grouped_gemm(A, B, offs, out_dtype, out=out)
    return out


def plan(A: torch.Tensor, B: torch.Tensor, offs: Optional[torch.Tensor] = None,
         out_dtype: Optional[torch.dtype] = None) -> dict:
    """The path ``grouped_gemm(A, B, offs, out_dtype)`` takes on A's device: ``mode`` ("2D x 3D", ...),
    ``path`` ("loop": one ATen mm per group, offs read and checked on the host; "torch._grouped_mm": torch's
    grouped kernel on offs clamped on the device; "cutlass": an SM90 grouped kernel, named in ``kernel``, with
    ``candidates``, ``tactic_source``, ``tuning_key`` and ``swap_ab``), ``kind``, ``reason``, ``host_sync``
    (whether the call waits for the device to read offs: then it cannot be captured in a CUDA graph) and
    ``offsets`` (how they are treated)."""
    _check_plan_device("ops.grouped.plan", A)
    return json.loads(torch.ops.ops._grouped_gemm_plan(A, B, offs, out_dtype))
