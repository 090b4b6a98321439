// The plain C++ interface between the at::Tensor wrapper and the CUTLASS kernel translation units.
// No torch and no CUTLASS headers here, so each kernel TU compiles without torch and the wrapper
// compiles without CUTLASS.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernel_list.h"
#include "launch_args.h"

namespace ops::cutlass_gemm {

using WorkspaceSizeFn = size_t (*)(const GemmLaunchArgs&);
using RunFn = LaunchStatus (*)(const GemmLaunchArgs&, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream);

struct KernelEntry {
  WorkspaceSizeFn workspace_size;
  RunFn run;
  KernelProblem (*kernel_problem)(const GemmLaunchArgs&);
};

// Defined by the kernel TUs, one pair per line of OPS_CUTLASS_GEMM_KERNELS.
#define OPS_DECLARE_CUTLASS_GEMM(name, ...)                                              \
  size_t name##_workspace_size(const GemmLaunchArgs& args);                             \
  LaunchStatus name##_run(const GemmLaunchArgs& args, void* workspace, size_t workspace_bytes, \
                          cudaStream_t stream);                                                \
  KernelProblem name##_kernel_problem(const GemmLaunchArgs& args);
OPS_CUTLASS_GEMM_KERNELS(OPS_DECLARE_CUTLASS_GEMM)
#undef OPS_DECLARE_CUTLASS_GEMM

// The entry for a kernel id (its index in OPS_CUTLASS_GEMM_KERNELS).
const KernelEntry& kernel_entry(int kernel_id);

}  // namespace ops::cutlass_gemm
