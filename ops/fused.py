"""Fused ops for real models: ``rms_norm``, ``fused_add_rms_norm``, ``silu_and_mul``. Python API and fake
kernels; schemas in csrc/registration.cpp, autograd in csrc/autograd.cpp, CPU kernels in
csrc/fused_cpu.cpp, CUDA kernels in csrc/fused_kernels.cu."""

import torch

from . import _library  # loads the op library
from . import _nested, _overlap
from ._library import GEMM_DTYPES as _DTYPES  # the floating dtypes every op accepts

__all__ = ["rms_norm", "fused_add_rms_norm", "silu_and_mul"]


def _check_floating(op, name, t):
    torch._check(t.dtype in _DTYPES, lambda: f"{op}: expected {name}'s dtype to be {_library.GEMM_DTYPES_TEXT}, "
                 f"got {t.dtype}")


def _check_residual(op, input, residual):
    """The C++ kernels' check_same_as, message for message."""
    torch._check(residual.shape == input.shape, lambda: f"{op}: expected residual of input's "
                 f"shape {list(input.shape)}, got {list(residual.shape)}")
    torch._check(residual.dtype == input.dtype, lambda: f"{op}: expected residual's dtype to be "
                 f"{input.dtype} (input's dtype), got {residual.dtype}")
    torch._check(residual.device == input.device, lambda: f"{op}: expected residual on "
                 f"{input.device} (input's device), got {residual.device}")


def _check_silu_and_mul(op, input):
    torch._check(input.dim() >= 1, lambda: f"{op}: expected input of shape (..., 2 * d), got a 0-D tensor")
    _check_floating(op, "input", input)
    torch._check(input.shape[-1] % 2 == 0, lambda: f"{op}: expected input's last dimension to be even "
                 f"(2 * d: the gate half, then the up half), got {input.shape[-1]}")


def _check_eps_tensor(op, eps):  # the _tensor_eps norms read eps on the host
    torch._check(eps.dim() == 0 and eps.device.type == "cpu" and eps.dtype.is_floating_point,
                 lambda: f"{op}: expected eps to be a 0-d floating tensor on the CPU, got "
                         f"{eps.dtype} of shape {list(eps.shape)} on {eps.device}")


def _check_norm(op, input, weight):
    torch._check(input.dim() >= 1, lambda: f"{op}: expected input of shape (..., hidden), got a 0-D tensor")
    _check_floating(op, "input", input)
    torch._check(weight.dim() == 1 and weight.shape[0] == input.shape[-1],
                 lambda: f"{op}: expected weight of shape (hidden,) = ({input.shape[-1]},) matching input's "
                 f"last dimension, got {list(weight.shape)}")
    torch._check(weight.dtype == input.dtype, lambda: f"{op}: expected weight's dtype to be {input.dtype} "
                 f"(input's dtype), got {weight.dtype}")
    torch._check(weight.device == input.device, lambda: f"{op}: input and weight must be on the same device, "
                 f"got input on {input.device} and weight on {weight.device}")


# ---- rms_norm ----------------------------------------------------------------------------------------

@torch.library.register_fake("ops::rms_norm")
def _rms_norm_fake(input, weight, eps=1e-6, *, round_before_weight=False):
    _check_norm("rms_norm", input, weight)
    return torch.empty(input.shape, dtype=input.dtype, device=input.device)


@torch.library.register_fake("ops::_rms_norm_tensor_eps")
def _rms_norm_tensor_eps_fake(input, weight, eps, *, round_before_weight=False):
    _check_norm("_rms_norm_tensor_eps", input, weight)
    _check_eps_tensor("_rms_norm_tensor_eps", eps)
    return torch.empty(input.shape, dtype=input.dtype, device=input.device)


# Autograd of rms_norm and silu_and_mul: registered in C++ (csrc/autograd.cpp), reverse and forward
# mode, no Python on the call path.


def rms_norm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
             round_before_weight: bool = False) -> torch.Tensor:
    """Root-mean-square layer norm (Zhang & Sennrich, 2019), as in Llama / T5:
    ``y = x / sqrt(mean(x^2, -1) + eps) * weight``.

    Args:
        input: (..., hidden), float16, bfloat16, float32 or float64; any strides (non-contiguous inputs
            are copied to contiguous rows first).
        weight: (hidden,), same dtype and device.
        eps: added to the mean square, as in ``torch.nn.functional.rms_norm``.
        round_before_weight: round ``x / sqrt(mean(x^2) + eps)`` to input's dtype before the weight
            multiply (then round the product), as transformers' ``LlamaRMSNorm`` and vLLM's
            ``RMSNorm.forward_native`` do. False: one rounding, as ``F.rms_norm``. The two differ only for
            float16 and bfloat16.

    Returns:
        A new contiguous tensor of input's shape and dtype. Statistics are computed in float32 (float64
        for float64 inputs).

    Numerics (docs/numerics.md): on CPU the sum of squares adds in the order torch's own sum does, so for
    an input whose rows are contiguous the result is ``F.rms_norm(input, (hidden,), weight, eps)`` bit for
    bit (other inputs are copied to contiguous rows first: the bits of ``input.contiguous()``), and with
    ``round_before_weight``
    ``weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(input.dtype)`` with
    ``x = input.float()`` (Llama's formula) bit for bit, for every dtype but float64 (which that formula
    computes in float32). On CUDA the sum runs in another order: within an ulp of those (not run on a GPU).

    Autograd (registered in C++): differentiable in input and weight, in reverse mode (double backward
    too) and forward mode; gradients computed in float32 for half types.

    Raises:
        RuntimeError: a 0-D input, weight not of shape (hidden,), dtypes that differ or are not floating,
            tensors on different devices, a tensor that is not dense and strided (sparse, nested, quantized).
    """
    # Jagged nested tensors: their __torch_function__ takes any "rms_norm" for torch's (ops/_nested.py).
    if not torch.jit.is_scripting() and not (isinstance(input, torch.Tensor) and isinstance(weight, torch.Tensor)):
        # its checks name the argument that is not a tensor
        return torch.ops.ops.rms_norm(input, weight, eps, round_before_weight=round_before_weight)
    if input.is_nested or weight.is_nested:
        raise RuntimeError(_nested.message("rms_norm", "input" if input.is_nested else "weight"))
    return torch.ops.ops.rms_norm(input, weight, eps, round_before_weight=round_before_weight)


# ---- fused_add_rms_norm --------------------------------------------------------------------------------

@torch.library.register_fake("ops::fused_add_rms_norm")
def _fused_add_rms_norm_fake(input, residual, weight, eps=1e-6, *, round_before_weight=False):
    _check_fused_add("fused_add_rms_norm", input, residual, weight)


def _check_fused_add(op, input, residual, weight):
    _check_norm(op, input, weight)
    _check_residual(op, input, residual)
    _overlap.check_written_in_place(op, "input", input)
    _overlap.check_written_in_place(op, "residual", residual)
    _overlap.check_no_shared_memory(op, "input", input, "residual", residual)
    _overlap.check_no_shared_memory(op, "input", input, "weight", weight)
    _overlap.check_no_shared_memory(op, "residual", residual, "weight", weight)

@torch.library.register_fake("ops::_fused_add_rms_norm_tensor_eps")
def _fused_add_rms_norm_tensor_eps_fake(input, residual, weight, eps, *, round_before_weight=False):
    _check_fused_add("_fused_add_rms_norm_tensor_eps", input, residual, weight)
    _check_eps_tensor("_fused_add_rms_norm_tensor_eps", eps)


def fused_add_rms_norm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float = 1e-6, round_before_weight: bool = False) -> None:
    """The pre-norm transformer step, in place: ``residual += input``, then
    ``input = rms_norm(residual, weight, eps)``. Both tensors are mutated (declared ``Tensor(a!)`` and
    ``Tensor(b!)`` in the schema); nothing is returned.

    Args:
        input: (..., hidden) float16, bfloat16, float32 or float64; receives the normalised values.
        residual: same shape, dtype and device; receives input + residual (rounded to its dtype, and the
            normalisation is computed from that stored value).
        weight: (hidden,).
        eps: as in rms_norm.
        round_before_weight: as in rms_norm.

    Numerics: the residual is ``input + residual`` in their dtype (one addition, rounded), as
    transformers' decoder layers add it, and input becomes ``rms_norm(residual, weight, eps,
    round_before_weight=...)`` of that stored value, bit for bit on CPU (docs/numerics.md).

    Autograd: an inference op. An argument that requires grad (grad mode on) raises, one with a
    forward-mode tangent raises NotImplementedError.

    Raises:
        RuntimeError: mismatched shapes, dtypes or devices; non-floating dtypes; grad-requiring inputs;
            input or residual with internally overlapping memory (expanded), or input, residual and
            weight sharing memory (the in-place writes would depend on their order; also through two
            storages over one buffer, e.g. torch.from_numpy of one array twice, in eager mode: a compiled
            graph checks fake tensors, which have no memory to compare); input or residual a negative
            view (``z.conj().imag``); a tensor that is not dense and strided.
    """
    torch.ops.ops.fused_add_rms_norm(input, residual, weight, eps, round_before_weight=round_before_weight)


# ---- silu_and_mul --------------------------------------------------------------------------------------

@torch.library.register_fake("ops::silu_and_mul")
def _silu_and_mul_fake(input):
    _check_silu_and_mul("silu_and_mul", input)
    return torch.empty((*input.shape[:-1], input.shape[-1] // 2), dtype=input.dtype, device=input.device)


def silu_and_mul(input: torch.Tensor) -> torch.Tensor:
    """The SwiGLU gate of Llama-style MLPs (Shazeer, 2020): ``silu(x[..., :d]) * x[..., d:]`` for x of shape
    (..., 2 * d), where ``silu(a) = a * sigmoid(a)``.

    Args:
        input: (..., 2 * d), float16, bfloat16, float32 or float64; the gate half first, then the up half
            (the layout of a fused gate_up projection).

    Returns:
        A new contiguous (..., d) tensor; computed in float32 (float64 for float64 inputs), rounded once.

    Numerics (docs/numerics.md): on CPU, for an input whose rows are contiguous (others are copied to
    contiguous rows first), each element is what ``F.silu(a) * b`` computes for float32 and float64
    (``a, b = input[..., :d], input[..., d:]``), bit for bit: ATen's silu takes a vectorised
    exp for most elements and the scalar one for the rest of each run, and this op makes the same
    choice per element. For float16 and bfloat16 it is that float32 formula on ``input.float()``,
    rounded once, bit for bit (``F.silu(a) * b`` in those dtypes rounds silu(a) first).

    Autograd (registered in C++): differentiable in reverse mode (double backward too) and forward mode.

    Raises:
        RuntimeError: a 0-D input, an odd last dimension, a non-floating dtype, a tensor that is not
            dense and strided (sparse, nested, quantized).
    """
    return torch.ops.ops.silu_and_mul(input)
