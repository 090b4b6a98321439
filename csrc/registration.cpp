// The op catalogue: every schema of the `ops` library, in one place (the table in README.md).
// Kernels register elsewhere with TORCH_LIBRARY_IMPL; fake kernels and autograd live in the Python
// package `ops`; set_python_module before each group names the module holding that group's fake
// kernels, so a missing fake kernel says what to import. ops::define is m.def plus clear errors for
// sparse, nested and quantized inputs (layout_errors.h).
#include <torch/library.h>

#include "layout_errors.h"

TORCH_LIBRARY(ops, m) {
  m.set_python_module("ops.gemm");
  // C = A @ B. A (M, K), B (K, N), C (M, N); float16, bfloat16, float32, float64.
  ops::define(m, "cutlass_gemm(Tensor A, Tensor B) -> Tensor");
  // Out variant: writes A @ B into out (M, N). Returns nothing (an aliasing return would need
  // torch.Tag.out, whose name changed across torch releases: torch 2.10-2.12 call it out_variant).
  ops::define(m, "cutlass_gemm.out(Tensor A, Tensor B, *, Tensor(a!) out) -> ()");

  m.set_python_module("ops.linear");
  // act(input @ weight^T + bias); input (..., K), weight (N, K), bias (N,); activation one of
  // none, relu, gelu, gelu_tanh, silu (fused into the CUTLASS epilogue on CUDA for half types).
  ops::define(m, "linear(Tensor input, Tensor weight, Tensor? bias=None, str activation=\"none\") -> Tensor");

  m.set_python_module("ops.fused");
  // y = x / sqrt(mean(x^2, -1) + eps) * weight; x (..., hidden), weight (hidden,); stats in fp32.
  ops::define(m, "rms_norm(Tensor input, Tensor weight, float eps=1e-6) -> Tensor");
  // residual += input; input = rms_norm(residual, weight, eps); both mutated in place.
  ops::define(m, "fused_add_rms_norm(Tensor(a!) input, Tensor(b!) residual, Tensor weight, float eps=1e-6) -> ()");
  // x (..., 2d) -> silu(x[..., :d]) * x[..., d:].
  ops::define(m, "silu_and_mul(Tensor input) -> Tensor");
}
