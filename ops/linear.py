"""``ops.linear``: act(x @ weight^T + bias), the fused linear layer. Python API, fake kernel, autograd.
Schema in csrc/registration.cpp; CPU kernel csrc/linear_cpu.cpp; CUDA kernel cutlass_gemm/linear_cuda.cpp
(a CUTLASS GEMM with bias + activation fused into its epilogue for float16/bfloat16)."""

import math
from typing import Optional

import torch

from . import _library  # noqa: F401  (loads the op library)
from .gemm import _GEMM_DTYPES

ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh", "silu")


@torch.library.register_fake("ops::linear")
def _linear_fake(input, weight, bias=None, activation="none"):
    torch._check(input.dim() >= 1, lambda: "linear: expected input of shape (..., in_features), got a 0-D tensor")
    torch._check(input.dtype in _GEMM_DTYPES, lambda: "linear: expected input's dtype to be float16, bfloat16, "
                 f"float32 or float64, got {input.dtype}")
    torch._check(weight.dim() == 2 and weight.shape[1] == input.shape[-1],
                 lambda: "linear: expected weight of shape (out_features, in_features) with in_features = "
                 f"{input.shape[-1]} (input's last dimension), got {list(weight.shape)}")
    torch._check(weight.dtype == input.dtype, lambda: f"linear: expected weight's dtype to be {input.dtype} "
                 f"(input's dtype), got {weight.dtype}")
    if bias is not None:
        torch._check(bias.dim() == 1 and bias.shape[0] == weight.shape[0],
                     lambda: f"linear: expected bias of shape (out_features,) = ({weight.shape[0]},), got "
                     f"{list(bias.shape)}")
        torch._check(bias.dtype == input.dtype, lambda: f"linear: expected bias's dtype to be {input.dtype} "
                     f"(input's dtype), got {bias.dtype}")
    torch._check(activation in ACTIVATIONS, lambda: f"linear: expected activation to be one of "
                 f"{', '.join(repr(a) for a in ACTIVATIONS)}, got {activation!r}")
    return torch.empty((*input.shape[:-1], weight.shape[0]), dtype=input.dtype, device=input.device)


def activation_grad(z: torch.Tensor, activation: str) -> torch.Tensor:
    """d act(z) / dz, elementwise, in z's dtype (formulas: ReLU; GELU = z Phi(z) and its tanh
    approximation (Hendrycks & Gimpel, 2016); SiLU = z sigmoid(z))."""
    if activation == "none":
        return torch.ones_like(z)
    if activation == "relu":
        return (z > 0).to(z.dtype)
    if activation == "gelu":
        return 0.5 * (1 + torch.erf(z / math.sqrt(2))) + z * torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    if activation == "gelu_tanh":
        c = math.sqrt(2 / math.pi)
        t = torch.tanh(c * (z + 0.044715 * z * z * z))
        return 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * c * (1 + 3 * 0.044715 * z * z)
    if activation == "silu":
        s = torch.sigmoid(z)
        return s * (1 + z * (1 - s))
    raise ValueError(f"linear: unknown activation {activation!r}")


def _linear_setup_context(ctx, inputs, output):
    input, weight, bias, activation = inputs
    ctx.save_for_backward(input, weight, bias)
    ctx.activation = activation


def _linear_backward(ctx, grad):
    input, weight, bias = ctx.saved_tensors
    if ctx.activation != "none":
        # Recompute the pre-activation z = x W^T + b with the registered op (nothing extra kept in
        # memory between forward and backward), then dz = grad * act'(z) in float32 (float64 inputs: float64).
        compute = torch.float64 if input.dtype == torch.float64 else torch.float32
        z = torch.ops.ops.linear.default(input, weight, bias, "none").to(compute)
        grad = (grad.to(compute) * activation_grad(z, ctx.activation)).to(input.dtype)
    n = weight.shape[0]
    grad_2d = grad.reshape(-1, n)
    grad_input = grad_weight = grad_bias = None
    if ctx.needs_input_grad[0]:
        grad_input = torch.ops.ops.cutlass_gemm.default(grad_2d, weight).reshape(input.shape)
    if ctx.needs_input_grad[1]:
        grad_weight = torch.ops.ops.cutlass_gemm.default(grad_2d.t(), input.reshape(-1, input.shape[-1]))
    if bias is not None and ctx.needs_input_grad[2]:
        grad_bias = grad_2d.sum(0)
    return grad_input, grad_weight, grad_bias, None


torch.library.register_autograd("ops::linear", _linear_backward, setup_context=_linear_setup_context)


def linear(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
           activation: str = "none") -> torch.Tensor:
    """``act(input @ weight.T + bias)``: ``torch.nn.functional.linear`` followed by an activation, in one
    kernel on CUDA.

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
    output dtype; float32/float64 run the CUTLASS GEMM of ``cutlass_gemm``, then bias and activation as
    separate ATen ops. On CPU: ATen's addmm plus the activation.

    Autograd: differentiable in input, weight and bias (backward recomputes the pre-activation with this
    op and uses ``cutlass_gemm`` on transposed views).

    Raises:
        RuntimeError: shapes that do not chain ((..., K) with (N, K) and (N,)), dtypes that differ or are
            not floating, tensors on different devices. ValueError: an unknown activation.
    """
    return torch.ops.ops.linear(input, weight, bias, activation)
