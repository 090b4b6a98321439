// Input checks shared by the CPU and CUDA kernels. Every message names the op, the argument and what
// was expected, so a user can fix the call without reading our source.
#pragma once

#include <ATen/core/Tensor.h>

namespace ops {

// A (M, K) and B (K, N): 2-D, same floating dtype (float16, bfloat16, float32, float64), same device.
void check_gemm_inputs(const char* op, const at::Tensor& A, const at::Tensor& B);

// out: shape (M, N), A's dtype and device, not overlapping A or B, no internal overlap.
void check_gemm_out(const char* op, const at::Tensor& A, const at::Tensor& B, const at::Tensor& out);

}  // namespace ops
