// The kernel interface of the SM90 FP8 scaled GEMMs (sm90_scaled_gemm.cuh; the candidate-only TUs
// candidates/sm90_fp8_*.cu): one pair of entry points per output dtype, serving every configuration of
// OPS_SCALED_GEMM_CONFIGS (scaled_args.h). No torch and no CUTLASS headers.
#pragma once

#include "launcher.h"
#include "scaled_args.h"

namespace ops::cutlass_gemm {
OPS_DECLARE_KERNEL(scaled_gemm_sm90_bf16, ScaledGemmLaunchArgs)
OPS_DECLARE_KERNEL(scaled_gemm_sm90_f16, ScaledGemmLaunchArgs)
OPS_DECLARE_KERNEL(scaled_gemm_sm90_f32, ScaledGemmLaunchArgs)
}  // namespace ops::cutlass_gemm
