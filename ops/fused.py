"""Fused ops for real models: ``rms_norm``, ``fused_add_rms_norm``, ``silu_and_mul``. Python API and fake
kernels; schemas in csrc/registration.cpp, autograd in csrc/autograd.cpp, CPU kernels in
csrc/fused_cpu.cpp, CUDA kernels in csrc/fused_kernels.cu."""

import torch

from . import _library  # loads the op library
from . import _nested, _overlap
from ._library import GEMM_DTYPES as _DTYPES  # the floating dtypes every op accepts


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
def _rms_norm_fake(input, weight, eps=1e-6):
    _check_norm("rms_norm", input, weight)
    return torch.empty(input.shape, dtype=input.dtype, device=input.device)


@torch.library.register_fake("ops::_rms_norm_tensor_eps")
def _rms_norm_tensor_eps_fake(input, weight, eps):
    _check_norm("_rms_norm_tensor_eps", input, weight)
    torch._check(eps.dim() == 0 and eps.device.type == "cpu" and eps.dtype.is_floating_point,
                 lambda: f"_rms_norm_tensor_eps: expected eps to be a 0-d floating tensor on the CPU, got "
                         f"{eps.dtype} of shape {list(eps.shape)} on {eps.device}")
    return torch.empty(input.shape, dtype=input.dtype, device=input.device)


# Autograd of rms_norm and silu_and_mul: registered in C++ (csrc/autograd.cpp), reverse and forward
# mode, no Python on the call path.


def rms_norm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Root-mean-square layer norm (Zhang & Sennrich, 2019), as in Llama / T5:
    ``y = x / sqrt(mean(x^2, -1) + eps) * weight``.

    Args:
        input: (..., hidden), float16, bfloat16, float32 or float64; any strides (non-contiguous inputs
            are copied to contiguous rows first).
        weight: (hidden,), same dtype and device.
        eps: added to the mean square, as in ``torch.nn.functional.rms_norm``.

    Returns:
        A new contiguous tensor of input's shape and dtype. Statistics are computed in float32 (float64
        for float64 inputs) and the result is rounded once.

    Autograd (registered in C++): differentiable in input and weight, in reverse mode (double backward
    too) and forward mode; gradients computed in float32 for half types.

    Raises:
        RuntimeError: a 0-D input, weight not of shape (hidden,), dtypes that differ or are not floating,
            tensors on different devices, a tensor that is not dense and strided (sparse, nested, quantized).
    """
    # Jagged nested tensors: their __torch_function__ takes any "rms_norm" for torch's (ops/_nested.py).
    if not torch.jit.is_scripting() and not (isinstance(input, torch.Tensor) and isinstance(weight, torch.Tensor)):
        return torch.ops.ops.rms_norm(input, weight, eps)  # its checks name the argument that is not a tensor
    if input.is_nested or weight.is_nested:
        raise RuntimeError(_nested.message("rms_norm", "input" if input.is_nested else "weight"))
    return torch.ops.ops.rms_norm(input, weight, eps)


# ---- fused_add_rms_norm --------------------------------------------------------------------------------

@torch.library.register_fake("ops::fused_add_rms_norm")
def _fused_add_rms_norm_fake(input, residual, weight, eps=1e-6):
    _check_norm("fused_add_rms_norm", input, weight)
    _check_residual("fused_add_rms_norm", input, residual)
    _overlap.check_written_in_place("fused_add_rms_norm", "input", input)
    _overlap.check_written_in_place("fused_add_rms_norm", "residual", residual)
    _overlap.check_no_shared_memory("fused_add_rms_norm", "input", input, "residual", residual)
    _overlap.check_no_shared_memory("fused_add_rms_norm", "input", input, "weight", weight)
    _overlap.check_no_shared_memory("fused_add_rms_norm", "residual", residual, "weight", weight)

def fused_add_rms_norm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float = 1e-6) -> None:
    """The pre-norm transformer step, in place: ``residual += input``, then
    ``input = rms_norm(residual, weight, eps)``. Both tensors are mutated (declared ``Tensor(a!)`` and
    ``Tensor(b!)`` in the schema); nothing is returned.

    Args:
        input: (..., hidden) float16, bfloat16, float32 or float64; receives the normalised values.
        residual: same shape, dtype and device; receives input + residual (rounded to its dtype, and the
            normalisation is computed from that stored value).
        weight: (hidden,).
        eps: as in rms_norm.

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
    torch.ops.ops.fused_add_rms_norm(input, residual, weight, eps)


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
        A new contiguous (..., d) tensor; computed in float32 (float64 for float64 inputs).

    Autograd (registered in C++): differentiable in reverse mode (double backward too) and forward mode.

    Raises:
        RuntimeError: a 0-D input, an odd last dimension, a non-floating dtype, a tensor that is not
            dense and strided (sparse, nested, quantized).
    """
    return torch.ops.ops.silu_and_mul(input)
