// What the fused CUDA kernels (fused_kernels.cu, quantize_fp8_kernels.cuh) share: the accumulation type,
// conversions, 16-byte packs, silu, rms_norm's element and the lane reductions, written once so that a fused form computes each element exactly
// as the op it fuses, and the macros and launcher that let the kernels compile for the host with
// OPS_FUSED_HOST_EMULATION (after tests/cpp/warp_emulation.h: emulated blocks, __expf, __fdividef).
#pragma once

#include <cmath>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#if defined(OPS_FUSED_HOST_EMULATION)
#define OPS_FUSED_DEVICE inline
#define OPS_FUSED_DEVICE_FN inline
#define OPS_FUSED_KERNEL(...) void
#define OPS_SHARED static  // one block runs at a time
#else
#define OPS_FUSED_DEVICE __device__ __forceinline__
#define OPS_FUSED_DEVICE_FN __device__
// OPS_FUSED_KERNEL(max threads per block[, min blocks per SM]): __launch_bounds__. Without a min-blocks bound
// ptxas budgets registers for as many blocks as the SM's threads allow (32 per thread at 256 or 1024 threads).
#define OPS_FUSED_KERNEL(...) __global__ void __launch_bounds__(__VA_ARGS__)
#define OPS_SHARED __shared__
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

// One element of rms_norm's output from x, 1 / rms and the weight, in the accumulation type A of T: x * inv * w
// rounded once, or with round_x_hat x * inv rounded to T first (then the product of two T values, rounded).
template <typename T, typename A>
OPS_FUSED_DEVICE T normalised(A x, A inv, A w, bool round_x_hat) {
  const A x_hat = x * inv;
  return from_acc<T>((round_x_hat ? to_acc(from_acc<T>(x_hat)) : x_hat) * w);
}

// The combining operations of the reductions: a sum, and a max of |values| (0 its identity) that keeps NaN
// from either side, as ATen's amax.
OPS_FUSED_DEVICE float nan_max(float acc, float v) { return (v > acc || v != v) ? v : acc; }
struct Add {
  template <typename A>
  OPS_FUSED_DEVICE static A apply(A a, A b) { return a + b; }
};
struct NanMax {
  OPS_FUSED_DEVICE static float apply(float a, float b) { return nan_max(a, b); }
};

// Op-reduction over the kLanes consecutive lanes of a warp that share a row or group (kLanes a power of
// two <= 32); every lane of the warp must call it.
template <int kLanes, typename Op, typename A>
OPS_FUSED_DEVICE A lane_group_reduce(A value) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset >>= 1) value = Op::apply(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// kernel<<<grid, threads, 0, stream>>>(args...), or on emulated blocks.
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, int threads, [[maybe_unused]] cudaStream_t stream,
                   Args... args) {
#if defined(OPS_FUSED_HOST_EMULATION)
  emulate_launch(grid, threads, kernel, static_cast<Params>(args)...);
#else
  kernel<<<grid, threads, 0, stream>>>(static_cast<Params>(args)...);
#endif
}

}  // namespace ops::fused::device
