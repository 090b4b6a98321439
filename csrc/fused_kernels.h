// Launchers of the fused CUDA kernels (csrc/fused_kernels.cu): plain C++ with raw pointers, so the
// kernels compile without torch headers. All tensors are contiguous rows; `dtype` is
// 0 float16, 1 bfloat16, 2 float32, 3 float64. Each returns the launch's cudaError_t.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace ops::fused {

enum DTypeCode : int { kF16 = 0, kBF16 = 1, kF32 = 2, kF64 = 3 };

// round_x_hat: x / rms rounded to the dtype before the weight multiply (rms_norm's round_before_weight).
cudaError_t rms_norm(int dtype, const void* x, const void* weight, void* y, int64_t rows, int64_t hidden,
                     double eps, bool round_x_hat, cudaStream_t stream);
cudaError_t fused_add_rms_norm(int dtype, void* x, void* residual, const void* weight, int64_t rows,
                               int64_t hidden, double eps, bool round_x_hat, cudaStream_t stream);
cudaError_t silu_and_mul(int dtype, const void* x, void* out, int64_t rows, int64_t d, cudaStream_t stream);

// Which kernel normalises rows of more than 32 16-byte packs (a measurement knob, process-wide; the
// private op ops::_rms_norm_set_packs_per_thread sets it for benchmarks.ops --candidates and the tests):
// 0 (default) rms_norm_kernel, one pack per thread per pass, the row re-read from L1/L2 for the second
// pass; 1, 2, 4 or 8: rms_norm_regs_kernel with up to that many packs per thread, held in registers
// between the passes (rows of more than 1024 * packs packs, 512 * 8 with 8, or rows not in 16-byte
// packs, keep the default kernel). Returns the previous setting; other values are refused (returns -1,
// nothing changes).
int set_rms_norm_packs_per_thread(int packs);

// FP8 quantization of rows (csrc/quantize_fp8_kernels.cuh).
struct QuantizeFp8Args {
  int dtype;  // kF16, kBF16 or kF32
  bool e5m2;  // else float8_e4m3fn
  bool groups;  // a scale per 1x128 group, else per row
  bool silu_and_mul;  // x holds rows of (gate, up), each k wide: quantize silu(gate) * up
  const void* x;
  unsigned char* codes;  // (rows, k)
  float* scales;  // (rows, 1) or (rows, ceil(k / 128)); null with `given`
  int64_t rows = 0, k = 0;
  const float* given = nullptr;  // static scales: element row * given_stride + group (stride 0: one scale)
  int64_t given_stride = 0;
  bool pow2 = false;  // round computed scales up to a power of two
};

// Whether quantize_fp8 takes rows of `k` elements of `dtype` at x: 16-byte packs (k and the pointer).
inline bool quantize_fp8_supported(int dtype, const void* x, int64_t k) {
  const int64_t pack = dtype == kF32 ? 4 : 8;
  return (dtype == kF16 || dtype == kBF16 || dtype == kF32) && k % pack == 0 &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

// cudaErrorNotSupported (nothing launched) where quantize_fp8_supported() is false.
cudaError_t quantize_fp8(const QuantizeFp8Args& args, cudaStream_t stream);

// rms_norm_fp8 (residual null) or fused_add_rms_norm_fp8 (residual = x + residual stored, x read only)
// of rows (rows, hidden): the codes and scales quantize_fp8 gives for rms_norm's output, bit for bit
// (the kernel rms_norm would run, its sum order, each element as it stores it).
struct RmsNormFp8Args {
  int dtype;  // kF16, kBF16 or kF32
  bool e5m2 = false;  // else float8_e4m3fn
  bool groups = false;  // a scale per 1x128 group, else per row
  const void* x = nullptr;
  void* residual = nullptr;
  const void* weight = nullptr;
  unsigned char* codes = nullptr;  // (rows, hidden)
  float* scales = nullptr;  // (rows, 1) or (rows, ceil(hidden / 128)); null with `given`
  int64_t rows = 0, hidden = 0;
  double eps = 1e-6;
  const float* given = nullptr;  // static scales, as QuantizeFp8Args's
  int64_t given_stride = 0;
  bool pow2 = false;
  bool round_x_hat = false;  // as rms_norm's
};

// Whether rms_norm_fp8 takes the rows: 16-byte packs (hidden and every pointer) and the default rms_norm
// kernels (set_rms_norm_packs_per_thread(0): the register variants sum in another order).
bool rms_norm_fp8_supported(int dtype, const void* x, const void* residual, const void* weight, int64_t hidden);

// cudaErrorNotSupported (nothing launched) where rms_norm_fp8_supported() is false.
cudaError_t rms_norm_fp8(const RmsNormFp8Args& args, cudaStream_t stream);

}  // namespace ops::fused
