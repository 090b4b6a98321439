// CUDA kernels of rms_norm, fused_add_rms_norm and silu_and_mul. Memory-bound: 16-byte vector loads
// and stores where the row length and pointers allow (else an element-wise path for the same kernel),
// fp32 accumulation (fp64 for double), any row length and number of rows, launched on the caller's
// stream. No torch headers (see fused_kernels.h). With OPS_FUSED_HOST_EMULATION this file compiles for
// the host and runs on emulated blocks (tests/cpp/fused_emulation.cpp).
#include "fused_kernels.h"
#include "fused_device.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

namespace ops::fused {
namespace {

using namespace device;
#if defined(OPS_FUSED_HOST_EMULATION)
using std::sqrt;  // the float overload on the host too
#endif

template <typename A>
OPS_FUSED_DEVICE_FN A block_sum(A value) {
  OPS_SHARED A warp_sums[32];
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_sums[warp] = value;
  __syncthreads();
  const int warps = (blockDim.x + 31) / 32;
  value = static_cast<int>(threadIdx.x) < warps ? warp_sums[threadIdx.x] : A(0);
  if (warp == 0) {
    for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
    if (lane == 0) warp_sums[0] = value;
  }
  __syncthreads();
  const A total = warp_sums[0];
  __syncthreads();  // warp_sums may be reused by the caller's next reduction
  return total;
}

// Sum over the kLanes consecutive lanes of a warp that share a row (kLanes a power of two <= 32); every
// lane of the warp must call it.
template <int kLanes, typename A>
OPS_FUSED_DEVICE A lane_group_sum(A value) {
  for (int offset = kLanes / 2; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// How the threads working on one row sum their partial results: the whole block (block_sum), or a
// group of kLanes lanes of one warp (shuffles only).
struct BlockSum {
  template <typename A>
  OPS_FUSED_DEVICE_FN static A sum(A value) { return block_sum(value); }
};
template <int kLanes>
struct LaneGroupSum {
  template <typename A>
  OPS_FUSED_DEVICE_FN static A sum(A value) { return lane_group_sum<kLanes>(value); }
};

// One row of rms_norm, by `nthreads` threads (this one is `tid`); `active` false: a thread without a row
// that still takes part in the reduction. kVec: hidden % Pack::kSize == 0 and 16-byte aligned rows.
// With kAdd (fused_add_rms_norm): residual = x + residual (stored), then x = rms_norm(residual).
template <typename T, bool kVec, bool kAdd, typename Sum>
OPS_FUSED_DEVICE void rms_norm_row(T* xr, T* rr, const T* weight, T* out, int64_t hidden, double eps,
                                             int tid, int nthreads, bool active) {  // out == xr with kAdd
  using A = typename Acc<T>::type;
  using P = Pack<T>;
  const T* in = kAdd ? rr : xr;  // what is normalised
  const int64_t n = active ? (kVec ? hidden / P::kSize : hidden) : 0;  // packs or elements of this row
  A sum_sq = 0;
  for (int64_t i = tid; i < n; i += nthreads) {
    if constexpr (kVec) {
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
    } else {
      T a = xr[i];
      if constexpr (kAdd) {
        a = from_acc<T>(to_acc(a) + to_acc(rr[i]));
        rr[i] = a;
      }
      const A v = to_acc(a);
      sum_sq += v * v;
    }
  }
  const A inv = A(1) / sqrt(Sum::sum(sum_sq) / static_cast<A>(hidden) + static_cast<A>(eps));
  // Second pass: each thread re-reads the elements it wrote/read itself (no barrier needed beyond the
  // reduction's), from L1/L2.
  for (int64_t i = tid; i < n; i += nthreads) {
    if constexpr (kVec) {
      const P a = reinterpret_cast<const P*>(in)[i];
      const P w = reinterpret_cast<const P*>(weight)[i];
      P o;
#pragma unroll
      for (int j = 0; j < P::kSize; ++j) o.v[j] = from_acc<T>(to_acc(a.v[j]) * inv * to_acc(w.v[j]));
      reinterpret_cast<P*>(out)[i] = o;
    } else {
      out[i] = from_acc<T>(to_acc(in[i]) * inv * to_acc(weight[i]));
    }
  }
}

// One block per row (rows of more than 32 packs or elements).
template <typename T, bool kVec, bool kAdd>
OPS_FUSED_KERNEL(1024)
    rms_norm_kernel(T* __restrict__ x, T* __restrict__ residual, const T* __restrict__ weight, T* __restrict__ y,
                    int64_t hidden, double eps) {
  const int64_t row = blockIdx.x;
  rms_norm_row<T, kVec, kAdd, BlockSum>(x + row * hidden, kAdd ? residual + row * hidden : nullptr, weight,
                                        kAdd ? x + row * hidden : y + row * hidden, hidden, eps, threadIdx.x,
                                        blockDim.x, true);
}

// Threads per block of rms_norm_regs_kernel<kPacks>: with 8 packs a thread holds 64 bytes of row and
// needs 80-110 registers (ptxas, sm_90a, CUDA 13.0), more than the 64 that 1024 threads leave (65536
// per SM): 1024 threads would fail to launch ("too many resources requested").
template <int kPacks>
constexpr int kRegsMaxThreads = kPacks >= 8 ? 512 : 1024;

// One block per row of 16-byte packs, each thread holding up to kPacks packs (indices tid + j * blockDim)
// in registers between the two passes: its kPacks loads go out back to back, and the second pass
// reads only the weight. Requires hidden / Pack::kSize <= kPacks * blockDim.x and 16-byte aligned rows.
template <typename T, bool kAdd, int kPacks>
OPS_FUSED_KERNEL(kRegsMaxThreads<kPacks>)
    rms_norm_regs_kernel(T* __restrict__ x, T* __restrict__ residual, const T* __restrict__ weight,
                         T* __restrict__ y, int64_t hidden, double eps) {
  using A = typename Acc<T>::type;
  using P = Pack<T>;
  const int64_t row = blockIdx.x;
  const int64_t n = hidden / P::kSize;
  const P* xr = reinterpret_cast<const P*>(x + row * hidden);
  P* rr = kAdd ? reinterpret_cast<P*>(residual + row * hidden) : nullptr;
  P* out = reinterpret_cast<P*>((kAdd ? x : y) + row * hidden);  // x itself with kAdd (read first)
  P a[kPacks];
  A sum_sq = 0;
#pragma unroll
  for (int j = 0; j < kPacks; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
    if (i < n) {
      a[j] = xr[i];
      if constexpr (kAdd) {
        const P b = rr[i];
#pragma unroll
        for (int k = 0; k < P::kSize; ++k) a[j].v[k] = from_acc<T>(to_acc(a[j].v[k]) + to_acc(b.v[k]));
        rr[i] = a[j];
      }
#pragma unroll
      for (int k = 0; k < P::kSize; ++k) {
        const A v = to_acc(a[j].v[k]);
        sum_sq += v * v;
      }
    }
  }
  const A inv = A(1) / sqrt(block_sum(sum_sq) / static_cast<A>(hidden) + static_cast<A>(eps));
#pragma unroll
  for (int j = 0; j < kPacks; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
    if (i < n) {
      const P w = reinterpret_cast<const P*>(weight)[i];
      P o;
#pragma unroll
      for (int k = 0; k < P::kSize; ++k) o.v[k] = from_acc<T>(to_acc(a[j].v[k]) * inv * to_acc(w.v[k]));
      out[i] = o;
    }
  }
}

std::atomic<int> rms_packs_per_thread{0};  // set_rms_norm_packs_per_thread

// Short rows (at most 32 packs or elements, e.g. per-head q/k norms of 128 half values = 16 packs): one
// group of kLanes lanes per row, many rows per block, so that every lane has work and a block is not
// one mostly idle warp.
template <typename T, bool kVec, bool kAdd, int kLanes>
OPS_FUSED_KERNEL(256) rms_norm_lanes_kernel(T* __restrict__ x, T* __restrict__ residual, const T* __restrict__ weight,
                                      T* __restrict__ y, int64_t rows, int64_t hidden, double eps) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kLanes;
  const bool active = row < rows;  // inactive lanes still join their warp's shuffles
  const int64_t r = active ? row : 0;
  rms_norm_row<T, kVec, kAdd, LaneGroupSum<kLanes>>(x + r * hidden, kAdd ? residual + r * hidden : nullptr, weight,
                                                    kAdd ? x + r * hidden : y + r * hidden, hidden, eps,
                                                    threadIdx.x % kLanes, kLanes, active);
}

// out (rows, d) = silu(x[:, :d]) * x[:, d:]; grid-stride over 16-byte packs (kVec) or elements.
template <typename T, bool kVec>
OPS_FUSED_KERNEL(256) silu_and_mul_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t rows, int64_t d) {
  using P = Pack<T>;
  const int64_t width = kVec ? d / P::kSize : d;  // packs or elements per row
  const int64_t total = rows * width;
  const int64_t start = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  // (row, col) of i = row * width + col, advanced by the stride without a 64-bit division per step.
  const int64_t stride_rows = stride / width, stride_cols = stride % width;
  int64_t row = start / width, col = start % width;
  for (int64_t i = start; i < total; i += stride) {
    const T* gate = x + row * 2 * d;
    const T* up = gate + d;
    if constexpr (kVec) {
      const P g = reinterpret_cast<const P*>(gate)[col];
      const P u = reinterpret_cast<const P*>(up)[col];
      P o;
#pragma unroll
      for (int j = 0; j < P::kSize; ++j) o.v[j] = from_acc<T>(silu<T>(to_acc(g.v[j])) * to_acc(u.v[j]));
      reinterpret_cast<P*>(out + row * d)[col] = o;
    } else {
      out[row * d + col] = from_acc<T>(silu<T>(to_acc(gate[col])) * to_acc(up[col]));
    }
    row += stride_rows;
    col += stride_cols;
    if (col >= width) {
      col -= width;
      ++row;
    }
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Threads for one row of `work` packs or elements: a multiple of 32 (block_sum's unit) up to 1024, each
// thread taking the same number of items (hidden 5120 in bf16, 640 packs: 640 threads, not 1024 with
// 384 idle).
int threads_for(int64_t work) {
  const int64_t per_thread = (work + 1023) / 1024;
  const int64_t threads = (work + per_thread - 1) / per_thread;
  return static_cast<int>((threads + 31) / 32 * 32);
}

template <typename T, bool kVec, bool kAdd, int kLanes>
void launch_rms_lanes(T* x, T* residual, const T* weight, T* y, int64_t rows, int64_t hidden, double eps,
                      cudaStream_t stream) {
  constexpr int kThreads = 256;
  constexpr int64_t kRowsPerBlock = kThreads / kLanes;
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  launch_kernel(rms_norm_lanes_kernel<T, kVec, kAdd, kLanes>, static_cast<unsigned>(blocks), kThreads, stream, x,
                residual, weight, y, rows, hidden, eps);
}

template <typename T, bool kVec, bool kAdd>
void launch_rms_rows(T* x, T* residual, const T* weight, T* y, int64_t rows, int64_t hidden, double eps,
                     cudaStream_t stream) {
  const int64_t work = kVec ? hidden / Pack<T>::kSize : hidden;  // packs or elements per row
  if (work <= 4) return launch_rms_lanes<T, kVec, kAdd, 4>(x, residual, weight, y, rows, hidden, eps, stream);
  if (work <= 8) return launch_rms_lanes<T, kVec, kAdd, 8>(x, residual, weight, y, rows, hidden, eps, stream);
  if (work <= 16) return launch_rms_lanes<T, kVec, kAdd, 16>(x, residual, weight, y, rows, hidden, eps, stream);
  if (work <= 32) return launch_rms_lanes<T, kVec, kAdd, 32>(x, residual, weight, y, rows, hidden, eps, stream);
  if constexpr (kVec) {
    const int packs = rms_packs_per_thread.load(std::memory_order_relaxed);
    const int max_threads = packs >= 8 ? kRegsMaxThreads<8> : kRegsMaxThreads<1>;
    if (packs > 0 && work <= static_cast<int64_t>(max_threads) * packs) {
      const int threads = static_cast<int>(((work + packs - 1) / packs + 31) / 32 * 32);
      const unsigned grid = static_cast<unsigned>(rows);
      switch (packs) {
        case 1: launch_kernel(rms_norm_regs_kernel<T, kAdd, 1>, grid, threads, stream, x, residual, weight, y, hidden, eps); return;
        case 2: launch_kernel(rms_norm_regs_kernel<T, kAdd, 2>, grid, threads, stream, x, residual, weight, y, hidden, eps); return;
        case 4: launch_kernel(rms_norm_regs_kernel<T, kAdd, 4>, grid, threads, stream, x, residual, weight, y, hidden, eps); return;
        default: launch_kernel(rms_norm_regs_kernel<T, kAdd, 8>, grid, threads, stream, x, residual, weight, y, hidden, eps); return;
      }
    }
  }
  launch_kernel(rms_norm_kernel<T, kVec, kAdd>, static_cast<unsigned>(rows), threads_for(work), stream, x, residual,
                weight, y, hidden, eps);
}

template <typename T, bool kAdd>
cudaError_t launch_rms(void* x, void* residual, const void* weight, void* y, int64_t rows, int64_t hidden,
                       double eps, cudaStream_t stream) {
  if (rows == 0 || hidden == 0) return cudaSuccess;
  constexpr int kPack = Pack<T>::kSize;
  const bool vec = hidden % kPack == 0 && aligned16(x) && aligned16(weight) &&
                   (!kAdd || aligned16(residual)) && (kAdd || aligned16(y));
  // Rows in chunks of at most 2^31 - 1: the grid's x limit for one block per row (and for the lane
  // kernels, which need fewer blocks).
  for (int64_t start = 0; start < rows; start += 2147483647LL) {
    const int64_t count = rows - start < 2147483647LL ? rows - start : 2147483647LL;
    T* xs = static_cast<T*>(x) + start * hidden;
    T* rs = kAdd ? static_cast<T*>(residual) + start * hidden : nullptr;
    T* ys = kAdd ? nullptr : static_cast<T*>(y) + start * hidden;
    const T* w = static_cast<const T*>(weight);
    if (vec) {
      launch_rms_rows<T, true, kAdd>(xs, rs, w, ys, count, hidden, eps, stream);
    } else {
      launch_rms_rows<T, false, kAdd>(xs, rs, w, ys, count, hidden, eps, stream);
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
    launch_kernel(silu_and_mul_kernel<T, true>, grid, threads, stream, static_cast<const T*>(x), static_cast<T*>(out), rows, d);
  } else {
    launch_kernel(silu_and_mul_kernel<T, false>, grid, threads, stream, static_cast<const T*>(x), static_cast<T*>(out), rows, d);
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

int set_rms_norm_packs_per_thread(int packs) {
  if (packs != 0 && packs != 1 && packs != 2 && packs != 4 && packs != 8) return -1;
  return rms_packs_per_thread.exchange(packs);
}

}  // namespace ops::fused
