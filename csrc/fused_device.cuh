// Element helpers of the fused CUDA kernels (fused_kernels.cu, quantize_fp8_kernels.cuh): the
// accumulation type, conversions, 16-byte packs and silu, written once so that a fused form computes
// each element exactly as the op it fuses. With OPS_FUSED_HOST_EMULATION they compile for the host (the
// warp emulation of tests/cpp/warp_emulation.h, which defines __expf and __fdividef there).
#pragma once

#include <cmath>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#if defined(OPS_FUSED_HOST_EMULATION)
#define OPS_FUSED_DEVICE inline
#else
#define OPS_FUSED_DEVICE __device__ __forceinline__
#endif

namespace ops::fused::device {

template <typename T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };

OPS_FUSED_DEVICE float to_acc(__half v) { return __half2float(v); }
OPS_FUSED_DEVICE float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
OPS_FUSED_DEVICE float to_acc(float v) { return v; }
OPS_FUSED_DEVICE double to_acc(double v) { return v; }
template <typename T> OPS_FUSED_DEVICE T from_acc(float v);
template <> OPS_FUSED_DEVICE __half from_acc<__half>(float v) { return __float2half_rn(v); }
template <> OPS_FUSED_DEVICE __nv_bfloat16 from_acc<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> OPS_FUSED_DEVICE float from_acc<float>(float v) { return v; }
template <typename T> OPS_FUSED_DEVICE T from_acc(double v) { return static_cast<T>(v); }

// 16 bytes of T.
template <typename T>
struct alignas(16) Pack {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};

// silu(a) = a / (1 + exp(-a)), in the accumulation type A of T. For half types (results rounded to 8 or
// 11 bits) with the fast intrinsics: IEEE division and expf cost more issue slots per byte than the
// H200's bandwidth leaves (3 x 16 bytes per 8 elements); float and double keep the accurate forms.
// __fdividef(x, y) returns 0 for 2^126 < |y| < 2^128 (CUDA Math API), i.e. for gates a in (-88.72, -87.34),
// where silu(a) ~ a e^a ~ -1e-36 is still a normal bfloat16 and a large up-projection value makes the
// product visible: there both operands are scaled by 2^-4 (exact) first. An infinite
// exp(-a) (a < -88.72) still gives -0, as a / (1 + exp(-a)) does.
template <typename T, typename A>
OPS_FUSED_DEVICE A silu(A a) {
  if constexpr (sizeof(T) == 2) {
    const float e = __expf(-a);
    const float scale = e > 0x1p126f ? 0x1p-4f : 1.0f;
    return __fdividef(a * scale, (1.0f + e) * scale);
  } else {
#if defined(OPS_FUSED_HOST_EMULATION)
    using std::exp;  // the float overload on the host too
#endif
    return a / (A(1) + exp(-a));
  }
}

}  // namespace ops::fused::device
