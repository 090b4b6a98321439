// What one launch of an SM90 FP8 scaled GEMM kernel is given (scaled_launch.h): plain C++, shared by the
// host code that builds it (scaled_gemm_launch.cpp) and the kernels (sm90_scaled_gemm.cuh).
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

// Whether a launch runs swapped (ScaledGemmLaunchArgs::swap_ab): m <= 32, where a 128-row tile would be
// mostly idle. A prior, to be fitted on an H200.
inline bool scaled_swap_ab(int64_t m) { return m <= 32; }

}  // namespace ops::cutlass_gemm
