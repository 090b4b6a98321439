// Launchers of the fused CUDA kernels (csrc/fused_kernels.cu): plain C++ with raw pointers, so the
// kernels compile without torch headers. All tensors are contiguous rows; `dtype` is
// 0 float16, 1 bfloat16, 2 float32, 3 float64. Each returns the launch's cudaError_t.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace ops::fused {

enum DTypeCode : int { kF16 = 0, kBF16 = 1, kF32 = 2, kF64 = 3 };

cudaError_t rms_norm(int dtype, const void* x, const void* weight, void* y, int64_t rows, int64_t hidden,
                     double eps, cudaStream_t stream);
cudaError_t fused_add_rms_norm(int dtype, void* x, void* residual, const void* weight, int64_t rows,
                               int64_t hidden, double eps, cudaStream_t stream);
cudaError_t silu_and_mul(int dtype, const void* x, void* out, int64_t rows, int64_t d, cudaStream_t stream);

}  // namespace ops::fused
