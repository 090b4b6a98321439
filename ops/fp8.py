"""FP8: ``ops.scaled_gemm``, the GEMM of FP8 operands with float32 scales, ``ops.scaled_grouped_gemm``, its
grouped form, ``ops.fp8_grouped_mm`` (MoE training over it), ``ops.quantize_fp8`` and the fused quantizing
forms of the norms and silu_and_mul. Python API and fake kernels; schema in csrc/registration.cpp, checks in
csrc/checks.cpp (``check_scaled_gemm_inputs``, ``check_scaled_grouped_gemm_inputs``), host paths in
cutlass_gemm/scaled/ and cutlass_gemm/scaled_grouped/, the SM90 kernels in cutlass_gemm/kernels/sm90_scaled*.cuh,
the quantization kernels in csrc/quantize_fp8*.cpp and csrc/fp8_fused.cpp, the refusal of autograd in
csrc/autograd.cpp."""

import json
import math
from typing import Optional

import torch

from . import _library, _overlap, fused as _fused
from .gemm import _check_gemm_out, _check_gemm_shapes, _check_out_memory, _check_plan_device
from .grouped import _check_out, _shapes
from .linear import _check_activation

__all__ = ["scaled_gemm", "plan", "scaled_grouped_gemm", "grouped_plan", "fp8_grouped_mm", "quantize_fp8", "rms_norm_fp8", "fused_add_rms_norm_fp8", "silu_and_mul_fp8"]

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
BLOCK = 128  # the blockwise recipes' group length along K (and N for 128x128 blocks of B)


def recipe_of(m, k, n, scale_a_shape, scale_b_shape):
    """The recipe that scales of these shapes give A (m, k) and B (k, n) (csrc/checks.cpp
    check_scaled_gemm_inputs), or None."""
    kb, nb = -(-k // BLOCK), -(-n // BLOCK)
    sa, sb = tuple(scale_a_shape), tuple(scale_b_shape)
    if math.prod(sa) == 1 and math.prod(sb) == 1:
        return "tensorwise"
    if sa == (m, 1) and sb == (1, n):
        return "rowwise"
    if sa == (m, kb) and sb == (kb, nb):
        return "blockwise 1x128 x 128x128"
    if sa == (m, kb) and sb == (kb, n):
        return "blockwise 1x128 x 1x128"
    return None


def _recipe(op, A, B, scale_a, scale_b, bias, out_dtype, origin="out_dtype"):
    """The checks of csrc/checks.cpp (check_scaled_gemm_inputs), for fake tensors; returns the recipe."""
    _check_gemm_shapes(op, A, B)
    torch._check(A.dtype in _FP8 and B.dtype in _FP8, lambda: f"{op}: expected A and B to be torch.float8_e4m3fn "
                 f"or torch.float8_e5m2, got A {A.dtype} and B {B.dtype}")
    torch._check(not (A.dtype == B.dtype == torch.float8_e5m2), lambda: f"{op}: A and B cannot both be "
                 "torch.float8_e5m2 (as torch._scaled_mm: the tensor cores take e5m2 for one operand at most)")
    torch._check(out_dtype in _OUT_DTYPES, lambda: f"{op}: expected {origin} to be torch.bfloat16, torch.float16 "
                 f"or torch.float32, got {out_dtype}")
    M, K, N = A.shape[0], A.shape[1], B.shape[1]
    torch._check(K % 16 == 0 and N % 16 == 0, lambda: f"{op}: expected K and N to be multiples of 16 (the FP8 "
                 f"tensor cores' 16-byte rows), got K = {K} and N = {N}")
    for name, t in (("B", B), ("scale_a", scale_a), ("scale_b", scale_b)):
        torch._check(t.device == A.device, lambda: f"{op}: expected {name} on {A.device} (A's device), got "
                     f"{t.device}")
    torch._check(scale_a.dtype == torch.float32 and scale_b.dtype == torch.float32, lambda: f"{op}: expected "
                 f"scale_a and scale_b to be torch.float32, got {scale_a.dtype} and {scale_b.dtype}")
    kb, nb = -(-K // BLOCK), -(-N // BLOCK)
    recipe = recipe_of(M, K, N, scale_a.shape, scale_b.shape)
    if recipe is None:
        torch._check(False, lambda: f"{op}: scale_a of shape {list(scale_a.shape)} and scale_b of shape "
                     f"{list(scale_b.shape)} are no recipe for A (M, K) = ({M}, {K}) and B (K, N) = ({K}, {N}); "
                     f"expected tensorwise: one element each; rowwise: (M, 1) = ({M}, 1) and (1, N) = (1, {N}); "
                     f"blockwise: scale_a (M, ceil(K/128)) = ({M}, {kb}) with scale_b (ceil(K/128), ceil(N/128)) = "
                     f"({kb}, {nb}) for 128x128 blocks of B or (ceil(K/128), N) = ({kb}, {N}) for 1x128 groups")
    if bias is not None:
        torch._check(bias.dim() == 1 and bias.shape[0] == N, lambda: f"{op}: expected bias of shape (N,) = ({N},), "
                     f"got {list(bias.shape)}")
        torch._check(bias.dtype == out_dtype, lambda: f"{op}: expected bias's dtype to be {out_dtype} ({origin}), "
                     f"got {bias.dtype}")
        torch._check(bias.device == A.device, lambda: f"{op}: expected bias on {A.device} (A's device), got "
                     f"{bias.device}")
    return recipe


@torch.library.register_fake("ops::scaled_gemm")
def _scaled_gemm_fake(A, B, scale_a, scale_b, bias=None, out_dtype=None, activation="none", use_fast_accum=False):
    out_dtype = torch.bfloat16 if out_dtype is None else out_dtype
    _recipe("scaled_gemm", A, B, scale_a, scale_b, bias, out_dtype)
    _check_activation("scaled_gemm", activation)
    return A.new_empty((A.shape[0], B.shape[1]), dtype=out_dtype)


@torch.library.register_fake("ops::scaled_gemm.out")
def _scaled_gemm_out_fake(A, B, scale_a, scale_b, bias=None, out_dtype=None, activation="none",
                          use_fast_accum=False, *, out):
    origin = "out's dtype" if out_dtype is None else "out_dtype"
    out_dtype = out.dtype if out_dtype is None else out_dtype
    _recipe("scaled_gemm", A, B, scale_a, scale_b, bias, out_dtype, origin)
    _check_activation("scaled_gemm", activation)
    _check_gemm_out("scaled_gemm", A, B, out, out_dtype, origin)
    _check_out_memory("scaled_gemm", out, {"scale_a": scale_a, "scale_b": scale_b, "bias": bias})


# Resolved once, as in ops.gemm: the overload packet's schema matching costs 5 us per out= call on CPU
# (benchmarks/host_cost.py).
_SCALED_GEMM = torch.ops.ops.scaled_gemm.default
_SCALED_GEMM_OUT = torch.ops.ops.scaled_gemm.out


def scaled_gemm(A: torch.Tensor, B: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                bias: Optional[torch.Tensor] = None, out_dtype: Optional[torch.dtype] = None,
                activation: str = "none", use_fast_accum: bool = False,
                out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """FP8 matrix product with scales: ``act((A * scale_a) @ (B * scale_b) + bias)`` in ``out_dtype``.

    Args:
        A: (M, K), torch.float8_e4m3fn or torch.float8_e5m2.
        B: (K, N), torch.float8_e4m3fn or torch.float8_e5m2 (not both e5m2, as ``torch._scaled_mm`` on CUDA).
            K and N multiples of 16; any strides.
        scale_a, scale_b: float32 scales (the factors that dequantize: value = code * scale), one of the
            recipes ``torch._scaled_mm`` defines, told apart by their shapes:

            * tensorwise: one element each;
            * rowwise: scale_a (M, 1), scale_b (1, N);
            * blockwise 1x128 x 128x128 (DeepSeek-V3): scale_a (M, ceil(K/128)), one per 1x128 group of a
              row of A; scale_b (ceil(K/128), ceil(N/128)), one per 128x128 block of B (a checkpoint's
              ``weight_scale_inv`` of W (N, K) is the transpose);
            * blockwise 1x128 x 1x128: scale_a as above, scale_b (ceil(K/128), N), one per 128 elements
              of a column of B.

            Where two recipes fit the shapes (K <= 128: rowwise and blockwise 1x128 x 1x128; with M = 1 and
            N <= 128 too, tensorwise and blockwise 1x128 x 128x128) they compute the same product.
        bias: optional (N,) of ``out_dtype``, added before the activation.
        out_dtype: torch.bfloat16 (None: the default; with ``out``, out's dtype), torch.float16 or
            torch.float32.
        activation: "none", "relu", "gelu", "gelu_tanh" or "silu" (as ``ops.linear``).
        use_fast_accum: the tensor cores' faster, less accurate FP8 accumulation (Hopper's, as
            ``torch._scaled_mm``); no effect on the float32 computation described below.
        out: optional (M, N) tensor of ``out_dtype`` to write into (any strides, not overlapping the
            inputs).

    Computation: each code times its scale in float32, the product, the bias and the activation in
    float32, one rounding to ``out_dtype``: what ATen's emulated CPU kernel of ``torch._scaled_mm`` computes,
    equal bit for bit for the recipes it runs (torch's oneDNN path, taken for e4m3 x e4m3 with tensorwise
    scales on CPUs with AMX-INT8, scales after accumulating and differs in the last bits). On CUDA (not run
    on a GPU) an SM90 FP8 CUTLASS kernel
    where one takes the call (e4m3 A and B, a binary built with the candidate kernels: float32 accumulation
    on the tensor cores, the bias and activation in its epilogue), else ``torch._scaled_mm`` for tensorwise and rowwise (its float32 product
    where there is an activation, applied before one rounding), else the same ATen formula (also every call
    of a kind torch has refused); ``plan()`` says which.

    Autograd: not differentiable (FP8 operands have no gradient): an argument that requires grad (grad
    mode on) raises, one with a forward-mode tangent raises NotImplementedError.

    Raises:
        RuntimeError: dtypes, shapes, scale shapes that are no recipe, scale dtypes, bias shape or dtype,
            K or N not a multiple of 16, devices, ``out`` of the wrong shape or dtype or overlapping an
            input (as ATen's overlap analysis decides; docs/gemm.md), an argument that requires grad.
        ValueError: an unknown activation.
    """
    if not torch.jit.is_scripting():  # a constant to TorchScript, which compiles only the calls below
        if out is None:
            return _SCALED_GEMM(A, B, scale_a, scale_b, bias, out_dtype, activation, use_fast_accum)
        _SCALED_GEMM_OUT(A, B, scale_a, scale_b, bias, out_dtype, activation, use_fast_accum, out=out)
        return out
    # Overload packets: TorchScript resolves them once, when it compiles; it cannot script .default / .out.
    if out is None:
        return torch.ops.ops.scaled_gemm(A, B, scale_a, scale_b, bias, out_dtype, activation, use_fast_accum)
    torch.ops.ops.scaled_gemm(A, B, scale_a, scale_b, bias, out_dtype, activation, use_fast_accum, out=out)
    return out


def plan(A: torch.Tensor, B: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
         bias: Optional[torch.Tensor] = None, out_dtype: Optional[torch.dtype] = None, activation: str = "none",
         use_fast_accum: bool = False) -> dict:
    """The path ``scaled_gemm`` takes for these arguments, without running it: ``recipe``, ``path``
    ("cutlass": an SM90 FP8 kernel, named in ``kernel``, with its ``candidates``, ``tactic_source`` and
    ``tuning_key``; "torch._scaled_mm"; "formula": the dequantized ATen formula) and ``reason``. Raises as
    ``scaled_gemm`` does for bad arguments, but for inputs that require grad."""
    _check_plan_device("ops.fp8.plan", A)
    return json.loads(torch.ops.ops._scaled_gemm_plan(A, B, scale_a, scale_b, bias, out_dtype, activation,
                                                      use_fast_accum))


def _grouped_scale_shapes(mode, G, M, N, K):
    """(rowwise scale_a, scale_b shapes, blockwise ones or None) of a grouped mode (csrc/checks.h
    ScaledGroupedProblem)."""
    kb, nb = -(-K // BLOCK), -(-N // BLOCK)
    return {"2D x 3D": (((M,), (G, N)), ((M, kb), (G, kb, nb))),
            "3D x 3D": (((G, M), (G, N)), ((G, M, kb), (G, kb, nb))),
            "3D x 2D": (((G, M), (N,)), None),
            "2D x 2D": (((G * M,), (G * N,)), None)}[mode]


def _grouped_recipe(op, A, B, scale_a, scale_b, offs, bias, out_dtype, origin="out_dtype"):
    """csrc/checks.cpp's check_scaled_grouped_gemm_inputs, for fake tensors: (mode, output shape, recipe)."""
    mode, out_shape = _shapes(op, A, B, offs)
    torch._check(A.dtype == torch.float8_e4m3fn and B.dtype == torch.float8_e4m3fn, lambda: f"{op}: expected A and B "
                 f"to be torch.float8_e4m3fn (as torch._scaled_grouped_mm), got A {A.dtype} and B {B.dtype}")
    torch._check(out_dtype in _OUT_DTYPES, lambda: f"{op}: expected {origin} to be torch.bfloat16, torch.float16 "
                 f"or torch.float32, got {out_dtype}")
    G = out_shape[0] if mode in ("2D x 2D", "3D x 3D") else (B.shape[0] if mode == "2D x 3D" else A.shape[0])
    M, N, K = A.shape[-2], B.shape[-1], A.shape[-1]
    torch._check(K % 16 == 0 and N % 16 == 0, lambda: f"{op}: expected K and N to be multiples of 16 (the FP8 "
                 f"tensor cores' 16-byte rows), got K = {K} and N = {N}")
    for name, t in (("scale_a", scale_a), ("scale_b", scale_b)):
        torch._check(t.device == A.device, lambda: f"{op}: expected {name} on {A.device} (A's device), got "
                     f"{t.device}")
        torch._check(t.dtype == torch.float32, lambda: f"{op}: expected {name} to be torch.float32, got {t.dtype}")
    rowwise, blockwise = _grouped_scale_shapes(mode, G, M, N, K)
    shapes = (tuple(scale_a.shape), tuple(scale_b.shape))
    if shapes == rowwise:
        recipe = "rowwise"
    elif blockwise is not None and shapes == blockwise:
        torch._check(K % BLOCK == 0, lambda: f"{op}: the blockwise recipe takes K in whole 128-blocks, got K = {K} "
                     "(the rowwise recipe takes it)")
        recipe = "blockwise 1x128 x 128x128"
    else:
        block = ("; blockwise 1x128 x 128x128: " + " and ".join(str(list(b)) for b in blockwise) if blockwise
                 else " (blockwise scales take 2D x 3D and 3D x 3D)")
        torch._check(False, lambda: f"{op}: scale_a of shape {list(scale_a.shape)} and scale_b of shape "
                     f"{list(scale_b.shape)} are no recipe for A of shape {list(A.shape)} and B of shape "
                     f"{list(B.shape)} ({mode}); expected rowwise: {list(rowwise[0])} and {list(rowwise[1])}{block}")
    if bias is not None:
        shape = (N,) if mode == "3D x 2D" else (G, N)
        torch._check(tuple(bias.shape) == shape, lambda: f"{op}: expected bias of shape {list(shape)} "
                     f"{'(N,)' if mode == '3D x 2D' else '(G, N)'}, got {list(bias.shape)}")
        torch._check(bias.dtype == out_dtype, lambda: f"{op}: expected bias's dtype to be {out_dtype} ({origin}), "
                     f"got {bias.dtype}")
        torch._check(bias.device == A.device, lambda: f"{op}: expected bias on {A.device} (A's device), got "
                     f"{bias.device}")
    return mode, out_shape, recipe


@torch.library.register_fake("ops::scaled_grouped_gemm")
def _scaled_grouped_gemm_fake(A, B, scale_a, scale_b, offs=None, bias=None, out_dtype=None):
    out_dtype = torch.bfloat16 if out_dtype is None else out_dtype
    _, shape, _ = _grouped_recipe("scaled_grouped_gemm", A, B, scale_a, scale_b, offs, bias, out_dtype)
    return A.new_empty(shape, dtype=out_dtype)


@torch.library.register_fake("ops::scaled_grouped_gemm.out")
def _scaled_grouped_gemm_out_fake(A, B, scale_a, scale_b, offs=None, bias=None, out_dtype=None, *, out):
    op = "scaled_grouped_gemm"
    origin = "out's dtype" if out_dtype is None else "out_dtype"
    out_dtype = out.dtype if out_dtype is None else out_dtype
    mode, shape, _ = _grouped_recipe(op, A, B, scale_a, scale_b, offs, bias, out_dtype, origin)
    _check_out(op, out, A, mode, shape, out_dtype, origin,
               {"A": A, "B": B, "offs": offs, "scale_a": scale_a, "scale_b": scale_b, "bias": bias})


_SCALED_GROUPED_GEMM = torch.ops.ops.scaled_grouped_gemm.default
_SCALED_GROUPED_GEMM_OUT = torch.ops.ops.scaled_grouped_gemm.out


def scaled_grouped_gemm(A: torch.Tensor, B: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                        offs: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                        out_dtype: Optional[torch.dtype] = None, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """FP8 grouped matrix product with scales: ``(A * scale_a) @ (B * scale_b) + bias`` per group, in
    ``torch._scaled_grouped_mm``'s modes and scales (the experts of FP8 mixture-of-experts models).

    Args:
        A, B: torch.float8_e4m3fn, in one of ``ops.grouped_gemm``'s modes (offs int32 cumulative group ends):

            * 2D x 3D: A (M, K) of tokens sorted by expert, B (G, K, N), offs (G,) over M; out (M, N), rows
              past offs[-1] zero. Expert weights stored (G, N, K) are passed as ``W.transpose(-2, -1)``.
            * 3D x 3D: A (G, M, K), B (G, K, N), no offs; out (G, M, N).
            * 3D x 2D: A (G, M, K), B (K, N), offs (G,) over N; out (M, N), columns past offs[-1] zero.
            * 2D x 2D: A (M, K), B (K, N), offs (G,) over K (the weight gradient); out (G, M, N).

            K and N multiples of 16; any strides.
        scale_a, scale_b: float32 factors that dequantize (value = code * scale), told apart by their shapes:

            * rowwise (one per row of A, one per column of each group's B): 2D x 3D (M,) and (G, N); 3D x 3D
              (G, M) and (G, N); 3D x 2D (G, M) and (N,); 2D x 2D (G * M,) and (G * N,), each group's own.
            * blockwise 1x128 x 128x128 (DeepSeek-V3's): 2D x 3D scale_a (M, K/128), one per 1x128 group of a
              row of A, scale_b (G, K/128, ceil(N/128)), one per 128x128 block of each B (a checkpoint's
              ``weight_scale_inv`` (G, ceil(N/128), K/128) transposed); 3D x 3D (G, M, K/128) and (G, K/128,
              ceil(N/128)). K a multiple of 128.
        offs: int32 cumulative group ends, required where A or B is 2-D. On CPU they are checked
            (non-negative, non-decreasing, at most the size they cut).
        bias: optional (G, N), or (N,) in 3D x 2D, of ``out_dtype``; added to each group's rows (not to the
            zero rows, or 3D x 2D columns, past offs[-1]).
        out_dtype: torch.bfloat16 (None: the default; with ``out``, out's dtype), torch.float16 or torch.float32.
        out: optional tensor of the output's shape and ``out_dtype`` to write into.

    Computation: ``scaled_gemm``'s formula on each group's slices: each code times its scale in float32, the
    product and the bias in float32, one rounding to ``out_dtype``. On CUDA, in a build with
    OPS_CANDIDATE_KERNELS=1 on an sm_90a device, 2D x 3D and 3D x 3D without bias run SM90 CUTLASS kernels
    (offs read on the device); otherwise ``torch._scaled_grouped_mm`` runs the rowwise recipe with bfloat16 out
    and no bias (every mode, under 1024 groups) on SM90, offs read on the device too; otherwise
    the same ATen formula runs on the device, the group ends copied to the host. None of them has run on a
    GPU. ``grouped_plan()`` says which path a call takes.

    Autograd: not differentiable (FP8 operands have no gradient): an argument that requires grad raises, one
    with a forward-mode tangent raises NotImplementedError.

    Raises:
        RuntimeError: dtypes, shapes, the mode's offs, scale shapes that are no recipe, K not a multiple of 128
            for the blockwise recipe, K or N not a multiple of 16, bias shape or dtype, devices, ``out`` of the
            wrong shape or dtype or overlapping an input (as ATen's overlap analysis decides; docs/gemm.md), an
            argument that requires grad.
    """
    if not torch.jit.is_scripting():
        if out is None:
            return _SCALED_GROUPED_GEMM(A, B, scale_a, scale_b, offs, bias, out_dtype)
        _SCALED_GROUPED_GEMM_OUT(A, B, scale_a, scale_b, offs, bias, out_dtype, out=out)
        return out
    if out is None:
        return torch.ops.ops.scaled_grouped_gemm(A, B, scale_a, scale_b, offs, bias, out_dtype)
    torch.ops.ops.scaled_grouped_gemm(A, B, scale_a, scale_b, offs, bias, out_dtype, out=out)
    return out


def grouped_plan(A: torch.Tensor, B: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                 offs: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                 out_dtype: Optional[torch.dtype] = None) -> dict:
    """The path ``scaled_grouped_gemm`` takes for these arguments, without running it: ``mode``, ``recipe``,
    ``path`` ("cutlass": an SM90 FP8 grouped kernel, named in ``kernel``, which is None on the other paths;
    "torch._scaled_grouped_mm"; or "formula"), ``host_sync`` and ``reason``. Raises as
    ``scaled_grouped_gemm`` does for bad arguments, but for offs' values, which only the call reads, and for
    inputs that require grad."""
    _check_plan_device("ops.fp8.grouped_plan", A)
    return json.loads(torch.ops.ops._scaled_grouped_gemm_plan(A, B, scale_a, scale_b, offs, bias, out_dtype))


def _quantize_over(t, dim, groups=None, group_of=None):
    """float8_e4m3fn codes of t and float32 scales (amax / 448) over dimension `dim`; with `group_of` (each row's
    group, `groups` of them: rows past the last group have group `groups`), one scale per group and column."""
    # A local literal: with dynamic=True, Dynamo lifts a module-level float read in an autograd.Function's
    # forward as an input, and a second call in one graph fails ("lift_tracked_freevar_to_input should not
    # be called on root SubgraphTracer", torch 2.14).
    e4m3_max = 448.0
    a = t.detach().float().abs()
    if group_of is None:
        scale = a.amax(dim)
        expanded = scale.unsqueeze(dim)
    else:
        index = group_of.unsqueeze(1).expand_as(a)
        scale = a.new_zeros(groups + 1, t.shape[1]).scatter_reduce_(0, index, a, "amax")[:groups]
        expanded = torch.cat([scale, scale.new_ones(1, t.shape[1])])[group_of]
    scale = scale.clamp(min=torch.finfo(torch.float32).tiny) / e4m3_max
    expanded = expanded.clamp(min=torch.finfo(torch.float32).tiny) / e4m3_max
    codes = (t.detach().float() / expanded).clamp(-e4m3_max, e4m3_max).to(torch.float8_e4m3fn)
    return codes, scale


class _Fp8GroupedMm(torch.autograd.Function):
    """fp8_grouped_mm's forward and backward (torchao's float8 MoE training recipe, rowwise). The backward
    quantizes its inputs, so it has no derivative of its own: differentiating it raises (once_differentiable)."""

    @staticmethod
    def forward(x, w, offs):
        xq, xs = _quantize_over(x, 1)  # (M, K), (M,)
        wq, ws = _quantize_over(w, 2)  # (G, N, K), (G, N)
        return scaled_grouped_gemm(xq, wq.transpose(1, 2), xs, ws, offs, out_dtype=x.dtype)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        x, w, offs = ctx.saved_tensors
        grad_x = grad_w = None
        gq, gs = _quantize_over(grad_out, 1)  # per token, over N
        if ctx.needs_input_grad[0]:
            wq, ws = _quantize_over(w, 1)  # per expert and column of w_g (N, K): over N
            grad_x = scaled_grouped_gemm(gq, wq, gs, ws, offs, out_dtype=x.dtype)
        if ctx.needs_input_grad[1]:
            # Per expert: grad_out_g^T (N, M_g) @ x_g (M_g, K), the 2D x 2D form over M; each expert's own scales
            # per channel of grad_out and of x. M padded with rows of no group to a multiple of 16.
            G, M = w.shape[0], x.shape[0]
            rows = torch.arange(M, device=x.device)
            group_of = torch.searchsorted(offs, rows.to(offs.dtype), right=True)
            pad = -M % 16
            g_pad = torch.nn.functional.pad(grad_out, (0, 0, 0, pad))
            x_pad = torch.nn.functional.pad(x, (0, 0, 0, pad))
            group_of = torch.nn.functional.pad(group_of, (0, pad), value=G)
            aq, a_s = _quantize_over(g_pad, 0, G, group_of)  # (M', N), (G, N)
            bq, b_s = _quantize_over(x_pad, 0, G, group_of)  # (M', K), (G, K)
            grad_w = scaled_grouped_gemm(aq.t(), bq, a_s.reshape(-1), b_s.reshape(-1), offs, out_dtype=w.dtype)
        return grad_x, grad_w, None


def fp8_grouped_mm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """The experts' projection of mixture-of-experts training in FP8: ``x_g @ w_g^T`` for each expert g, x (M, K)
    of tokens sorted by expert (offs: int32 cumulative ends of the experts' rows), w (G, N, K) the experts'
    weights, both float32, bfloat16 or float16; returns (M, N) in x's dtype, rows past offs[-1] zero.

    torchao's float8 MoE recipe, rowwise: x is quantized per token and w per expert and output channel
    (float8_e4m3fn, dynamic scales amax / 448), then ``scaled_grouped_gemm``. The backward quantizes the
    gradient the same way: grad_x = grad_out_g @ w_g (grad_out per token, w per expert and input channel),
    grad_w = grad_out_g^T @ x_g in the 2D x 2D form over the tokens (each expert's own scale per channel of
    grad_out and of x). K and N multiples of 16. Gradients match the float formula within FP8's rounding
    (tests/test_scaled_grouped_gemm.py); they have no derivative (a double backward raises).
    """
    _check_fp8_grouped_mm(x, w, offs)
    return _Fp8GroupedMm.apply(x, w, offs)


def _check_fp8_grouped_mm(x, w, offs):
    """Plain raises, not torch._check: Dynamo cannot trace a message closure over tensors."""
    op, floats = "fp8_grouped_mm", (torch.float32, torch.bfloat16, torch.float16)
    for name, t, dims, shape in (("x", x, 2, "(M, K)"), ("w", w, 3, "(G, N, K)"), ("offs", offs, 1, "(G,)")):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: expected {name} to be a tensor of shape {shape}, got {type(t).__name__}")
        if t.dim() != dims:
            raise RuntimeError(f"{op}: expected {name} of shape {shape}, got {tuple(t.shape)}")
    for name, t in (("x", x), ("w", w)):
        if t.dtype not in floats:
            raise RuntimeError(f"{op}: expected {name}'s dtype to be torch.float32, torch.bfloat16 or torch.float16 "
                               f"(it is quantized to FP8 here), got {t.dtype}")
    if offs.dtype != torch.int32:
        raise RuntimeError(f"{op}: expected offs of dtype torch.int32, got {offs.dtype}")
    if x.shape[1] != w.shape[2]:
        raise RuntimeError(f"{op}: expected x (M, K) and w (G, N, K) of the same K, got x of shape "
                           f"{tuple(x.shape)} and w of shape {tuple(w.shape)}")
    if offs.shape[0] != w.shape[0]:
        raise RuntimeError(f"{op}: expected offs of one end per expert, {w.shape[0]} (w's G), got {offs.shape[0]}")
    if x.shape[1] % 16 or w.shape[1] % 16:
        raise RuntimeError(f"{op}: expected K and N to be multiples of 16 (the FP8 tensor cores' 16-byte rows), got "
                           f"x of shape {tuple(x.shape)} and w of shape {tuple(w.shape)}")
    for name, t in (("w", w), ("offs", offs)):
        if t.device != x.device:
            raise RuntimeError(f"{op}: expected {name} on x's device, {x.device}, got {t.device}")
    if offs.device.type == "cpu" and not torch.compiler.is_compiling():
        # On CUDA offs go to scaled_grouped_gemm as they are: reading them here would synchronize.
        ends = offs.tolist()
        if any(e < 0 or e > x.shape[0] for e in ends) or any(a > b for a, b in zip(ends, ends[1:])):
            raise RuntimeError(f"{op}: expected offs to be non-decreasing ends of the experts' rows of x, at most "
                               f"M = {x.shape[0]}, got {ends}")


_GRANULARITIES = ("tensor", "row", "group", "block")
ROW_GRANULARITIES = ("row", "group")  # each scale is one row's own: rows may be split (sharded, batched)


def _scale_shape(shape, granularity):
    if granularity == "tensor":
        return ()
    if granularity == "row":
        return (*shape[:-1], 1)
    if granularity == "group":
        return (*shape[:-1], -(-shape[-1] // BLOCK))
    return (-(-shape[0] // BLOCK), -(-shape[1] // BLOCK))


@torch.library.register_fake("ops::quantize_fp8")
def _quantize_fp8_fake(input, granularity="row", dtype=None, scale=None, pow2_scale=False):
    return _quantize_as("quantize_fp8", input, granularity, dtype, scale, pow2_scale)


def _quantize_as(op, input, granularity, dtype, scale, pow2_scale, whole=None):
    """csrc/quantize_fp8.cpp's check_quantize_fp8 for fake tensors: (codes, scale) of input's shape. ``whole``:
    silu_and_mul_fp8's input, whose halves' product is ``input``."""
    def quantized():  # formatted only when a check fails
        return (f"input of shape {list(input.shape)}" if whole is None else
                f"input of shape {list(whole.shape)} (silu(gate) * up: {list(input.shape)})")

    torch._check(input.dim() >= 1, lambda: f"{op}: expected input of shape (..., K), got a 0-D tensor")
    torch._check(input.dtype in _library.GEMM_DTYPES, lambda: f"{op}: expected input's dtype to be "
                 f"{_library.GEMM_DTYPES_TEXT}, got {input.dtype}")
    torch._check_value(granularity in _GRANULARITIES, lambda: f'{op}: expected granularity to be one of "tensor", '
                       f'"row", "group" (1x128), "block" (128x128), got "{granularity}"')
    torch._check(granularity != "block" or input.dim() == 2, lambda: f'{op}: granularity "block" (128x128) takes a '
                 f"2-D matrix, got {quantized()}")
    dtype = torch.float8_e4m3fn if dtype is None else dtype
    torch._check(dtype in _FP8, lambda: f"{op}: expected dtype to be torch.float8_e4m3fn or torch.float8_e5m2, "
                 f"got {dtype}")
    shape = _scale_shape(input.shape, granularity)
    if scale is not None:
        torch._check(not pow2_scale, lambda: f"{op}: pow2_scale rounds computed scales; a given scale is used as it is")
        torch._check(scale.dtype == torch.float32, lambda: f"{op}: expected scale to be torch.float32, got {scale.dtype}")
        torch._check(scale.device == input.device, lambda: f"{op}: expected scale on {input.device} (input's device), "
                     f"got {scale.device}")
        torch._check(tuple(scale.shape) == tuple(shape) or (granularity == "tensor" and scale.numel() == 1),
                     lambda: f'{op}: expected scale of shape {list(shape)} for granularity "{granularity}" and '
                     f"{quantized()}, got {list(scale.shape)}")
    return (input.new_empty(input.shape, dtype=dtype), input.new_empty(shape, dtype=torch.float32))


def quantize_fp8(input: torch.Tensor, granularity: str = "row", dtype: Optional[torch.dtype] = None,
                 scale: Optional[torch.Tensor] = None, pow2_scale: bool = False):
    """FP8 codes of ``input`` and their float32 scales (value = code * scale), as ``ops.scaled_gemm`` takes them.

    Args:
        input: (..., K) float16, bfloat16, float32 or float64.
        granularity: one scale per "tensor" (shape ()), "row" (..., 1) (per token), "group" (..., ceil(K/128))
            (per 1x128 group of a row: blockwise scale_a) or "block" (ceil(R/128), ceil(C/128)) (per 128x128
            block of a 2-D weight).
        dtype: torch.float8_e4m3fn (None: the default; max 448) or torch.float8_e5m2 (max 57344).
        scale: a given (static) scale of the granularity's shape; None: computed from the data.
        pow2_scale: round each computed scale up to a power of two (torchao's rowwise recipe: exact
            rescaling, no mantissa error in the scale).

    Returns:
        (codes, scale). Computed scales are amax / max(dtype) over each group in float32, at least
        1e-12 / max(dtype) (an all-zero group gives zero codes); codes are input / scale in float32 (float64
        input rounded to float32 first), clamped to +-max(dtype), rounded once. Not differentiable: an input
        that requires grad raises.

    Numerics (docs/numerics.md): the code is the float32 quotient ``x / scale``; vLLM's quantization
    kernels multiply by the float32 reciprocal ``1 / scale`` instead, which rounds twice and lands one
    FP8 step away where x / scale sits on (or within a float32 rounding of) a midpoint between two codes
    (e4m3, row scales: 312 of 1,048,576 bfloat16 values, 62 float16, none float32).
    """
    return torch.ops.ops.quantize_fp8(input, granularity, dtype, scale, pow2_scale)


# ---- Fused forms: quantize_fp8 of what rms_norm, fused_add_rms_norm and silu_and_mul compute --------


@torch.library.register_fake("ops::rms_norm_fp8")
def _rms_norm_fp8_fake(input, weight, eps=1e-6, granularity="row", dtype=None, scale=None, pow2_scale=False, *,
                       round_before_weight=False):
    _fused._check_norm("rms_norm_fp8", input, weight)
    return _quantize_as("rms_norm_fp8", input, granularity, dtype, scale, pow2_scale)


@torch.library.register_fake("ops::fused_add_rms_norm_fp8")
def _fused_add_rms_norm_fp8_fake(input, residual, weight, eps=1e-6, granularity="row", dtype=None, scale=None,
                                 pow2_scale=False, *, round_before_weight=False):
    op = "fused_add_rms_norm_fp8"
    _fused._check_norm(op, input, weight)
    _fused._check_residual(op, input, residual)
    _overlap.check_written_in_place(op, "residual", residual)
    _overlap.check_no_shared_memory(op, "residual", residual, "input", input)
    _overlap.check_no_shared_memory(op, "residual", residual, "weight", weight)
    return _quantize_as(op, input, granularity, dtype, scale, pow2_scale)


@torch.library.register_fake("ops::silu_and_mul_fp8")
def _silu_and_mul_fp8_fake(input, granularity="row", dtype=None, scale=None, pow2_scale=False):
    op = "silu_and_mul_fp8"
    _fused._check_silu_and_mul(op, input)
    half = input.new_empty((*input.shape[:-1], input.shape[-1] // 2))
    return _quantize_as(op, half, granularity, dtype, scale, pow2_scale, whole=input)


def rms_norm_fp8(input, weight, eps=1e-6, granularity="row", dtype=None, scale=None, pow2_scale=False,
                 round_before_weight=False):
    """``quantize_fp8(rms_norm(input, weight, eps, round_before_weight=...), granularity, dtype, scale,
    pow2_scale)`` in one op: the norm rounded to input's dtype, then its FP8 codes and scales (those of the
    two ops, exactly). With ``round_before_weight=True`` the codes are those of quantizing Llama's or vLLM's
    native norm, bit for bit on CPU for float16, bfloat16 and float32 (docs/numerics.md); by default, those
    of quantizing ``F.rms_norm``."""
    return torch.ops.ops.rms_norm_fp8(input, weight, eps, granularity, dtype, scale, pow2_scale,
                                      round_before_weight=round_before_weight)


def fused_add_rms_norm_fp8(input, residual, weight, eps=1e-6, granularity="row", dtype=None, scale=None,
                           pow2_scale=False, round_before_weight=False):
    """``residual += input`` in place (the residual stream goes on, rounded to its dtype), then
    ``rms_norm_fp8(residual, ...)`` of that stored value; input is not written (unlike
    ``fused_add_rms_norm``)."""
    return torch.ops.ops.fused_add_rms_norm_fp8(input, residual, weight, eps, granularity, dtype, scale, pow2_scale,
                                                round_before_weight=round_before_weight)


def silu_and_mul_fp8(input, granularity="row", dtype=None, scale=None, pow2_scale=False):
    """``quantize_fp8(silu_and_mul(input), ...)`` in one op: the down projection's FP8 input."""
    return torch.ops.ops.silu_and_mul_fp8(input, granularity, dtype, scale, pow2_scale)
