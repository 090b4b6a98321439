// What one CUTLASS launch is given (GemmLaunchArgs) and returns (LaunchStatus): the plain C++ types that
// the kernel translation units share with the host wrapper. Kept apart from plan.h so that a change to
// the planner's types rebuilds the host code only, never the kernels.
#pragma once

#include <cstdint>

namespace ops::cutlass_gemm {

// How the SM90 tile schedulers split the work (CUTLASS's DecompositionMode). Only the stream-K-scheduler
// kernels take anything but DataParallel.
enum class Decomposition : int8_t {
  DataParallel,  // one CTA per output tile (persistent CTAs loop over tiles)
  SplitK,        // `splits` CTAs per output tile, each over K / splits, reduced in the workspace
  StreamK,       // the K iterations of all tiles divided evenly among the CTAs (Osama et al. 2023)
};

// The order in which the SM90 tile schedulers walk output tiles (CUTLASS's RasterOrderOptions): along
// the kernel's M (tiles of one column of tiles in turn) or N, or CUTLASS's heuristic (along the longer
// side). With a swizzle > 1, `swizzle` tiles of the other side are interleaved, for L2 reuse.
enum class Raster : int8_t { Heuristic, AlongM, AlongN };

// One launch: D (M x N, row-major, leading dimension ldd) = A (M x K) @ B (K x N).
// A and B layouts are fixed by the instantiation; lda / ldb are their leading dimensions in
// elements. Pointers are device pointers satisfying the instantiation's alignment.
struct GemmLaunchArgs {
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldd = 0;
  const void* bias = nullptr;  // Bias<Act> epilogues: n elements (per column of D), or null
  int device = 0;    // CUDA device ordinal (for CUTLASS's hardware info)
  int sm_count = 0;  // multiprocessors of that device
  // The tactic's scheduler settings (SM90 kernels; the SM80 kernels ignore them), set by the launcher
  // from the tactic it runs (plan.tactic, or an autotuned one).
  Decomposition decomposition = Decomposition::DataParallel;
  int splits = 1;
  int swizzle = 1;
  Raster raster = Raster::Heuristic;
};

// The problem a kernel's parameters hold for one GemmLaunchArgs, computed on the host the way the
// launch computes them (no GPU needed): `known` only for CUTLASS 2.x kernels (a 3.x kernel keeps its
// operands in TMA descriptors). Tests check it equals the launch descriptor: a device-level wrapper
// that rewrites the problem (the 2.x GemmUniversalAdapter transposes it for a row-major C) shows.
struct KernelProblem {
  bool known = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  const void* b = nullptr;
  const void* d = nullptr;
};

// Result of a launch. `message` is a static string (never owned).
struct LaunchStatus {
  bool ok = true;
  const char* message = "";
};

}  // namespace ops::cutlass_gemm
