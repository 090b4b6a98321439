// CUDA kernels of rms_norm, fused_add_rms_norm and silu_and_mul. Memory-bound: 16-byte vector loads
// and stores where the row length and pointers allow (else an element-wise path for the same kernel),
// fp32 accumulation (fp64 for double), any row length and number of rows, launched on the caller's
// stream. No torch headers (see fused_kernels.h). With OPS_FUSED_HOST_EMULATION this file compiles for
// the host and runs on emulated blocks (tests/cpp/fused_emulation.cpp).
#include "fused_kernels.h"
#include "fused_device.cuh"
#include "quantize_fp8_kernels.cuh"

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

// Op-reduction of `value` over the block (0 for the lanes past blockDim's last warp); every thread calls it.
template <typename Op, typename A>
OPS_FUSED_DEVICE_FN A block_reduce(A value) {
  OPS_SHARED A warp_values[32];
  for (int offset = 16; offset > 0; offset >>= 1) value = Op::apply(value, __shfl_xor_sync(0xffffffffu, value, offset));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_values[warp] = value;
  __syncthreads();
  const int warps = (blockDim.x + 31) / 32;
  value = static_cast<int>(threadIdx.x) < warps ? warp_values[threadIdx.x] : A(0);
  if (warp == 0) {
    for (int offset = 16; offset > 0; offset >>= 1) value = Op::apply(value, __shfl_xor_sync(0xffffffffu, value, offset));
    if (lane == 0) warp_values[0] = value;
  }
  __syncthreads();
  const A total = warp_values[0];
  __syncthreads();  // warp_values may be reused by the caller's next reduction
  return total;
}

template <typename A>
OPS_FUSED_DEVICE_FN A block_sum(A value) { return block_reduce<Add>(value); }

// How the threads working on one row combine their partial results: the whole block, or a group of kLanes
// lanes of one warp (shuffles only). sum: of the squares; max: the FP8 forms' amax.
struct BlockSum {
  template <typename A>
  OPS_FUSED_DEVICE_FN static A sum(A value) { return block_sum(value); }
  OPS_FUSED_DEVICE_FN static float max(float value) { return block_reduce<NanMax>(value); }
};
template <int kLanes>
struct LaneGroupSum {
  template <typename A>
  OPS_FUSED_DEVICE_FN static A sum(A value) { return lane_group_reduce<kLanes, Add>(value); }
  OPS_FUSED_DEVICE_FN static float max(float value) { return lane_group_reduce<kLanes, NanMax>(value); }
};

// Pass 1 of a row of rms_norm, by `nthreads` threads (this one is `tid`; `active` false: a thread without
// a row that still takes part in the reduction): 1 / rms of the row. kVec: hidden % Pack::kSize == 0 and
// 16-byte aligned rows. With kAdd: residual = x + residual (stored) first, and the rms is residual's. The
// FP8 forms call it as rms_norm_row does, so that their rows have the same 1 / rms, bit for bit.
template <typename T, bool kVec, bool kAdd, typename Sum>
OPS_FUSED_DEVICE typename Acc<T>::type rms_inv(T* xr, T* rr, int64_t hidden, double eps, int tid, int nthreads,
                                               bool active) {
  using A = typename Acc<T>::type;
  using P = Pack<T>;
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
  return A(1) / sqrt(Sum::sum(sum_sq) / static_cast<A>(hidden) + static_cast<A>(eps));
}

// One row of rms_norm (rms_inv, then the normalised row stored to `out`, each element `normalised`). With
// kAdd (fused_add_rms_norm): residual = x + residual (stored), then x = rms_norm(residual).
template <typename T, bool kVec, bool kAdd, typename Sum>
OPS_FUSED_DEVICE void rms_norm_row(T* xr, T* rr, const T* weight, T* out, int64_t hidden, double eps,
                                   bool round_x_hat, int tid, int nthreads, bool active) {  // out == xr with kAdd
  using A = typename Acc<T>::type;
  using P = Pack<T>;
  const T* in = kAdd ? rr : xr;  // what is normalised
  const int64_t n = active ? (kVec ? hidden / P::kSize : hidden) : 0;  // packs or elements of this row
  const A inv = rms_inv<T, kVec, kAdd, Sum>(xr, rr, hidden, eps, tid, nthreads, active);
  // Second pass: each thread re-reads the elements it wrote/read itself (no barrier needed beyond the
  // reduction's), from L1/L2.
  for (int64_t i = tid; i < n; i += nthreads) {
    if constexpr (kVec) {
      const P a = reinterpret_cast<const P*>(in)[i];
      const P w = reinterpret_cast<const P*>(weight)[i];
      P o;
#pragma unroll
      for (int j = 0; j < P::kSize; ++j) o.v[j] = normalised<T>(to_acc(a.v[j]), inv, to_acc(w.v[j]), round_x_hat);
      reinterpret_cast<P*>(out)[i] = o;
    } else {
      out[i] = normalised<T>(to_acc(in[i]), inv, to_acc(weight[i]), round_x_hat);
    }
  }
}

// One block per row (rows of more than 32 packs or elements).
template <typename T, bool kVec, bool kAdd>
OPS_FUSED_KERNEL(1024)
    rms_norm_kernel(T* __restrict__ x, T* __restrict__ residual, const T* __restrict__ weight, T* __restrict__ y,
                    int64_t hidden, double eps, bool round_x_hat) {
  const int64_t row = blockIdx.x;
  rms_norm_row<T, kVec, kAdd, BlockSum>(x + row * hidden, kAdd ? residual + row * hidden : nullptr, weight,
                                        kAdd ? x + row * hidden : y + row * hidden, hidden, eps, round_x_hat,
                                        threadIdx.x, blockDim.x, true);
}

// Threads per block of rms_norm_regs_kernel<kPacks>: with 8 packs a thread holds 64 bytes of row and
// needs 80-110 registers (ptxas, sm_90a, CUDA 13.0), more than the 64 that 1024 threads leave (65536
// per SM): 1024 threads would fail to launch ("too many resources requested").
template <int kPacks>
constexpr int kRegsMaxThreads = kPacks >= 8 ? 512 : 1024;

// Min blocks per SM of the 256-thread kernels: float64 values take two registers each, and at ptxas's default
// budget (32) the float64 rms_norm lanes and silu_and_mul kernels spilled around their division and sqrt
// subroutines (8-16 bytes of stack on sm_90a); 4 blocks leave them 64. 0: no bound (the default).
template <typename T>
constexpr int kMinBlocks256 = std::is_same_v<T, double> ? 4 : 0;

// One block per row of 16-byte packs, each thread holding up to kPacks packs (indices tid + j * blockDim)
// in registers between the two passes: its kPacks loads go out back to back, and the second pass
// reads only the weight. Requires hidden / Pack::kSize <= kPacks * blockDim.x and 16-byte aligned rows.
// One block per SM as the bound: at the default budget the half types spilled at 4 packs and float64 at 8.
template <typename T, bool kAdd, int kPacks>
OPS_FUSED_KERNEL(kRegsMaxThreads<kPacks>, 1)
    rms_norm_regs_kernel(T* __restrict__ x, T* __restrict__ residual, const T* __restrict__ weight,
                         T* __restrict__ y, int64_t hidden, double eps, bool round_x_hat) {
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
      for (int k = 0; k < P::kSize; ++k) o.v[k] = normalised<T>(to_acc(a[j].v[k]), inv, to_acc(w.v[k]), round_x_hat);
      out[i] = o;
    }
  }
}

std::atomic<int> rms_packs_per_thread{0};  // set_rms_norm_packs_per_thread

// Short rows (at most 32 packs or elements, e.g. per-head q/k norms of 128 half values = 16 packs): one
// group of kLanes lanes per row, many rows per block, so that every lane has work and a block is not
// one mostly idle warp.
template <typename T, bool kVec, bool kAdd, int kLanes>
OPS_FUSED_KERNEL(256, kMinBlocks256<T>) rms_norm_lanes_kernel(T* __restrict__ x, T* __restrict__ residual, const T* __restrict__ weight,
                                      T* __restrict__ y, int64_t rows, int64_t hidden, double eps,
                                      bool round_x_hat) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kLanes;
  const bool active = row < rows;  // inactive lanes still join their warp's shuffles
  const int64_t r = active ? row : 0;
  rms_norm_row<T, kVec, kAdd, LaneGroupSum<kLanes>>(x + r * hidden, kAdd ? residual + r * hidden : nullptr, weight,
                                                    kAdd ? x + r * hidden : y + r * hidden, hidden, eps, round_x_hat,
                                                    threadIdx.x % kLanes, kLanes, active);
}

// Where a row of an FP8 norm goes (fused_kernels.h's RmsNormFp8Args).
struct RmsFp8Out {
  unsigned char* codes;  // (rows, hidden)
  float* scales;  // (rows, 1) or (rows, groups); null with `given`
  const float* given;
  int64_t given_stride;
  bool e5m2, groups, pow2, round_x_hat;
};

// One row of rms_norm_fp8 / fused_add_rms_norm_fp8 (kAdd; x is read, not written): rms_inv as
// rms_norm_row calls it, each element of the normalised row computed as rms_norm_row stores it, then
// quantized as quantize_fp8 does (quantize_fp8_kernels.cuh): per row, the amax reduced like the sum
// and the codes stored in a third pass; per 1x128 group, the groups of each pass of the threads over
// the row reduced by shuffles within their lanes (a row of more than one group has more than 128 / pack
// packs, so the threads on it are whole groups of lanes: a block of warps, or a lane group of 32).
template <typename T, bool kAdd, typename Sum>
OPS_FUSED_DEVICE void rms_norm_fp8_row(T* xr, T* rr, const T* weight, int64_t row, int64_t hidden, double eps,
                                       int tid, int nthreads, bool active, const RmsFp8Out& o) {
  using P = Pack<T>;
  const float inv = rms_inv<T, true, kAdd, Sum>(xr, rr, hidden, eps, tid, nthreads, active);
  const T* in = kAdd ? rr : xr;
  const int64_t packs = hidden / P::kSize;
  const int64_t n = active ? packs : 0;
  const auto normalised_pack = [&](int64_t i) {
    const P a = reinterpret_cast<const P*>(in)[i];
    const P w = reinterpret_cast<const P*>(weight)[i];
    P y;
#pragma unroll
    for (int j = 0; j < P::kSize; ++j) y.v[j] = normalised<T>(to_acc(a.v[j]), inv, to_acc(w.v[j]), o.round_x_hat);
    return y;
  };
  unsigned char* codes = o.codes + row * hidden;
  const auto store = [&](int64_t i, const P& y, float s) {
    o.e5m2 ? quant::store_codes<T, true>(codes, i, y, s) : quant::store_codes<T, false>(codes, i, y, s);
  };
  const float max = quant::fp8_max(o.e5m2);
  const int64_t groups = (hidden + quant::kGroupSize - 1) / quant::kGroupSize;
  if (!o.groups || groups == 1) {
    float amax = 0.0f;
    if (o.given == nullptr) {
      for (int64_t i = tid; i < n; i += nthreads) amax = nan_max(amax, quant::pack_amax(normalised_pack(i)));
      amax = Sum::max(amax);
    }
    const float s = o.given != nullptr ? o.given[row * o.given_stride] : quant::scale_of(amax, max, o.pow2);
    for (int64_t i = tid; i < n; i += nthreads) store(i, normalised_pack(i), s);
    if (active && tid == 0 && o.scales != nullptr) o.scales[row * (o.groups ? groups : 1)] = s;
  } else {
    constexpr int kLanes = quant::kGroupSize / P::kSize;  // lanes per group
    for (int64_t base = 0; base < packs; base += nthreads) {  // the same trips for every lane: shuffles inside
      const int64_t i = base + tid;
      const bool valid = active && i < packs;
      const P y = valid ? normalised_pack(i) : P{};
      const float amax = lane_group_reduce<kLanes, NanMax>(valid ? quant::pack_amax(y) : 0.0f);
      const int64_t group = i / kLanes;
      if (!active || group >= groups) continue;
      const float s = o.given != nullptr ? o.given[row * o.given_stride + group] : quant::scale_of(amax, max, o.pow2);
      if (valid) store(i, y, s);
      if (o.scales != nullptr && i % kLanes == 0) o.scales[row * groups + group] = s;
    }
  }
}

// rms_norm_kernel's FP8 form: one block per row.
template <typename T, bool kAdd>
OPS_FUSED_KERNEL(1024)
    rms_norm_fp8_kernel(T* __restrict__ x, T* __restrict__ residual, const T* __restrict__ weight, int64_t hidden,
                        double eps, RmsFp8Out out) {
  const int64_t row = blockIdx.x;
  rms_norm_fp8_row<T, kAdd, BlockSum>(x + row * hidden, kAdd ? residual + row * hidden : nullptr, weight, row, hidden,
                                      eps, threadIdx.x, blockDim.x, true, out);
}

// rms_norm_lanes_kernel's FP8 form.
template <typename T, bool kAdd, int kLanes>
OPS_FUSED_KERNEL(256)
    rms_norm_fp8_lanes_kernel(T* __restrict__ x, T* __restrict__ residual, const T* __restrict__ weight, int64_t rows,
                              int64_t hidden, double eps, RmsFp8Out out) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kLanes;
  const bool active = row < rows;  // inactive lanes still join their warp's shuffles
  const int64_t r = active ? row : 0;
  rms_norm_fp8_row<T, kAdd, LaneGroupSum<kLanes>>(x + r * hidden, kAdd ? residual + r * hidden : nullptr, weight, r,
                                                  hidden, eps, threadIdx.x % kLanes, kLanes, active, out);
}

// out (rows, d) = silu(x[:, :d]) * x[:, d:]; grid-stride over 16-byte packs (kVec) or elements.
template <typename T, bool kVec>
OPS_FUSED_KERNEL(256, kMinBlocks256<T>) silu_and_mul_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t rows, int64_t d) {
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

template <int kLanes>
using Lanes = std::integral_constant<int, kLanes>;
constexpr int kLanesThreads = 256;  // per block of the lane kernels

// The rms_norm kernel for rows of `work` packs or elements: launch(Lanes<k>{}) for the lane kernel of k
// lanes per row, launch(Lanes<0>{}) for one block of threads_for(work) threads per row. rms_norm and its
// FP8 forms choose alike, so that their sums of squares run in the same order.
template <typename Launch>
void choose_rms_kernel(int64_t work, Launch&& launch) {
  if (work <= 4) return launch(Lanes<4>{});
  if (work <= 8) return launch(Lanes<8>{});
  if (work <= 16) return launch(Lanes<16>{});
  if (work <= 32) return launch(Lanes<32>{});
  return launch(Lanes<0>{});
}

unsigned lane_blocks(int64_t rows, int lanes) {
  const int64_t rows_per_block = kLanesThreads / lanes;
  return static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block);
}

template <typename T, bool kVec, bool kAdd>
void launch_rms_rows(T* x, T* residual, const T* weight, T* y, int64_t rows, int64_t hidden, double eps,
                     bool round_x_hat, cudaStream_t stream) {
  const int64_t work = kVec ? hidden / Pack<T>::kSize : hidden;  // packs or elements per row
  if constexpr (kVec) {
    const int packs = rms_packs_per_thread.load(std::memory_order_relaxed);
    const int max_threads = packs >= 8 ? kRegsMaxThreads<8> : kRegsMaxThreads<1>;
    if (work > 32 && packs > 0 && work <= static_cast<int64_t>(max_threads) * packs) {
      const int threads = static_cast<int>(((work + packs - 1) / packs + 31) / 32 * 32);
      const unsigned grid = static_cast<unsigned>(rows);
      switch (packs) {
        case 1: launch_kernel(rms_norm_regs_kernel<T, kAdd, 1>, grid, threads, stream, x, residual, weight, y, hidden, eps, round_x_hat); return;
        case 2: launch_kernel(rms_norm_regs_kernel<T, kAdd, 2>, grid, threads, stream, x, residual, weight, y, hidden, eps, round_x_hat); return;
        case 4: launch_kernel(rms_norm_regs_kernel<T, kAdd, 4>, grid, threads, stream, x, residual, weight, y, hidden, eps, round_x_hat); return;
        default: launch_kernel(rms_norm_regs_kernel<T, kAdd, 8>, grid, threads, stream, x, residual, weight, y, hidden, eps, round_x_hat); return;
      }
    }
  }
  choose_rms_kernel(work, [&](auto lanes) {
    if constexpr (lanes.value == 0) {
      launch_kernel(rms_norm_kernel<T, kVec, kAdd>, static_cast<unsigned>(rows), threads_for(work), stream, x,
                    residual, weight, y, hidden, eps, round_x_hat);
    } else {
      launch_kernel(rms_norm_lanes_kernel<T, kVec, kAdd, lanes.value>, lane_blocks(rows, lanes.value), kLanesThreads,
                    stream, x, residual, weight, y, rows, hidden, eps, round_x_hat);
    }
  });
}

template <typename T, bool kAdd>
cudaError_t launch_rms(void* x, void* residual, const void* weight, void* y, int64_t rows, int64_t hidden,
                       double eps, bool round_x_hat, cudaStream_t stream) {
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
      launch_rms_rows<T, true, kAdd>(xs, rs, w, ys, count, hidden, eps, round_x_hat, stream);
    } else {
      launch_rms_rows<T, false, kAdd>(xs, rs, w, ys, count, hidden, eps, round_x_hat, stream);
    }
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

template <typename T, bool kAdd>
cudaError_t launch_rms_fp8(const RmsNormFp8Args& a, cudaStream_t stream) {
  const int64_t work = a.hidden / Pack<T>::kSize;
  const int64_t groups = (a.hidden + quant::kGroupSize - 1) / quant::kGroupSize;
  const int64_t scales_per_row = a.groups ? groups : 1;
  for (int64_t start = 0; start < a.rows; start += 2147483647LL) {  // the grid's x limit, as launch_rms
    const int64_t rows = a.rows - start < 2147483647LL ? a.rows - start : 2147483647LL;
    T* x = static_cast<T*>(const_cast<void*>(a.x)) + start * a.hidden;
    T* r = kAdd ? static_cast<T*>(a.residual) + start * a.hidden : nullptr;
    const T* w = static_cast<const T*>(a.weight);
    const RmsFp8Out out{a.codes + start * a.hidden, a.scales == nullptr ? nullptr : a.scales + start * scales_per_row,
                        a.given == nullptr ? nullptr : a.given + start * a.given_stride, a.given_stride, a.e5m2,
                        a.groups, a.pow2, a.round_x_hat};
    choose_rms_kernel(work, [&](auto lanes) {
      if constexpr (lanes.value == 0) {
        launch_kernel(rms_norm_fp8_kernel<T, kAdd>, static_cast<unsigned>(rows), threads_for(work), stream, x, r, w,
                      a.hidden, a.eps, out);
      } else {
        launch_kernel(rms_norm_fp8_lanes_kernel<T, kAdd, lanes.value>, lane_blocks(rows, lanes.value), kLanesThreads,
                      stream, x, r, w, rows, a.hidden, a.eps, out);
      }
    });
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

// silu_and_mul's most blocks: past 65535 * 32 blocks of 256 threads (5.4e8 packs) its grid-stride loop
// wraps. The host emulation lowers it to run the wrap on small inputs.
#if defined(OPS_FUSED_HOST_EMULATION)
int64_t silu_max_blocks = 65535LL * 32;
#else
constexpr int64_t silu_max_blocks = 65535LL * 32;
#endif

template <typename T>
cudaError_t launch_silu(const void* x, void* out, int64_t rows, int64_t d, cudaStream_t stream) {
  if (rows == 0 || d == 0) return cudaSuccess;
  constexpr int kPack = Pack<T>::kSize;
  const bool vec = d % kPack == 0 && aligned16(x) && aligned16(out);
  const int64_t work = rows * (vec ? d / kPack : d);
  const int threads = 256;
  const int64_t blocks = (work + threads - 1) / threads;
  const unsigned grid = static_cast<unsigned>(blocks < silu_max_blocks ? blocks : silu_max_blocks);
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
  static cudaError_t run(const void* x, const void* w, void* y, int64_t rows, int64_t hidden, double eps, bool round,
                         cudaStream_t s) {
    return launch_rms<T, false>(const_cast<void*>(x), nullptr, w, y, rows, hidden, eps, round, s);
  }
};
template <typename T> struct AddRmsFn {
  static cudaError_t run(void* x, void* r, const void* w, int64_t rows, int64_t hidden, double eps, bool round,
                         cudaStream_t s) {
    return launch_rms<T, true>(x, r, w, nullptr, rows, hidden, eps, round, s);
  }
};
template <typename T> struct SiluFn {
  static cudaError_t run(const void* x, void* out, int64_t rows, int64_t d, cudaStream_t s) {
    return launch_silu<T>(x, out, rows, d, s);
  }
};

}  // namespace

cudaError_t rms_norm(int dtype, const void* x, const void* weight, void* y, int64_t rows, int64_t hidden,
                     double eps, bool round_x_hat, cudaStream_t stream) {
  return dispatch<RmsFn>(dtype, x, weight, y, rows, hidden, eps, round_x_hat, stream);
}

cudaError_t fused_add_rms_norm(int dtype, void* x, void* residual, const void* weight, int64_t rows,
                               int64_t hidden, double eps, bool round_x_hat, cudaStream_t stream) {
  return dispatch<AddRmsFn>(dtype, x, residual, weight, rows, hidden, eps, round_x_hat, stream);
}

cudaError_t silu_and_mul(int dtype, const void* x, void* out, int64_t rows, int64_t d, cudaStream_t stream) {
  return dispatch<SiluFn>(dtype, x, out, rows, d, stream);
}

bool rms_norm_fp8_supported(int dtype, const void* x, const void* residual, const void* weight, int64_t hidden) {
  return (dtype == kF16 || dtype == kBF16 || dtype == kF32) && hidden > 0 &&
         hidden % (dtype == kF32 ? 4 : 8) == 0 && aligned16(x) && aligned16(weight) &&
         (residual == nullptr || aligned16(residual)) && rms_packs_per_thread.load(std::memory_order_relaxed) == 0;
}

cudaError_t rms_norm_fp8(const RmsNormFp8Args& args, cudaStream_t stream) {
  if (!rms_norm_fp8_supported(args.dtype, args.x, args.residual, args.weight, args.hidden)) return cudaErrorNotSupported;
  if (args.rows == 0) return cudaSuccess;
  const bool add = args.residual != nullptr;
  switch (args.dtype) {
    case kF16: return add ? launch_rms_fp8<__half, true>(args, stream) : launch_rms_fp8<__half, false>(args, stream);
    case kBF16:
      return add ? launch_rms_fp8<__nv_bfloat16, true>(args, stream) : launch_rms_fp8<__nv_bfloat16, false>(args, stream);
    default: return add ? launch_rms_fp8<float, true>(args, stream) : launch_rms_fp8<float, false>(args, stream);
  }
}

#if defined(OPS_FUSED_HOST_EMULATION)
int64_t set_silu_max_blocks(int64_t blocks) {
  const int64_t before = silu_max_blocks;
  silu_max_blocks = blocks;
  return before;
}
#endif

int set_rms_norm_packs_per_thread(int packs) {
  if (packs != 0 && packs != 1 && packs != 2 && packs != 4 && packs != 8) return -1;
  return rms_packs_per_thread.exchange(packs);
}

}  // namespace ops::fused
