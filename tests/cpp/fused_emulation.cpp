// The fused CUDA kernels (csrc/fused_kernels.cu: rms_norm, fused_add_rms_norm, silu_and_mul and the
// norms' FP8 forms; csrc/quantize_fp8_kernels.cu: FP8 quantization) compiled for the host on emulated blocks
// (warp_emulation.h), with their real launchers (fused_kernels.h), as a shared library for the tests
// (tests/emulation.py loads it with ctypes and compares with the CPU ops). __ldg loads are checked
// against the buffers of allow_reads.
#define OPS_FUSED_HOST_EMULATION 1
#include "tests/cpp/warp_emulation.h"

#include <cuda_runtime_api.h>

// The launchers' cudaGetLastError: an emulated launch cannot fail to launch (the name is replaced, not
// interposed: a process with torch loaded has the CUDA runtime's own).
inline cudaError_t emulated_last_error() { return cudaSuccess; }
#define cudaGetLastError emulated_last_error

#include "csrc/fused_kernels.cu"
#include "csrc/quantize_fp8_kernels.cu"

extern "C" {

int ops_emulate_rms_norm(int dtype, const void* x, const void* weight, void* y, int64_t rows, int64_t hidden,
                         double eps, int round_x_hat) {
  return ops::fused::rms_norm(dtype, x, weight, y, rows, hidden, eps, round_x_hat != 0, nullptr);
}

int ops_emulate_fused_add_rms_norm(int dtype, void* x, void* residual, const void* weight, int64_t rows,
                                   int64_t hidden, double eps, int round_x_hat) {
  return ops::fused::fused_add_rms_norm(dtype, x, residual, weight, rows, hidden, eps, round_x_hat != 0, nullptr);
}

int ops_emulate_silu_and_mul(int dtype, const void* x, void* out, int64_t rows, int64_t d) {
  return ops::fused::silu_and_mul(dtype, x, out, rows, d, nullptr);
}

int ops_emulate_set_rms_norm_packs_per_thread(int packs) { return ops::fused::set_rms_norm_packs_per_thread(packs); }

// silu_and_mul's grid cap (the previous one returned): a small one runs its grid-stride loop's wrap.
int64_t ops_emulate_set_silu_max_blocks(int64_t blocks) { return ops::fused::set_silu_max_blocks(blocks); }

// cudaErrorNotSupported where the kernel refuses the rows. x_bytes: the input's extent (every load is
// checked against it).
int ops_emulate_quantize_fp8(int dtype, int e5m2, int groups, int silu_and_mul, const void* x, int64_t x_bytes,
                             unsigned char* codes, float* scales, int64_t rows, int64_t k, const float* given,
                             int64_t given_stride, int pow2) {
  emulation::allow_reads({{static_cast<const char*>(x), static_cast<size_t>(x_bytes)}});
  ops::fused::QuantizeFp8Args a;
  a.dtype = dtype;
  a.e5m2 = e5m2 != 0;
  a.groups = groups != 0;
  a.silu_and_mul = silu_and_mul != 0;
  a.x = x;
  a.codes = codes;
  a.scales = scales;
  a.rows = rows;
  a.k = k;
  a.given = given;
  a.given_stride = given_stride;
  a.pow2 = pow2 != 0;
  return ops::fused::quantize_fp8(a, nullptr);
}

// cudaErrorNotSupported where the kernels refuse the rows; residual null: rms_norm_fp8.
int ops_emulate_rms_norm_fp8(int dtype, int e5m2, int groups, const void* x, void* residual, const void* weight,
                             unsigned char* codes, float* scales, int64_t rows, int64_t hidden, double eps,
                             const float* given, int64_t given_stride, int pow2, int round_x_hat) {
  ops::fused::RmsNormFp8Args a;
  a.dtype = dtype;
  a.e5m2 = e5m2 != 0;
  a.groups = groups != 0;
  a.x = x;
  a.residual = residual;
  a.weight = weight;
  a.codes = codes;
  a.scales = scales;
  a.rows = rows;
  a.hidden = hidden;
  a.eps = eps;
  a.given = given;
  a.given_stride = given_stride;
  a.pow2 = pow2 != 0;
  a.round_x_hat = round_x_hat != 0;
  return ops::fused::rms_norm_fp8(a, nullptr);
}

}  // extern "C"
