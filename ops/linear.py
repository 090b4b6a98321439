"""``ops.linear``: act(x @ weight^T + bias), the fused linear layer. Python API, fake kernel, autograd.
Schema in csrc/registration.cpp; CPU kernel cutlass_gemm/dense/linear_cpu.cpp; CUDA kernel cutlass_gemm/dense/linear_cuda.cpp
(a CUTLASS GEMM with bias + activation fused into its epilogue for float16/bfloat16)."""

import functools
from typing import Optional

import torch
import torch.nn.functional as F

from . import _library  # loads the op library
from ._library import ACTIVATIONS, GEMM_DTYPES as _GEMM_DTYPES

__all__ = ["linear", "ACTIVATIONS", "ACTIVATION_FUNCTIONS"]

# What each activation computes, as PyTorch spells it: the reference of the fused kernels, the formula
# ops.compile rewrites, the baseline of the benchmarks. Keyed by the library's table (csrc/activation.h).
ACTIVATION_FUNCTIONS = {"none": lambda x: x, "relu": F.relu, "gelu": F.gelu,
                        "gelu_tanh": functools.partial(F.gelu, approximate="tanh"), "silu": F.silu}
if tuple(ACTIVATION_FUNCTIONS) != ACTIVATIONS:
    raise ImportError(f"ops.linear: ACTIVATION_FUNCTIONS names {tuple(ACTIVATION_FUNCTIONS)}, the library's "
                      f"table {ACTIVATIONS} (csrc/activation.h): give every activation its formula")


def _check_activation(op, activation):
    """csrc/activation_ops.cpp's parse_activation, for fake kernels."""
    torch._check_value(activation in ACTIVATIONS, lambda: f"{op}: expected activation to be one of "
                       + ", ".join(f'"{a}"' for a in ACTIVATIONS) + f', got "{activation}"')


@torch.library.register_fake("ops::linear")
def _linear_fake(input, weight, bias=None, activation="none"):
    torch._check(input.dim() >= 1, lambda: "linear: expected input of shape (..., in_features), got a 0-D tensor")
    torch._check(input.dtype in _GEMM_DTYPES, lambda: "linear: expected input's dtype to be "
                 f"{_library.GEMM_DTYPES_TEXT}, got {input.dtype}")
    torch._check(weight.dim() == 2 and weight.shape[1] == input.shape[-1],
                 lambda: "linear: expected weight of shape (out_features, in_features) with in_features = "
                 f"{input.shape[-1]} (input's last dimension), got {list(weight.shape)}")
    torch._check(weight.dtype == input.dtype, lambda: f"linear: expected weight's dtype to be {input.dtype} "
                 f"(input's dtype), got {weight.dtype}")
    torch._check(weight.device == input.device, lambda: "linear: input and weight must be on the same device, "
                 f"got input on {input.device} and weight on {weight.device}")
    if bias is not None:
        torch._check(bias.dim() == 1 and bias.shape[0] == weight.shape[0],
                     lambda: f"linear: expected bias of shape (out_features,) = ({weight.shape[0]},), got "
                     f"{list(bias.shape)}")
        torch._check(bias.dtype == input.dtype, lambda: f"linear: expected bias's dtype to be {input.dtype} "
                     f"(input's dtype), got {bias.dtype}")
        torch._check(bias.device == input.device, lambda: f"linear: expected bias on {input.device} "
                     f"(input's device), got {bias.device}")
    _check_activation("linear", activation)
    return torch.empty((*input.shape[:-1], weight.shape[0]), dtype=input.dtype, device=input.device)


# Autograd: registered in C++ (csrc/autograd.cpp, LinearBackward): no Python on the call path, forward
# and reverse mode, torch.func transforms, C++ programs.


def linear(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
           activation: str = "none") -> torch.Tensor:
    """``act(input @ weight.T + bias)``: ``torch.nn.functional.linear`` followed by an activation, in one
    kernel on CUDA for float16 and bfloat16.

    Args:
        input: (..., in_features); float16, bfloat16, float32 or float64.
        weight: (out_features, in_features), an ``nn.Linear`` weight; same dtype and device.
        bias: optional (out_features,).
        activation: "none", "relu", "gelu" (erf, ``F.gelu``), "gelu_tanh" (``F.gelu(approximate="tanh")``)
            or "silu".

    Returns:
        A new contiguous (..., out_features) tensor.

    On CUDA, float16/bfloat16 run a CUTLASS GEMM (SM90 warp-specialized on Hopper, SM80 on Ampere/Ada)
    whose epilogue adds the bias and applies the activation in float32 before the single rounding to the
    output dtype; float32/float64 run ``cutlass_gemm``'s path (ATen on Hopper for float32 without TF32 and
    float64), then bias and activation as separate ATen ops. None of it has run on a GPU. On CPU: ATen's
    linear (addmm) plus the activation. The two agree to the output's rounding, except where a
    float16/bfloat16 pre-activation lies beyond the dtype's range: CPU (like ``F.linear`` + activation)
    rounds it to +-inf first, so gelu/gelu_tanh/silu of -inf give NaN, while the fused CUDA epilogue applies
    the activation to the float32 value, by its formula -0.

    Autograd (registered in C++): differentiable in input, weight and bias, in reverse mode (backward
    recomputes the pre-activation with this op, applies ATen's activation derivative in float32 (float64
    for float64), and
    uses ``cutlass_gemm`` on transposed views; double backward works) and forward mode. Saved for
    backward: without an activation, what ``F.linear`` saves (input only if weight needs a gradient,
    weight only if input does); with one, input, weight and bias (to recompute the pre-activation
    instead of keeping an (..., out_features) tensor), so modifying them in place between forward and
    backward is autograd's "modified by an inplace operation" error.

    Raises:
        RuntimeError: shapes that do not chain ((..., K) with (N, K) and (N,)), dtypes that differ or are
            not one of the four above, tensors on different devices, a tensor that is not dense and strided (sparse,
            nested, quantized). ValueError: an unknown activation.
    """
    # The overload packet: its one overload matches at once, as fast as .default (benchmarks/host_cost.py).
    return torch.ops.ops.linear(input, weight, bias, activation)
