// The plain C++ interface of the SM90 grouped GEMM kernels (sm90_grouped_gemm.cuh; the candidate-only TUs
// cutlass_gemm/kernels/candidates/sm90_grouped_*.cu): no torch and no CUTLASS headers.
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

#include "grouped_args.h"
#include "launch_args.h"  // LaunchStatus

namespace ops::cutlass_gemm {

// One per element type (bfloat16, float16). The workspace holds the per-group arrays the kernels build on
// the device from offs (problem sizes, pointers, strides, the clamped ends) and CUTLASS's own workspace.
#define OPS_DECLARE_GROUPED_GEMM(dtype)                                                                 \
  size_t grouped_gemm_sm90_##dtype##_workspace_size(const GroupedGemmLaunchArgs& args);               \
  LaunchStatus grouped_gemm_sm90_##dtype##_run(const GroupedGemmLaunchArgs& args, void* workspace,    \
                                               size_t workspace_bytes, cudaStream_t stream);
OPS_DECLARE_GROUPED_GEMM(bf16)
OPS_DECLARE_GROUPED_GEMM(f16)
#undef OPS_DECLARE_GROUPED_GEMM

}  // namespace ops::cutlass_gemm
