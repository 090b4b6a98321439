// CUDA kernels of FP8 quantization per row (token) and per 1x128 group of a row, dynamic or with given
// scales, of a tensor's rows (quantize_fp8) or of silu_and_mul's rows computed on the fly
// (silu_and_mul_fp8: the product is never written). Each element is what quantize_fp8's formula
// (quantize_fp8.cpp) gives, bit for bit: amax is order-free, scale = max(amax, 1e-12) / max(dtype) and
// code = x / scale are single IEEE float32 operations, the pow2 rounding is on the bits, NaN propagates as
// in ATen's amax and clamp; silu_and_mul's elements come from fused_device.cuh, as its own kernel's.
//
// Work split: one warp per row, 16-byte packs (rows whose length is not a multiple of a pack, or not
// 16-byte aligned, are left to the formula by the caller). Per row: one pass for the amax, a shuffle
// reduction, a second pass (from L1/L2) for the codes. Per group: a group is 128 / pack lanes (16 for
// 2-byte types, 32 for float32), so each pass of the warp over 32 packs reduces its groups' amax with
// shuffles inside the lanes of each group and writes their codes at once: one pass.
//
// Host emulation: with OPS_FUSED_HOST_EMULATION defined and tests/cpp/warp_emulation.h included first,
// this file compiles with a host C++ compiler and run() launches on emulated warps
// (tests/test_quantize_fp8_emulation.py compares it with quantize_fp8 on CPU).
#pragma once

#include <cstdint>
#include <cstring>

#include <cuda_fp8.h>

#include "fp8_scale.h"
#include "fused_device.cuh"
#include "fused_kernels.h"

namespace ops::fused::quant {

using namespace device;

constexpr int kWarps = 8;  // rows per block
constexpr int kThreads = kWarps * 32;
constexpr int kGroupSize = 128;

// A row of quantize_fp8's input.
template <typename T>
struct Rows {
  const T* x;
  int64_t k;
  OPS_FUSED_DEVICE Pack<T> operator()(int64_t row, int64_t pack) const {
    return load(x + row * k + pack * Pack<T>::kSize);
  }
  static OPS_FUSED_DEVICE Pack<T> load(const T* p) {
    const uint4 bits = __ldg(reinterpret_cast<const uint4*>(p));
    Pack<T> v;
    memcpy(&v, &bits, sizeof v);
    return v;
  }
};

// A row of silu_and_mul(x) for x of rows (gate, up), each k wide: the element silu_and_mul_kernel stores.
template <typename T>
struct SiluMulRows {
  const T* x;
  int64_t k;
  OPS_FUSED_DEVICE Pack<T> operator()(int64_t row, int64_t pack) const {
    const T* gate = x + row * 2 * k + pack * Pack<T>::kSize;
    const Pack<T> g = Rows<T>::load(gate), u = Rows<T>::load(gate + k);
    Pack<T> o;
#pragma unroll
    for (int j = 0; j < Pack<T>::kSize; ++j) o.v[j] = from_acc<T>(silu<T>(to_acc(g.v[j])) * to_acc(u.v[j]));
    return o;
  }
};

using fp8::fp8_max;

template <typename T>
OPS_FUSED_DEVICE float pack_amax(const Pack<T>& v) {
  float a = 0.0f;
#pragma unroll
  for (int j = 0; j < Pack<T>::kSize; ++j) a = nan_max(a, fabsf(to_acc(v.v[j])));
  return a;
}

using fp8::pow2_ceil;
using fp8::scale_of;

template <typename T, bool kE5M2>
OPS_FUSED_DEVICE void store_codes(unsigned char* row_codes, int64_t pack, const Pack<T>& v, float scale) {
  constexpr float kMax = fp8_max(kE5M2);
  struct alignas(Pack<T>::kSize) Codes {
    unsigned char v[Pack<T>::kSize];
  } c;
#pragma unroll
  for (int j = 0; j < Pack<T>::kSize; ++j) {
    float q = to_acc(v.v[j]) / scale;
    q = q != q ? q : fminf(fmaxf(q, -kMax), kMax);  // clamp, NaN kept
    c.v[j] = __nv_cvt_float_to_fp8(q, __NV_SATFINITE, kE5M2 ? __NV_E5M2 : __NV_E4M3);
  }
  reinterpret_cast<Codes*>(row_codes)[pack] = c;
}

// Codes (rows, k) and scales (rows, 1) or (rows, ceil(k / 128)) of the rows `src` yields; `given`: the
// scales to use instead (element row * given_stride + group; stride 0 for one per tensor), and then
// `scales` is null.
template <typename T, bool kE5M2, bool kGroups, typename Source>
OPS_FUSED_KERNEL(kThreads)
kernel(Source src, unsigned char* codes, float* scales, int64_t rows, int64_t k, const float* given,
       int64_t given_stride, bool pow2) {
  using P = Pack<T>;
  constexpr float kMax = fp8_max(kE5M2);
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= rows) return;  // the whole warp
  const int64_t packs = k / P::kSize;
  unsigned char* out = codes + row * k;
  if constexpr (kGroups) {
    constexpr int kLanes = kGroupSize / P::kSize;  // lanes per group
    const int64_t groups = (k + kGroupSize - 1) / kGroupSize;
    for (int64_t base = 0; base < packs; base += 32) {  // the same trips for every lane: shuffles inside
      const int64_t pack = base + lane;
      const bool active = pack < packs;
      const P v = active ? src(row, pack) : P{};
      const float amax = lane_group_reduce<kLanes, NanMax>(active ? pack_amax(v) : 0.0f);
      const int64_t group = pack / kLanes;
      if (group >= groups) continue;  // lanes past the row's last group
      const float s = given != nullptr ? given[row * given_stride + group] : scale_of(amax, kMax, pow2);
      if (active) store_codes<T, kE5M2>(out, pack, v, s);
      if (scales != nullptr && pack % kLanes == 0) scales[row * groups + group] = s;
    }
  } else {
    float s;
    if (given != nullptr) {
      s = given[row * given_stride];
    } else {
      float amax = 0.0f;
      for (int64_t pack = lane; pack < packs; pack += 32) amax = nan_max(amax, pack_amax(src(row, pack)));
      s = scale_of(lane_group_reduce<32, NanMax>(amax), kMax, pow2);
    }
    for (int64_t pack = lane; pack < packs; pack += 32) store_codes<T, kE5M2>(out, pack, src(row, pack), s);
    if (scales != nullptr && lane == 0) scales[row] = s;
  }
}

template <typename T, bool kE5M2, bool kGroups, typename Source>
void launch(const QuantizeFp8Args& a, Source src, unsigned blocks, cudaStream_t stream) {
  launch_kernel(kernel<T, kE5M2, kGroups, Source>, blocks, kThreads, stream, src, a.codes, a.scales, a.rows, a.k,
                a.given, a.given_stride, a.pow2);
}

template <typename T, bool kE5M2, bool kGroups>
void launch_source(const QuantizeFp8Args& a, unsigned blocks, cudaStream_t stream) {
  const T* x = static_cast<const T*>(a.x);
  if (a.silu_and_mul) {
    launch<T, kE5M2, kGroups>(a, SiluMulRows<T>{x, a.k}, blocks, stream);
  } else {
    launch<T, kE5M2, kGroups>(a, Rows<T>{x, a.k}, blocks, stream);
  }
}

template <typename T>
void launch_dtype(const QuantizeFp8Args& a, unsigned blocks, cudaStream_t stream) {
  if (a.e5m2) {
    a.groups ? launch_source<T, true, true>(a, blocks, stream) : launch_source<T, true, false>(a, blocks, stream);
  } else {
    a.groups ? launch_source<T, false, true>(a, blocks, stream) : launch_source<T, false, false>(a, blocks, stream);
  }
}

// Launches the kernel for `a` on `stream`; false (nothing launched) where quantize_fp8_supported() is
// false or the grid would exceed 2^31 - 1 blocks.
inline bool run(const QuantizeFp8Args& a, cudaStream_t stream) {
  if (!quantize_fp8_supported(a.dtype, a.x, a.k)) return false;
  if (a.rows == 0 || a.k == 0) return true;
  const int64_t blocks = (a.rows + kWarps - 1) / kWarps;
  if (blocks > 2147483647LL) return false;
  const unsigned grid = static_cast<unsigned>(blocks);
  switch (a.dtype) {
    case kF16: launch_dtype<__half>(a, grid, stream); break;
    case kBF16: launch_dtype<__nv_bfloat16>(a, grid, stream); break;
    default: launch_dtype<float>(a, grid, stream); break;
  }
  return true;
}

}  // namespace ops::fused::quant
