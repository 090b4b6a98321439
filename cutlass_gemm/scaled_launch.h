// The plain C++ interface of the SM90 FP8 scaled GEMM kernels (sm90_scaled_gemm.cuh; the candidate-only
// TUs cutlass_gemm/kernels/candidates/sm90_fp8_*.cu): no torch and no CUTLASS headers.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernel_list.h"
#include "launch_args.h"

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
  Epilogue act = Epilogue::BiasIdentity;  // a Bias<Act> epilogue (the bias may be null)
  int device = 0;
  int sm_count = 0;
};

// One per output dtype (bfloat16, float16, float32).
#define OPS_DECLARE_SCALED_GEMM(out)                                                                    \
  size_t scaled_gemm_sm90_##out##_workspace_size(const ScaledGemmLaunchArgs& args);                     \
  LaunchStatus scaled_gemm_sm90_##out##_run(const ScaledGemmLaunchArgs& args, void* workspace,          \
                                            size_t workspace_bytes, cudaStream_t stream);
OPS_DECLARE_SCALED_GEMM(bf16)
OPS_DECLARE_SCALED_GEMM(f16)
OPS_DECLARE_SCALED_GEMM(f32)
#undef OPS_DECLARE_SCALED_GEMM

// The kernels' configuration, for plan(): tile, cluster and schedule (tensorwise/rowwise; blockwise).
inline constexpr const char* kScaledGemmConfig = "128x128x128_2x1x1_tn_align16_warpspecialized_cooperative";
inline constexpr const char* kBlockScaledGemmConfig = "128x128x128_1x1x1_tn_align16_warpspecialized_cooperative_fp8_blockwise";

}  // namespace ops::cutlass_gemm
