// The plain C++ interface of the SM90 FP8 scaled GEMM kernels (sm90_scaled_gemm.cuh; the candidate-only
// TUs cutlass_gemm/kernels/candidates/sm90_fp8_*.cu): no torch and no CUTLASS headers.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "launch_args.h"
#include "scaled_args.h"

namespace ops::cutlass_gemm {

// One per output dtype (bfloat16, float16, float32).
#define OPS_DECLARE_SCALED_GEMM(out)                                                                    \
  size_t scaled_gemm_sm90_##out##_workspace_size(const ScaledGemmLaunchArgs& args);                     \
  LaunchStatus scaled_gemm_sm90_##out##_run(const ScaledGemmLaunchArgs& args, void* workspace,          \
                                            size_t workspace_bytes, cudaStream_t stream);
OPS_DECLARE_SCALED_GEMM(bf16)
OPS_DECLARE_SCALED_GEMM(f16)
OPS_DECLARE_SCALED_GEMM(f32)
#undef OPS_DECLARE_SCALED_GEMM

}  // namespace ops::cutlass_gemm
