// The scale arithmetic of FP8 quantization, shared by the CUDA kernels (quantize_fp8_kernels.cuh) and the
// CPU kernels (fused_cpu_kernels.h): plain C++, host and device. Bit for bit quantize_fp8's ATen formula
// (quantize_fp8.cpp).
#pragma once

#include <cstdint>
#include <cstring>

#ifndef OPS_HOST_DEVICE
#if defined(__CUDACC__)
#define OPS_HOST_DEVICE __host__ __device__
#else
#define OPS_HOST_DEVICE
#endif
#endif

namespace ops::fp8 {

// The largest finite code of float8_e5m2 or float8_e4m3fn.
constexpr float fp8_max(bool e5m2) { return e5m2 ? 57344.0f : 448.0f; }

// The smallest power of two >= s (s > 0), from its bits; NaN and inf stay. exp2(ceil(log2(s))) in
// float32 is not it: log2 rounds s = 512 * (1 + 2^-23) to 9, a scale below s.
OPS_HOST_DEVICE inline float pow2_ceil(float s) {
  uint32_t bits;
  memcpy(&bits, &s, sizeof bits);
  const uint32_t exponent = bits & 0x7f800000u;
  if ((bits & 0x007fffffu) != 0 && exponent != 0x7f800000u) bits = exponent + 0x00800000u;
  memcpy(&s, &bits, sizeof s);
  return s;
}

// scale = max(amax, 1e-12) / max(dtype) (NaN stays NaN), optionally rounded up to a power of two.
OPS_HOST_DEVICE inline float scale_of(float amax, float max, bool pow2) {
  const float s = (amax < 1e-12f ? 1e-12f : amax) / max;
  return pow2 ? pow2_ceil(s) : s;
}

}  // namespace ops::fp8
