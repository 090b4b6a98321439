// What one launch of the SM90 FP8 grouped GEMM kernels is given (scaled_grouped_launch.h) and where each
// group's scales lie: plain C++, shared by the host code that builds a launch
// (scaled_grouped/scaled_grouped_gemm_launch.cpp), the device code (sm90_scaled_grouped_gemm.cuh) and its CPU
// replay (core/replay.cpp).
#pragma once

#include <cstdint>

#include "grouped_args.h"

namespace ops::cutlass_gemm {

// Per group D = (A @ B) in float32 with each 128-deep K block's partial product scaled by its scale_a and
// scale_b entries (CUTLASS's FP8 blockwise mainloop, example 68), rounded once to D's dtype (bfloat16, float16
// or float32), D row-major. grouped: the operands, offs and mode (RaggedM or Batched, never swapped); A and B
// float8_e4m3fn, A row-major and B column-major (both K-major, the only layout FP8 wgmma reads).
// The rowwise recipe runs as blockwise with the scales repeated along K (block_n 1): the same sum, promoted
// into float32 every 128 of K.
struct ScaledGroupedGemmLaunchArgs {
  GroupedGemmLaunchArgs grouped;
  // scale_a: one per row of A and 128-block of K, each group's (ceil(K/128), its rows) M-major, one group after
  // the other: the FP8 mainloop of a pointer-array kernel builds each group's scale layout from the group's own
  // rows (CUTLASS 4.2, sm90_mma_array_tma_gmma_ss_warpspecialized_fp8_blockwise_scaling.hpp: load_init).
  const float* scale_a = nullptr;
  // scale_b: one per 128-block of K and block_n columns (128, or 1 for the rowwise recipe), stored
  // (ceil(K/128), ceil(N/block_n)) row-major per group, one group after the other.
  const float* scale_b = nullptr;
  int block_n = 128;
};

// The SM90 FP8 grouped kernels, one row per block_n, declared once: the device code instantiates each row
// (with_scaled_grouped_config) and the host names and lists them (core/kernel_names.cpp). One kernel per row
// and output dtype (bf16, f16, f32).
#define OPS_SCALED_GROUPED_GEMM_KERNELS(X) \
  X(128)                                   \
  X(1)
inline constexpr const char* kScaledGroupedGemmConfig =
    "128x128x128_1x1x1_tnt_align16_warpspecialized_cooperative_ptr_array_fp8_blockwise";

// The K blocks of one scale: ceil(K / 128).
OPS_HOST_DEVICE inline int64_t scaled_grouped_k_blocks(const ScaledGroupedGemmLaunchArgs& args) {
  return (args.grouped.k + 127) / 128;
}

// Group g's scales: the element offsets of its first scale_a and scale_b entries and the elements between
// consecutive K blocks of each; `start`, `rows`: its first row and row count (group_shape's m).
struct ScaledGroupScales {
  int64_t sfa = 0, sfb = 0;
  int64_t sfa_ld = 0, sfb_ld = 0;
};
OPS_HOST_DEVICE inline ScaledGroupScales scaled_group_scales(const ScaledGroupedGemmLaunchArgs& args, int g,
                                                             int64_t start, int64_t rows) {
  const int64_t k_blocks = scaled_grouped_k_blocks(args);
  const int64_t n_blocks = (args.grouped.n + args.block_n - 1) / args.block_n;
  ScaledGroupScales s;
  s.sfa = k_blocks * (args.grouped.mode == GroupedKernelMode::RaggedM ? start : g * args.grouped.m);
  s.sfa_ld = rows;
  s.sfb = g * k_blocks * n_blocks;
  s.sfb_ld = n_blocks;
  return s;
}

}  // namespace ops::cutlass_gemm
