// The FP8 GEMM formula both FP8 kinds compute on CPU and where no kernel takes a call: scaled_gemm
// (cutlass_gemm/scaled/) and, per group, scaled_grouped_gemm (cutlass_gemm/scaled_grouped/).
#pragma once

#include <ATen/core/Tensor.h>

#include "../../csrc/activation.h"
#include "../../csrc/checks.h"

namespace ops::cutlass_gemm {

at::ScalarType scaled_gemm_out_dtype(const c10::optional<at::ScalarType>& out_dtype);  // bfloat16 by default

// The dequantized formula into out (any strides): act((A * scale_a) @ (B * scale_b) + bias) in float32,
// rounded once; A (M, K), B (K, N) and scales of `recipe` (checks.h ScaleRecipe).
void scaled_gemm_formula_into(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                              const at::Tensor& scale_b, const c10::optional<at::Tensor>& bias, ScaleRecipe recipe,
                              Activation act, at::Tensor& out);

}  // namespace ops::cutlass_gemm
