// Lock-step emulation of CUDA warps on the host, for kernels that use only threadIdx.x / blockIdx.x,
// 16-byte loads (__ldcs, __ldg) and __shfl_xor_sync with a full mask (cutlass_gemm/simt_gemv.cuh with
// OPS_SIMT_GEMV_HOST_EMULATION, csrc/quantize_fp8_kernels.cuh with OPS_FUSED_HOST_EMULATION). 32 host threads are the 32 lanes; each runs every warp of every block
// in the same order. Checks, aborting with a message:
//   * every load lies inside a registered buffer (emulation::allow_reads) and is 16-byte aligned;
//   * the lanes of a warp call __shfl_xor_sync at the same points (no divergence before a shuffle) and
//     as often (a lane that returned early while others shuffle is caught at the end of the warp).
#pragma once

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include <vector_functions.h>
#include <vector_types.h>

namespace emulation {

struct Index {
  unsigned x = 0, y = 0, z = 0;
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

struct Warp {
  std::barrier<>* barrier = nullptr;
  float slots[32] = {};
  long tags[32] = {};
};
inline Warp warp;
inline thread_local int lane_id = 0;
inline thread_local long shuffles = 0;

// All lanes arrive with the same tag, or the warp diverged.
inline void converge(long tag) {
  warp.tags[lane_id] = tag;
  warp.barrier->arrive_and_wait();
  for (int l = 0; l < 32; ++l) {
    if (warp.tags[l] != tag) {
      std::fprintf(stderr, "emulation: divergent warp: lane %d at %ld, lane %d at %ld\n", lane_id, tag, l,
                   warp.tags[l]);
      std::abort();
    }
  }
  warp.barrier->arrive_and_wait();
}

}  // namespace emulation

inline thread_local emulation::Index threadIdx, blockIdx;

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
// tests compare emulated kernels with emulated references).
inline float __expf(float x) { return std::exp(x); }
inline float __fdividef(float x, float y) { return x / y; }

inline float __shfl_xor_sync(unsigned mask, float value, int offset) {
  using namespace emulation;
  if (mask != 0xffffffffu) {
    std::fprintf(stderr, "emulation: only full-warp shuffles are emulated\n");
    std::abort();
  }
  ++shuffles;
  warp.slots[lane_id] = value;
  converge(shuffles * 64 + offset);  // every lane wrote, at the same shuffle
  const float received = warp.slots[lane_id ^ offset];
  warp.barrier->arrive_and_wait();  // every lane read before the next shuffle writes
  return received;
}

// Runs kernel(args...) for grid.x blocks of `threads` threads (a multiple of 32), one warp at a time.
template <typename Kernel, typename... Args>
void emulate_launch(dim3 grid, int threads, Kernel kernel, Args... args) {
  using namespace emulation;
  std::barrier<> barrier(32);
  warp.barrier = &barrier;
  std::vector<std::thread> lanes;
  for (int lane = 0; lane < 32; ++lane) {
    lanes.emplace_back([&, lane] {
      lane_id = lane;
      for (unsigned block = 0; block < grid.x; ++block) {
        for (int w = 0; w < threads / 32; ++w) {
          threadIdx.x = static_cast<unsigned>(w * 32 + lane);
          blockIdx.x = block;
          shuffles = 0;
          kernel(args...);
          converge(-1 - shuffles);  // the end of the warp: every lane shuffled as often
        }
      }
    });
  }
  for (std::thread& t : lanes) t.join();
  warp.barrier = nullptr;
}
