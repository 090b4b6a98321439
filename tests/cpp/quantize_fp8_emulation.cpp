// The FP8 quantization kernels (csrc/quantize_fp8_kernels.cuh) on emulated warps (warp_emulation.h),
// through their real entry point quant::run, as a shared library for tests/test_quantize_fp8_emulation.py
// (ctypes), which compares them with quantize_fp8's formula on CPU. Every load is checked against the
// input's exact extent.
#define OPS_FUSED_HOST_EMULATION 1
#include "tests/cpp/warp_emulation.h"
#include "csrc/quantize_fp8_kernels.cuh"

using namespace ops::fused;

// 1 if the kernel ran, 0 if quant::run refused the rows.
extern "C" int ops_emulate_quantize_fp8(int dtype, int e5m2, int groups, int silu_and_mul, const void* x,
                                        int64_t x_bytes, unsigned char* codes, float* scales, int64_t rows,
                                        int64_t k, const float* given, int64_t given_stride, int pow2) {
  emulation::allow_reads({{static_cast<const char*>(x), static_cast<size_t>(x_bytes)}});
  QuantizeFp8Args a;
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
  return quant::run(a, nullptr) ? 1 : 0;
}

namespace {

template <typename T>
void silu_and_mul_rows(const void* x, void* out, int64_t rows, int64_t d) {
  const T* in = static_cast<const T*>(x);
  T* o = static_cast<T*>(out);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < d; ++c) {
      o[r * d + c] = device::from_acc<T>(device::silu<T>(device::to_acc(in[r * 2 * d + c])) *
                                         device::to_acc(in[r * 2 * d + d + c]));
    }
  }
}

}  // namespace

// silu_and_mul's elements as the CUDA kernels compute them (fused_device.cuh), element by element.
extern "C" void ops_emulate_silu_and_mul(int dtype, const void* x, void* out, int64_t rows, int64_t d) {
  switch (dtype) {
    case kF16: silu_and_mul_rows<__half>(x, out, rows, d); break;
    case kBF16: silu_and_mul_rows<__nv_bfloat16>(x, out, rows, d); break;
    default: silu_and_mul_rows<float>(x, out, rows, d); break;
  }
}
