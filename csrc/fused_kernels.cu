// CUDA kernels of rms_norm, fused_add_rms_norm and silu_and_mul. Memory-bound: 16-byte vector loads
// and stores where the row length and pointers allow (else an element-wise path for the same kernel),
// fp32 accumulation (fp64 for double), any row length and number of rows, launched on the caller's
// stream. No torch headers (see fused_kernels.h).
#include "fused_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace ops::fused {
namespace {

template <typename T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };

__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }
template <typename T> __device__ __forceinline__ T from_acc(float v);
template <> __device__ __forceinline__ __half from_acc<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ float from_acc<float>(float v) { return v; }
template <typename T> __device__ __forceinline__ T from_acc(double v) { return static_cast<T>(v); }

// 16 bytes of T.
template <typename T>
struct alignas(16) Pack {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};

template <typename A>
__device__ A block_sum(A value) {
  __shared__ A warp_sums[32];
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_sums[warp] = value;
  __syncthreads();
  const int warps = (blockDim.x + 31) / 32;
  value = threadIdx.x < warps ? warp_sums[threadIdx.x] : A(0);
  if (warp == 0) {
    for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
    if (lane == 0) warp_sums[0] = value;
  }
  __syncthreads();
  const A total = warp_sums[0];
  __syncthreads();  // warp_sums may be reused by the caller's next reduction
  return total;
}

// One block per row. kVec: hidden % Pack::kSize == 0 and 16-byte aligned rows.
// With kAdd (fused_add_rms_norm): residual = x + residual (stored), then x = rms_norm(residual).
template <typename T, bool kVec, bool kAdd>
__global__ void rms_norm_kernel(T* __restrict__ x, T* __restrict__ residual, const T* __restrict__ weight,
                                T* __restrict__ y, int64_t hidden, double eps) {
  using A = typename Acc<T>::type;
  using P = Pack<T>;
  const int64_t row = blockIdx.x;
  T* xr = x + row * hidden;
  T* rr = kAdd ? residual + row * hidden : nullptr;
  const T* in = kAdd ? rr : xr;  // what is normalised
  T* out = kAdd ? xr : y + row * hidden;
  A sum_sq = 0;
  if constexpr (kVec) {
    const int64_t packs = hidden / P::kSize;
    for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
      P a = reinterpret_cast<const P*>(xr)[i];
      if constexpr (kAdd) {
        const P b = reinterpret_cast<const P*>(rr)[i];
#pragma unroll
        for (int j = 0; j < P::kSize; ++j) a.v[j] = from_acc<T>(to_acc(a.v[j]) + to_acc(b.v[j]));
        reinterpret_cast<P*>(rr)[i] = a;
      }
#pragma unroll
      for (int j = 0; j < P::kSize; ++j) {
        const A v = to_acc(a.v[j]);
        sum_sq += v * v;
      }
    }
  } else {
    for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
      T a = xr[i];
      if constexpr (kAdd) {
        a = from_acc<T>(to_acc(a) + to_acc(rr[i]));
        rr[i] = a;
      }
      const A v = to_acc(a);
      sum_sq += v * v;
    }
  }
  const A inv = A(1) / sqrt(block_sum(sum_sq) / static_cast<A>(hidden) + static_cast<A>(eps));
  // Second pass: each thread re-reads the elements it wrote/read itself (no barrier needed beyond the
  // reduction's), from L1/L2.
  if constexpr (kVec) {
    const int64_t packs = hidden / P::kSize;
    for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
      const P a = reinterpret_cast<const P*>(in + 0)[i];
      const P w = reinterpret_cast<const P*>(weight)[i];
      P o;
#pragma unroll
      for (int j = 0; j < P::kSize; ++j) o.v[j] = from_acc<T>(to_acc(a.v[j]) * inv * to_acc(w.v[j]));
      reinterpret_cast<P*>(out)[i] = o;
    }
  } else {
    for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
      out[i] = from_acc<T>(to_acc(in[i]) * inv * to_acc(weight[i]));
    }
  }
}

template <typename A>
__device__ __forceinline__ A silu(A a) { return a / (A(1) + exp(-a)); }

// out (rows, d) = silu(x[:, :d]) * x[:, d:]; grid-stride over 16-byte packs (kVec) or elements.
template <typename T, bool kVec>
__global__ void silu_and_mul_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t rows, int64_t d) {
  using P = Pack<T>;
  const int64_t width = kVec ? d / P::kSize : d;  // packs or elements per row
  const int64_t total = rows * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / width, col = i % width;
    const T* gate = x + row * 2 * d;
    const T* up = gate + d;
    if constexpr (kVec) {
      const P g = reinterpret_cast<const P*>(gate)[col];
      const P u = reinterpret_cast<const P*>(up)[col];
      P o;
#pragma unroll
      for (int j = 0; j < P::kSize; ++j) o.v[j] = from_acc<T>(silu(to_acc(g.v[j])) * to_acc(u.v[j]));
      reinterpret_cast<P*>(out + row * d)[col] = o;
    } else {
      out[row * d + col] = from_acc<T>(silu(to_acc(gate[col])) * to_acc(up[col]));
    }
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int threads_for(int64_t work) {
  int threads = 32;
  while (threads < 1024 && threads < work) threads *= 2;
  return threads;
}

template <typename T, bool kAdd>
cudaError_t launch_rms(void* x, void* residual, const void* weight, void* y, int64_t rows, int64_t hidden,
                       double eps, cudaStream_t stream) {
  if (rows == 0 || hidden == 0) return cudaSuccess;
  constexpr int kPack = Pack<T>::kSize;
  const bool vec = hidden % kPack == 0 && aligned16(x) && aligned16(weight) &&
                   (!kAdd || aligned16(residual)) && (kAdd || aligned16(y));
  const int threads = threads_for(vec ? hidden / kPack : hidden);
  // Rows beyond the grid's x limit (2^31 - 1) are launched in chunks.
  for (int64_t start = 0; start < rows; start += 2147483647LL) {
    const int64_t count = rows - start < 2147483647LL ? rows - start : 2147483647LL;
    T* xs = static_cast<T*>(x) + start * hidden;
    T* rs = kAdd ? static_cast<T*>(residual) + start * hidden : nullptr;
    T* ys = kAdd ? nullptr : static_cast<T*>(y) + start * hidden;
    if (vec) {
      rms_norm_kernel<T, true, kAdd><<<static_cast<unsigned>(count), threads, 0, stream>>>(
          xs, rs, static_cast<const T*>(weight), ys, hidden, eps);
    } else {
      rms_norm_kernel<T, false, kAdd><<<static_cast<unsigned>(count), threads, 0, stream>>>(
          xs, rs, static_cast<const T*>(weight), ys, hidden, eps);
    }
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

template <typename T>
cudaError_t launch_silu(const void* x, void* out, int64_t rows, int64_t d, cudaStream_t stream) {
  if (rows == 0 || d == 0) return cudaSuccess;
  constexpr int kPack = Pack<T>::kSize;
  const bool vec = d % kPack == 0 && aligned16(x) && aligned16(out);
  const int64_t work = rows * (vec ? d / kPack : d);
  const int threads = 256;
  const int64_t blocks = (work + threads - 1) / threads;
  const unsigned grid = static_cast<unsigned>(blocks < 65535LL * 32 ? blocks : 65535LL * 32);
  if (vec) {
    silu_and_mul_kernel<T, true><<<grid, threads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(out), rows, d);
  } else {
    silu_and_mul_kernel<T, false><<<grid, threads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(out), rows, d);
  }
  return cudaGetLastError();
}

template <template <typename> class Fn, typename... Args>
cudaError_t dispatch(int dtype, Args&&... args) {
  switch (dtype) {
    case kF16: return Fn<__half>::run(args...);
    case kBF16: return Fn<__nv_bfloat16>::run(args...);
    case kF32: return Fn<float>::run(args...);
    case kF64: return Fn<double>::run(args...);
    default: return cudaErrorInvalidValue;
  }
}

template <typename T> struct RmsFn {
  static cudaError_t run(const void* x, const void* w, void* y, int64_t rows, int64_t hidden, double eps, cudaStream_t s) {
    return launch_rms<T, false>(const_cast<void*>(x), nullptr, w, y, rows, hidden, eps, s);
  }
};
template <typename T> struct AddRmsFn {
  static cudaError_t run(void* x, void* r, const void* w, int64_t rows, int64_t hidden, double eps, cudaStream_t s) {
    return launch_rms<T, true>(x, r, w, nullptr, rows, hidden, eps, s);
  }
};
template <typename T> struct SiluFn {
  static cudaError_t run(const void* x, void* out, int64_t rows, int64_t d, cudaStream_t s) {
    return launch_silu<T>(x, out, rows, d, s);
  }
};

}  // namespace

cudaError_t rms_norm(int dtype, const void* x, const void* weight, void* y, int64_t rows, int64_t hidden,
                     double eps, cudaStream_t stream) {
  return dispatch<RmsFn>(dtype, x, weight, y, rows, hidden, eps, stream);
}

cudaError_t fused_add_rms_norm(int dtype, void* x, void* residual, const void* weight, int64_t rows,
                               int64_t hidden, double eps, cudaStream_t stream) {
  return dispatch<AddRmsFn>(dtype, x, residual, weight, rows, hidden, eps, stream);
}

cudaError_t silu_and_mul(int dtype, const void* x, void* out, int64_t rows, int64_t d, cudaStream_t stream) {
  return dispatch<SiluFn>(dtype, x, out, rows, d, stream);
}

}  // namespace ops::fused
