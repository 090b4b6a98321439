// The one launch descriptor of the GEMM family: a kind, with that kind's launch arguments beside it (as
// CUTLASS's library.h passes each GemmKind its own arguments struct through one Operation interface). The
// CUDA services launch it (cuda/services.h, run_kernel) and the CPU replay computes it (replay.h).
#pragma once

#include <ATen/core/Tensor.h>

#include "gemm_kind.h"
#include "plan.h"

namespace ops::cutlass_gemm {

struct GemmLaunch {
  GemmKind kind = GemmKind::Dense;
  // The kind's launch arguments: GemmLaunchArgs (kernels/launch_args.h), ScaledGemmLaunchArgs (scaled_args.h),
  // GroupedGemmLaunchArgs (grouped_args.h) or ScaledGroupedGemmLaunchArgs (scaled_grouped_args.h).
  const void* args = nullptr;
  at::ScalarType dtype = at::kFloat;  // D's
  // Its entry in the kernel table (cuda/services.h, kernel_entry): dense, the KernelId; the others, the
  // DType of D or of the elements (one entry point serves every configuration of that dtype).
  int kernel = 0;
  const GemmPlan* plan = nullptr;  // dense: the plan (the replay applies its kernel's epilogue)
};

}  // namespace ops::cutlass_gemm
