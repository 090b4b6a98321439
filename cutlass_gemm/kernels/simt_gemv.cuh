// The SimtGemv configuration of kernel_list.h: a hand-written CUDA-core kernel (no CUTLASS templates)
// for decode-sized GEMMs, D (M x N) = A (M x K, row-major) @ B (K x N, column-major, i.e. an nn.Linear
// weight W (N x K) row-major), M <= 16, with the same epilogues as the CUTLASS kernels (bias + the
// activation functors of cutlass_common.cuh, in fp32) and fp32 accumulation.
//
// Why: at M <= 16 a GEMM against a weight is a stream of the weight (2 N K bytes) and little else; the
// tensor-core kernels compute 128-row tiles whose rows are mostly empty and split K across CTAs to keep
// the SMs busy (stream-K / split-K, with a reduction through a workspace). Here every weight byte is
// loaded once, 16 bytes per lane, by many independent warps (memory-level parallelism is what reaches
// the bandwidth), and multiplied on the CUDA cores with every row of A: M x N x K fused multiply-adds,
// ~4 us of an H200's fp32 rate at M = 8, N = K = 4096, under the ~8 us its 32 MB take at ~4 TB/s. At
// M = 16 the two are about equal; beyond, tensor cores win. A candidate tactic only (tactic.cpp):
// `benchmarks.gemm --candidates` and the autotuner measure it against the CUTLASS kernels.
//
// Work split: a warp owns kColumnsPerWarp consecutive columns of D (rows of W) and all M rows; its lanes
// take interleaved 16-byte chunks of K (lane l: elements 8 l, 8 l + 256, ...), each lane accumulating
// M x kColumnsPerWarp partial dot products, combined at the end by a reduce-scatter across the warp
// (each shuffle step halves the values a lane holds: V - 1 shuffles for V = M x 4 partial sums, instead
// of 5 V for a butterfly per value). kWarps warps per block, on different columns.
//
// Host emulation: with OPS_SIMT_GEMV_HOST_EMULATION defined, and tests/cpp/warp_emulation.h included
// first (threadIdx, blockIdx, __ldcs, __ldg, __shfl_xor_sync, emulate_launch), this file compiles with a
// host C++ compiler and the kernel runs on emulated lock-step warps: tests/test_simt_gemv_emulation.py
// checks it without a GPU (every row-count variant, ragged N and K, epilogues, bounds of every load).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cutlass_common.cuh"

#if defined(OPS_SIMT_GEMV_HOST_EMULATION)
#define OPS_GEMV_DEVICE inline
#define OPS_GEMV_KERNEL(threads) void
#else
#define OPS_GEMV_DEVICE __device__ __forceinline__
#define OPS_GEMV_KERNEL(threads) __global__ void __launch_bounds__(threads)
#endif

namespace ops::cutlass_gemm::simt_gemv {

constexpr int kColumnsPerWarp = 4;
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kChunk = 8;  // elements per 16-byte load

// Two 16-bit values packed in a 32-bit word, to floats.
template <typename Element>
OPS_GEMV_DEVICE float2 unpack2(uint32_t bits);
template <>
OPS_GEMV_DEVICE float2 unpack2<cutlass::bfloat16_t>(uint32_t bits) {
  // bfloat16 is the upper half of a float32.
  return make_float2(__uint_as_float(bits << 16), __uint_as_float(bits & 0xffff0000u));
}
template <>
OPS_GEMV_DEVICE float2 unpack2<cutlass::half_t>(uint32_t bits) {
  __half2 h;
  memcpy(&h, &bits, sizeof h);
  return __half22float2(h);
}

template <typename Element>
OPS_GEMV_DEVICE void unpack8(const uint4& v, float (&out)[kChunk]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = unpack2<Element>(words[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

// Sums v[] over the 32 lanes of the warp, spreading the V sums across lanes: afterwards the lane holds
// the sums of indices first + j in v[j], j < max(V / 32, 1), where first is the value returned (for
// V < 32, lanes that differ only in their low 5 - log2(V) bits hold the same sums).
template <int V>
OPS_GEMV_DEVICE int reduce_scatter(float (&v)[V], int lane) {
  static_assert(V > 0 && (V & (V - 1)) == 0, "V must be a power of two");
  int first = 0;
  int width = V;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    if (width > 1) {
      const int half = width / 2;
      const bool upper = (lane & offset) != 0;
#pragma unroll
      for (int j = 0; j < V / 2; ++j) {
        if (j < half) {
          const float send = upper ? v[j] : v[j + half];
          const float keep = upper ? v[j + half] : v[j];
          v[j] = keep + __shfl_xor_sync(0xffffffffu, send, offset);
        }
      }
      if (upper) first += half;
      width = half;
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], offset);
    }
  }
  return first;
}

template <int V>
constexpr int values_per_lane() { return V >= 32 ? V / 32 : 1; }

// Lanes that write: for V < 32 one lane per group of lanes holding the same sums.
template <int V>
OPS_GEMV_DEVICE bool writes(int lane) {
  if constexpr (V >= 32) {
    return true;
  } else {
    return (lane & (32 / V - 1)) == 0;
  }
}

template <typename Element, Epilogue kEpilogue, int kRows, int kUnroll>
OPS_GEMV_KERNEL(kThreads) kernel(const Element* __restrict__ a, const Element* __restrict__ b,
                                 Element* __restrict__ d, const Element* __restrict__ bias, int m, int n, int k,
                                 int64_t lda, int64_t ldb, int64_t ldd) {
#if defined(OPS_SIMT_GEMV_HOST_EMULATION) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900)
  const int lane = threadIdx.x & 31;
  const int64_t column0 = (static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5)) * kColumnsPerWarp;
  if (column0 >= n) return;  // the whole warp
  // Columns past N read column N - 1 (valid memory) and are not stored.
  const Element* w[kColumnsPerWarp];
#pragma unroll
  for (int c = 0; c < kColumnsPerWarp; ++c) {
    w[c] = b + (column0 + c < n ? column0 + c : n - 1) * ldb;
  }
  float acc[kRows * kColumnsPerWarp];
#pragma unroll
  for (int i = 0; i < kRows * kColumnsPerWarp; ++i) acc[i] = 0.0f;

  constexpr int kStep = 32 * kChunk;  // elements of K per warp-wide load
  for (int k0 = lane * kChunk; k0 < k; k0 += kStep * kUnroll) {
    // Every weight load of this iteration first (kUnroll x kColumnsPerWarp independent 16-byte loads in
    // flight per lane), streamed past L1: each weight byte is read once.
    uint4 wv[kUnroll][kColumnsPerWarp];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int kk = k0 + u * kStep;
#pragma unroll
      for (int c = 0; c < kColumnsPerWarp; ++c) {
        wv[u][c] = kk < k ? __ldcs(reinterpret_cast<const uint4*>(w[c] + kk)) : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int kk = k0 + u * kStep;
      if (kk >= k) break;
      float wf[kColumnsPerWarp][kChunk];
#pragma unroll
      for (int c = 0; c < kColumnsPerWarp; ++c) unpack8<Element>(wv[u][c], wf[c]);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r < m) {  // kRows is M rounded up to a power of two; the branch is warp-uniform
          // A is small and read by every warp: through the caches.
          float xf[kChunk];
          unpack8<Element>(__ldg(reinterpret_cast<const uint4*>(a + r * lda + kk)), xf);
#pragma unroll
          for (int c = 0; c < kColumnsPerWarp; ++c) {
#pragma unroll
            for (int e = 0; e < kChunk; ++e) acc[r * kColumnsPerWarp + c] = fmaf(xf[e], wf[c][e], acc[r * kColumnsPerWarp + c]);
          }
        }
      }
    }
  }

  constexpr int V = kRows * kColumnsPerWarp;
  const int first = reduce_scatter<V>(acc, lane);
  if (!writes<V>(lane)) return;
  using Activation = typename ActivationFor<kEpilogue, float>::type;
#pragma unroll
  for (int j = 0; j < values_per_lane<V>(); ++j) {
    const int index = first + j;
    const int r = index / kColumnsPerWarp;
    const int64_t column = column0 + index % kColumnsPerWarp;
    if (r < m && column < n) {
      float x = acc[j];
      if constexpr (kEpilogue != Epilogue::Plain) {
        if (bias != nullptr) x += static_cast<float>(bias[column]);
      }
      d[r * ldd + column] = static_cast<Element>(Activation()(x));
    }
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // dispatched where it has no body: an error, never an unwritten output
#endif
}

template <typename Element, Epilogue kEpilogue, int kRows>
void launch(const GemmLaunchArgs& args, cudaStream_t stream) {
  constexpr int kUnroll = kRows <= 4 ? 4 : 2;  // registers: weight prefetch vs accumulators
  const int64_t columns_per_block = kWarps * kColumnsPerWarp;
  const dim3 grid(static_cast<unsigned>((args.n + columns_per_block - 1) / columns_per_block));
#if defined(OPS_SIMT_GEMV_HOST_EMULATION)
  (void)stream;
  emulate_launch(grid, kThreads, kernel<Element, kEpilogue, kRows, kUnroll>,
#else
  kernel<Element, kEpilogue, kRows, kUnroll><<<grid, kThreads, 0, stream>>>(
#endif
      static_cast<const Element*>(args.a), static_cast<const Element*>(args.b), static_cast<Element*>(args.d),
      static_cast<const Element*>(args.bias), static_cast<int>(args.m), static_cast<int>(args.n),
      static_cast<int>(args.k), args.lda, args.ldb, args.ldd);
}

template <KernelId kId>
LaunchStatus run(const GemmLaunchArgs& args, cudaStream_t stream) {
  using Traits = KernelTraits<kId>;
  static_assert(Traits::info.config == TileConfig::SimtGemv && Traits::info.a == Layout::Row &&
                Traits::info.b == Layout::Col && sizeof(typename Traits::Element) == 2);
  using Element = typename Traits::Element;
  constexpr Epilogue kEpilogue = Traits::info.epilogue;
  if (args.m < 1 || args.m > kSimtGemvMaxRows || args.n < 1 || args.k < 1 ||
      args.k > INT32_MAX - kChunk * 32 * 4 || args.n > INT32_MAX) {
    return {false, "the SIMT GEMV kernel takes 1 <= M <= 16 (and N, K below 2^31)"};
  }
  const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (args.k % kChunk != 0 || args.lda % kChunk != 0 || args.ldb % kChunk != 0 || !aligned16(args.a) ||
      !aligned16(args.b)) {
    return {false, "the SIMT GEMV kernel needs K, lda and ldb multiples of 8 and 16-byte aligned A and B"};
  }
  static_assert(kSimtGemvMaxRows == 16, "the row-count dispatch below ends at 16 rows");
  if (args.m == 1) {
    launch<Element, kEpilogue, 1>(args, stream);
  } else if (args.m == 2) {
    launch<Element, kEpilogue, 2>(args, stream);
  } else if (args.m <= 4) {
    launch<Element, kEpilogue, 4>(args, stream);
  } else if (args.m <= 8) {
    launch<Element, kEpilogue, 8>(args, stream);
  } else {
    launch<Element, kEpilogue, 16>(args, stream);
  }
#if !defined(OPS_SIMT_GEMV_HOST_EMULATION)
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return {false, cudaGetErrorString(err)};
#endif
  return {};
}

}  // namespace ops::cutlass_gemm::simt_gemv

// Defines <name>_workspace_size (none), <name>_run and <name>_kernel_problem (not a CUTLASS 2.x
// kernel: unknown) for one SimtGemv entry of kernel_list.h.
#define OPS_DEFINE_SIMT_GEMV(name)                                                              \
  namespace ops::cutlass_gemm {                                                                \
  size_t name##_workspace_size(const GemmLaunchArgs&) { return 0; }                            \
  LaunchStatus name##_run(const GemmLaunchArgs& args, void*, size_t, cudaStream_t stream) {    \
    return simt_gemv::run<KernelId::name>(args, stream);                                       \
  }                                                                                            \
  KernelProblem name##_kernel_problem(const GemmLaunchArgs&) { return {}; }                    \
  }
