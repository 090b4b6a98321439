// The kernel interface of the SM90 grouped GEMMs (sm90_grouped_gemm.cuh; the candidate-only TUs
// candidates/sm90_grouped_*.cu): one pair of entry points per element type, serving every layout of
// OPS_GROUPED_GEMM_KERNELS (grouped_args.h). Their workspace holds the per-group arrays the kernels build on
// the device from offs (problem sizes, pointers, strides, the clamped ends) and CUTLASS's own workspace.
#pragma once

#include "grouped_args.h"
#include "launcher.h"

namespace ops::cutlass_gemm {
OPS_DECLARE_KERNEL(grouped_gemm_sm90_bf16, GroupedGemmLaunchArgs)
OPS_DECLARE_KERNEL(grouped_gemm_sm90_f16, GroupedGemmLaunchArgs)
}  // namespace ops::cutlass_gemm
