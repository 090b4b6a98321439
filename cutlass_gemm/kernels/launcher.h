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

// A kernel's two entry points over its kind's launch arguments (Args): the workspace it needs, and the launch.
#define OPS_DECLARE_KERNEL(name, Args)                                                          \
  size_t name##_workspace_size(const Args& args);                                               \
  LaunchStatus name##_run(const Args& args, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// Defined by the kernel TUs, one set per line of OPS_CUTLASS_GEMM_KERNELS.
#define OPS_DECLARE_CUTLASS_GEMM(name, ...)  \
  OPS_DECLARE_KERNEL(name, GemmLaunchArgs) \
  KernelProblem name##_kernel_problem(const GemmLaunchArgs& args);
OPS_CUTLASS_GEMM_KERNELS(OPS_DECLARE_CUTLASS_GEMM)
#undef OPS_DECLARE_CUTLASS_GEMM

}  // namespace ops::cutlass_gemm
