// Lock-step emulation of CUDA thread blocks on the host, for kernels that use threadIdx.x, blockIdx.x,
// blockDim.x, gridDim.x, 16-byte loads (__ldcs, __ldg), __shfl_xor_sync with a full mask (float or
// double), __syncthreads and shared memory declared `static` in emulation (cutlass_gemm/kernels/simt_gemv.cuh
// with OPS_SIMT_GEMV_HOST_EMULATION; csrc/fused_device.cuh and csrc/quantize_fp8_kernels.cuh with
// OPS_FUSED_HOST_EMULATION). One host thread per CUDA thread of a block; the blocks run one after
// another, all threads of a block together. Checks, aborting with a message:
//   * every __ldcs / __ldg load lies inside a registered buffer (emulation::allow_reads) and is 16-byte
//     aligned;
//   * the lanes of a warp call __shfl_xor_sync at the same points (no divergence before a shuffle) and
//     as often (a lane that returned early while others shuffle is caught at the end of the block);
//   * the threads of a block reach each __syncthreads together and call it as often.
#pragma once

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include <vector_functions.h>
#include <vector_types.h>

namespace emulation {

struct Index {
  unsigned x = 1, y = 1, z = 1;
};

struct Buffer {
  const char* base;
  size_t bytes;
};

inline std::vector<Buffer>& readable() {
  static std::vector<Buffer> buffers;
  return buffers;
}

// The buffers a launch may read (replacing the previous list).
inline void allow_reads(std::vector<Buffer> buffers) { readable() = std::move(buffers); }

inline void check_load(const void* p, size_t n, const char* what) {
  const char* c = static_cast<const char*>(p);
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
    std::fprintf(stderr, "emulation: misaligned %s load at %p\n", what, p);
    std::abort();
  }
  for (const Buffer& b : readable()) {
    if (c >= b.base && c + n <= b.base + b.bytes) return;
  }
  std::fprintf(stderr, "emulation: %s load at %p outside every buffer\n", what, p);
  std::abort();
}

// The threads of one group (a warp, or the block) and where each of them is.
struct Group {
  explicit Group(int n) : barrier(n), tags(static_cast<size_t>(n)) {}
  std::barrier<> barrier;
  std::vector<long> tags;
  double slots[32] = {};  // a warp's shuffle values
};

inline thread_local Group* warp = nullptr;
inline thread_local int lane_id = 0;
inline thread_local long shuffles = 0;
inline Group* block = nullptr;
inline thread_local int thread_id = 0;
inline thread_local long syncs = 0;

// All members of `g` arrive with the same tag, or they diverged.
inline void converge(Group& g, int me, long tag, const char* what) {
  g.tags[static_cast<size_t>(me)] = tag;
  g.barrier.arrive_and_wait();
  for (size_t t = 0; t < g.tags.size(); ++t) {
    if (g.tags[t] != tag) {
      std::fprintf(stderr, "emulation: divergent %s: thread %d at %ld, thread %zu at %ld\n", what, me, tag, t,
                   g.tags[t]);
      std::abort();
    }
  }
  g.barrier.arrive_and_wait();
}

template <typename V>
V shfl_xor(unsigned mask, V value, int offset) {
  if (mask != 0xffffffffu) {
    std::fprintf(stderr, "emulation: only full-warp shuffles are emulated\n");
    std::abort();
  }
  ++shuffles;
  warp->slots[lane_id] = static_cast<double>(value);  // float and double values are exact in a double
  converge(*warp, lane_id, shuffles * 64 + offset, "warp");  // every lane wrote, at the same shuffle
  const V received = static_cast<V>(warp->slots[lane_id ^ offset]);
  warp->barrier.arrive_and_wait();  // every lane read before the next shuffle writes
  return received;
}

}  // namespace emulation

inline thread_local emulation::Index threadIdx, blockIdx, blockDim, gridDim;

inline uint4 __ldcs(const uint4* p) {
  emulation::check_load(p, sizeof(uint4), "__ldcs");
  return *p;
}
inline uint4 __ldg(const uint4* p) {
  emulation::check_load(p, sizeof(uint4), "__ldg");
  return *p;
}
inline float __uint_as_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// The fast intrinsics as their accurate forms (results differ from the device's in the last bits; the
// tests compare emulated kernels with emulated references or within a tolerance).
inline float __expf(float x) { return std::exp(x); }
inline float __fdividef(float x, float y) { return x / y; }

inline float __shfl_xor_sync(unsigned mask, float value, int offset) { return emulation::shfl_xor(mask, value, offset); }
inline double __shfl_xor_sync(unsigned mask, double value, int offset) {
  return emulation::shfl_xor(mask, value, offset);
}

inline void __syncthreads() {
  using namespace emulation;
  converge(*block, thread_id, ++syncs, "__syncthreads");
}

// Runs kernel(args...) for grid.x blocks of `threads` threads (a multiple of 32, at most 1024).
template <typename Kernel, typename... Args>
void emulate_launch(dim3 grid, int threads, Kernel kernel, Args... args) {
  using namespace emulation;
  if (threads < 32 || threads > 1024 || threads % 32 != 0) {
    std::fprintf(stderr, "emulation: %d threads per block (a multiple of 32 up to 1024 is emulated)\n", threads);
    std::abort();
  }
  Group whole(threads);
  std::vector<std::unique_ptr<Group>> warps;
  for (int w = 0; w < threads / 32; ++w) warps.push_back(std::make_unique<Group>(32));
  block = &whole;
  std::vector<std::thread> team;
  for (int t = 0; t < threads; ++t) {
    team.emplace_back([&, t] {
      warp = warps[static_cast<size_t>(t / 32)].get();
      lane_id = t % 32;
      thread_id = t;
      blockDim.x = static_cast<unsigned>(threads);
      gridDim.x = grid.x;
      threadIdx.x = static_cast<unsigned>(t);
      for (unsigned b = 0; b < grid.x; ++b) {
        blockIdx.x = b;
        shuffles = 0;
        syncs = 0;
        kernel(args...);
        converge(*warp, lane_id, -1 - shuffles, "warp");  // every lane shuffled as often
        converge(whole, t, -1 - syncs, "__syncthreads");  // every thread synchronised as often; the
                                                          // block's shared memory is free again
      }
    });
  }
  for (std::thread& t : team) t.join();
  block = nullptr;
}
