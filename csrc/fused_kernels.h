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

// Which kernel normalises rows of more than 32 16-byte packs (a measurement knob, process-wide; the
// private op ops::_rms_norm_set_packs_per_thread sets it for benchmarks.ops --candidates and the tests):
// 0 (default) rms_norm_kernel, one pack per thread per pass, the row re-read from L1/L2 for the second
// pass; 1, 2, 4 or 8: rms_norm_regs_kernel with up to that many packs per thread, held in registers
// between the passes (rows of more than 1024 * packs packs, 512 * 8 with 8, or rows not in 16-byte
// packs, keep the default kernel). Returns the previous setting; other values are refused (returns -1,
// nothing changes).
int set_rms_norm_packs_per_thread(int packs);

}  // namespace ops::fused
