// The kernel interface of the SM90 FP8 grouped GEMMs (sm90_scaled_grouped_gemm.cuh; the candidate-only TUs
// candidates/sm90_fp8_grouped_*.cu): one pair of entry points per output dtype, serving both rows of
// OPS_SCALED_GROUPED_GEMM_KERNELS (scaled_grouped_args.h). No torch and no CUTLASS headers.
#pragma once

#include "launcher.h"
#include "scaled_grouped_args.h"

namespace ops::cutlass_gemm {
OPS_DECLARE_KERNEL(scaled_grouped_gemm_sm90_bf16, ScaledGroupedGemmLaunchArgs)
OPS_DECLARE_KERNEL(scaled_grouped_gemm_sm90_f16, ScaledGroupedGemmLaunchArgs)
OPS_DECLARE_KERNEL(scaled_grouped_gemm_sm90_f32, ScaledGroupedGemmLaunchArgs)
}  // namespace ops::cutlass_gemm
