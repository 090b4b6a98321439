// What one launch of an SM90 FP8 scaled GEMM kernel is given (scaled_launch.h): plain C++, shared by the
// host code that builds it (scaled/scaled_gemm_launch.cpp) and the kernels (sm90_scaled_gemm.cuh).
#pragma once

#include <cstdint>

#include "kernel_list.h"  // Epilogue

namespace ops::cutlass_gemm {

// D (m x n, row-major, ldd) = act(scale_a * (A (m x k, row-major, lda) @ B (k x n, column-major, ldb)) *
// scale_b + bias), the product accumulated in float32; scale_a one per row of D (or one for all),
// scale_b one per column (or one), or blockwise (below); bias one per column of D's dtype (or null). A and B float8_e4m3fn,
// both K-major (FP8 wgmma reads no other layout); pointers and leading dimensions 16-byte aligned.
struct ScaledGemmLaunchArgs {
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldd = 0;
  const float* scale_a = nullptr;
  bool scale_a_per_row = false;  // else a single scale
  const float* scale_b = nullptr;
  bool scale_b_per_column = false;
  const void* bias = nullptr;
  // Blockwise (block_scaled): the scales multiply each 128-deep K block's partial product in the mainloop
  // (CUTLASS's FP8 blockwise mainloop) instead of the epilogue. scale_a: one per row of A and 128-block of K,
  // stored (ceil(K/128), m) (M-major); scale_b: one per 128-block of K and block_n columns (128: 128x128
  // blocks of B, or 1: 1x128 groups of each column), stored (ceil(K/128), ceil(n/block_n)) row-major.
  bool block_scaled = false;
  int block_n = 128;
  // Blockwise: the row length of the M-major scale_a, m rounded up to a multiple of 4 (the mainloop loads
  // it by TMA, which takes 16-byte aligned rows; the padding is never read into a result).
  int64_t scale_a_ld = 0;
  bool fast_accum = false;  // else two-level accumulation (CUTLASS's promotion into float32 every 4 k-blocks)
  // At small m (scaled_swap_ab): the kernel runs D^T (n x m, column-major: the row-major D) = B^T A^T on
  // 128x32 tiles, so that the few rows of A (decode's tokens) fill the kernel's narrow N tile and B streams
  // through the 128-row side; scale_a and scale_b swap broadcast directions (blockwise: swap operands).
  bool swap_ab = false;
  Epilogue act = Epilogue::BiasIdentity;  // a Bias<Act> epilogue (the bias may be null)
  int device = 0;
  int sm_count = 0;
};

// The SM90 FP8 kernel configurations, one row each, declared once: the device code instantiates each row
// (with_scaled_config, sm90_scaled_gemm.cuh) and the host names and lists them (core/kernel_names.cpp).
// X(block_scaled, block_n, fast_accum, swap_ab): one kernel per row, output dtype (bf16, f16, f32) and
// activation. A tensorwise-or-rowwise row serves both recipes (its epilogue broadcasts a scalar or a vector);
// a blockwise row (block_n 128: 128x128 blocks of B, 1: 1x128) promotes per 128 of K and has no fast form.
#define OPS_SCALED_GEMM_CONFIGS(X) \
  X(false, 0, false, false)        \
  X(false, 0, true, false)         \
  X(false, 0, false, true)         \
  X(false, 0, true, true)          \
  X(true, 128, false, false)       \
  X(true, 1, false, false)         \
  X(true, 128, false, true)        \
  X(true, 1, false, true)
#define OPS_COUNT_ROW(...) +1
inline constexpr int kNumScaledGemmConfigs = 0 OPS_SCALED_GEMM_CONFIGS(OPS_COUNT_ROW);
#undef OPS_COUNT_ROW
static_assert(kNumScaledGemmConfigs == 8, "every FP8 row named and listed: 3 dtypes x 5 activations each");

// Whether a row serves a launch: its recipe class, block shape, accumulation and swap.
constexpr bool scaled_config_serves(bool block_scaled, int block_n, bool fast_accum, bool swap_ab,
                                    const ScaledGemmLaunchArgs& args) {
  return args.block_scaled == block_scaled && args.swap_ab == swap_ab &&
         (block_scaled ? args.block_n == block_n : args.fast_accum == fast_accum);
}

// The SM90 FP8 kernels' configurations (sm90_scaled_gemm.cuh, OPS_SCALED_GEMM_CONFIGS): tile, cluster and schedule of the
// tensorwise/rowwise, swapped and blockwise kernels, as their names spell them.
inline constexpr const char* kScaledGemmConfig = "128x128x128_2x1x1_tn_align16_warpspecialized_cooperative";
inline constexpr const char* kSwappedScaledGemmConfig = "128x32x128_1x1x1_tnn_align16_warpspecialized_cooperative";
inline constexpr const char* kBlockScaledGemmConfig = "128x128x128_1x1x1_tn_align16_warpspecialized_cooperative_fp8_blockwise";
inline constexpr const char* kSwappedBlockScaledGemmConfig =
    "128x32x128_1x1x1_tnn_align16_warpspecialized_cooperative_fp8_blockwise";
// The kernel of a launch (out: bfloat16, float16 or float32), e.g.
// sm90_e4m3_128x128x128_2x1x1_tn_align16_warpspecialized_cooperative_bf16_scaled_bias_none.
// Whether a launch runs swapped (ScaledGemmLaunchArgs::swap_ab): m <= 32, where a 128-row tile would be
// mostly idle. A prior, to be fitted on an H200.
inline bool scaled_swap_ab(int64_t m) { return m <= 32; }

// Where the user's operands and scales go in the kernel's own problem (swap_ab applied), for the kernel
// configurations (sm90_scaled_gemm.cuh) and the CPU replay (core/replay.cpp) alike: the kernel's D
// (m x n) = act(scale_a * (scale_b * (A @ B)) + bias), its A (m x k) row-major and B (k x n) column-major.
// Swapped, the kernel's A is the user's B^T, its B the user's A^T and its D = the user's D^T, column-major.
// A scale or the bias "along columns" holds one value per column of the kernel's D (a row broadcast),
// otherwise one per row. Blockwise, SFA scales the kernel's A (one per `granularity` rows and 128 of K) and
// SFB its B, each stored MN-major (its M or N extent fastest, rounded up to the granularity).
constexpr bool scale_a_along_columns(bool swap_ab) { return swap_ab; }
constexpr bool scale_b_along_columns(bool swap_ab) { return !swap_ab; }
constexpr bool bias_along_columns(bool swap_ab) { return !swap_ab; }
constexpr int sfa_granularity(bool swap_ab, int block_n) { return swap_ab ? block_n : 1; }
constexpr int sfb_granularity(bool swap_ab, int block_n) { return swap_ab ? 1 : block_n; }

struct ScaledKernelProblem {
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;  // row-major, lda
  const void* b = nullptr;  // column-major, ldb
  int64_t lda = 0, ldb = 0;
  bool d_column_major = false;  // D with ScaledGemmLaunchArgs::ldd
  // Blockwise: the tensors and the M (SFA) and N (SFB) extents the scale layouts span (the padded scale_a's
  // row length where it lies along that mode).
  const float* sfa = nullptr;
  const float* sfb = nullptr;
  int64_t sfa_extent = 0, sfb_extent = 0;
};

inline ScaledKernelProblem scaled_kernel_problem(const ScaledGemmLaunchArgs& args) {
  if (!args.swap_ab)
    return {args.m, args.n, args.k, args.a, args.b, args.lda, args.ldb, false, args.scale_a, args.scale_b,
            args.scale_a_ld, args.n};
  return {args.n, args.m, args.k, args.b, args.a, args.ldb, args.lda, true, args.scale_b, args.scale_a,
          args.n, args.scale_a_ld};
}

}  // namespace ops::cutlass_gemm
